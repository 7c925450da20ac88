"""Build (and optionally push) an image with the Docker SDK, streaming progress.

The build context is assembled here as a tar (only the Dockerfile's inputs: images/*, patches/
code, the series, and a `wheels/` wheelhouse), so the repository's .venv/.cache never travel.
The Docker SDK drives the engine's classic builder: no BuildKit cache or secret mounts, so nothing
in the Dockerfile needs a secret, and no build arg may carry one (validated in config).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import docker
import docker.errors

from sglfleet import paths
from sglfleet.images.config import ImageConfig
from sglfleet.patches import PatchError, load_series
from sglfleet.pipeline.errors import PipelineError, UsageError


class BuildError(PipelineError):
    """The build or push failed (exit 1)."""

    exit_code = 1


Printer = Callable[[str], None]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _default_printer(line: str) -> None:
    print(line, flush=True)


# ------------------------------------------------------------------ engine

def connect(base_url: str | None = None) -> docker.DockerClient:
    try:
        client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
        client.ping()
        return client
    except (docker.errors.DockerException, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"no Docker engine reachable ({first}); start one: scripts/services.sh start docker") \
            from None


# ------------------------------------------------------------------ tags

def tag_prefix(cfg: ImageConfig) -> str:
    return f"{cfg.sglang_version}-{cfg.target}-rc"


def repository(cfg: ImageConfig, push: str | None) -> str:
    """`<registry>/<name>` when pushing (PUSH=registry/repo overrides the name), else `<name>`."""
    if push:
        if not re.fullmatch(r"[a-zA-Z0-9.-]+(:\d+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+", push):
            raise UsageError(f"PUSH '{push}' is not registry/repository (e.g. 127.0.0.1:5000/sglang-fleet)")
        return push
    return cfg.name


def _registry_tags(repo: str) -> list[str]:
    """Tags of repo in its registry (Docker registry HTTP API v2); [] when it has none yet."""
    host, _, path = repo.partition("/")
    scheme = "http" if host.startswith(("127.", "localhost")) else "https"
    try:
        with urllib.request.urlopen(f"{scheme}://{host}/v2/{path}/tags/list", timeout=10) as r:
            return json.load(r).get("tags") or []
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise BuildError(f"registry {host} refused the tag listing: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise BuildError(f"registry {host} unreachable: {exc}") from None


def next_rc(client: docker.DockerClient, cfg: ImageConfig, repo: str, pushing: bool) -> int:
    prefix = tag_prefix(cfg)
    tags: list[str] = []
    for img in client.images.list(name=repo):
        tags += [t.rsplit(":", 1)[1] for t in img.tags if t.rsplit(":", 1)[0] == repo]
    if pushing:
        tags += _registry_tags(repo)
    rcs = [int(m.group(1)) for t in tags if (m := re.fullmatch(re.escape(prefix) + r"(\d+)", t))]
    return max(rcs, default=0) + 1


# ------------------------------------------------------------------ context

def git_commit() -> str:
    root = paths.CHECKOUT_ROOT
    if root is None:  # an installed wheel: no history to name
        return "unknown"
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src/sglfleet/images",
                                "src/sglfleet/patches"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def fetch_wheelhouse(cfg: ImageConfig, dest: Path, say: Printer) -> list[Path]:
    """`pip download --no-deps` each wheelhouse requirement for the image's Python/platform."""
    if not cfg.wheelhouse:
        return []
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest),
           "--python-version", cfg.wheel_python, "--platform", cfg.wheel_platform, *cfg.wheelhouse]
    t = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise BuildError(f"wheelhouse download failed for {cfg.wheelhouse}: {tail}")
    wheels = sorted(dest.glob("*.whl"))
    say(f"[images] wheelhouse: {', '.join(w.name for w in wheels)} ({time.monotonic() - t:.1f} s)")
    return wheels


def build_host_ca() -> Path | None:
    """The build host's CA bundle when it is configured explicitly (TLS-intercepting proxies):
    PIP_CERT, SSL_CERT_FILE or REQUESTS_CA_BUNDLE. Public certificates only, never keys."""
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        val = os.environ.get(var)
        if val and Path(val).is_file():
            text = Path(val).read_text(errors="replace")
            if "PRIVATE KEY" in text:
                raise UsageError(f"{var}={val} contains a private key; refusing to put it in a build context")
            return Path(val)
    return None


def series_arcname(cfg: ImageConfig) -> str:
    """Where the series lands in the build context (any source dir; the name carries the version)."""
    return f"patches/sglang-{cfg.sglang_version}"


def build_context(cfg: ImageConfig, wheels: list[Path]) -> tuple[io.BufferedIOBase, int]:
    """Tar of exactly what the Dockerfile COPYs. Returns (file object, size)."""
    series = cfg.series_path
    files: list[tuple[Path, str]] = [
        (paths.resolve(cfg.dockerfile), "Dockerfile"),
        (paths.PACKAGE_DIR / "images" / "cuda-toolkit.sh", "images/cuda-toolkit.sh"),
        (paths.PACKAGE_DIR / "images" / "jit_proof.py", "images/jit_proof.py"),
        # the patch tool, importable in the image as sglfleet.patches (the package's __init__ has no imports)
        (paths.PACKAGE_DIR / "__init__.py", "sglfleet/__init__.py"),
        (paths.PACKAGE_DIR / "paths.py", "sglfleet/paths.py"),
        (paths.PATCHES_DIR / "__init__.py", "sglfleet/patches/__init__.py"),
        (paths.PATCHES_DIR / "__main__.py", "sglfleet/patches/__main__.py"),
    ]
    files += [(p, f"{series_arcname(cfg)}/{p.name}") for p in sorted(series.iterdir()) if p.is_file()]
    plugin = paths.PATCHES_DIR / "ddtree"
    files += [(plugin / "pyproject.toml", "patches/ddtree/pyproject.toml")]
    files += [(p, f"patches/ddtree/sglang_ddtree/{p.name}") for p in sorted((plugin / "sglang_ddtree").glob("*.py"))]
    files += [(w, f"wheels/{w.name}") for w in wheels]
    ca = build_host_ca()
    if ca is not None:
        files.append((ca, "certs/build-host.crt"))
    buf = io.BytesIO() if sum(f.stat().st_size for f, _ in files) < 64 << 20 else None
    fileobj: io.BufferedIOBase
    if buf is None:
        import tempfile
        fileobj = tempfile.TemporaryFile()  # noqa: SIM115 - handed to the SDK, closed by the caller
    else:
        fileobj = buf
    with tarfile.open(fileobj=fileobj, mode="w") as tar:
        for src, arc in files:
            info = tar.gettarinfo(str(src), arcname=arc)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o755 if src.suffix == ".sh" else 0o644
            with src.open("rb") as fh:
                tar.addfile(info, fh)
        for dirname in ("wheels", "certs"):
            d = tarfile.TarInfo(dirname)
            d.type, d.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(d)
    size = fileobj.tell()
    fileobj.seek(0)
    return fileobj, size


# ------------------------------------------------------------------ build

@dataclass
class BuildResult:
    image_id: str
    tags: list[str]
    labels: dict[str, str]
    seconds: float
    pushed: list[str] = field(default_factory=list)
    digest: str = ""


def build_args(cfg: ImageConfig, series_sha: str, commit: str) -> dict[str, str]:
    return {
        "BASE_IMAGE": cfg.base_image,
        "CUDA_VERSION": cfg.cuda_version,
        "SGLANG_VERSION": cfg.sglang_version,
        "FLASHINFER_VERSION": cfg.flashinfer_version,
        "PATCH_SERIES": series_arcname(cfg),
        "PATCH_SERIES_SHA256": series_sha,
        "TARGET": cfg.target,
        "FI_ARCH_LIST": cfg.effective_arch_list,
        "INSTALL_PROFILE": cfg.install_profile,
        "JIT_SCOPE": cfg.jit_scope,
        "FI_HEAD_DIMS": cfg.head_dims,
        "CUDA_FROM_WHEELS": cfg.cuda_from_wheels,
        "TORCH_SPEC": cfg.torch_spec,
        "GIT_COMMIT": commit,
        "BUILD_DATE": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _stream(chunks: Iterator[dict], say: Printer, prefix: str = "") -> str:
    """Print the engine's build stream; return the image id; raise BuildError on an error chunk."""
    image_id, last_lines, t0 = "", [], time.monotonic()
    for chunk in chunks:
        if "error" in chunk:
            detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
            raise BuildError(f"docker build failed: {detail.strip().splitlines()[-1] if detail.strip() else detail}")
        if "stream" in chunk:
            for line in _ANSI.sub("", chunk["stream"]).rstrip("\n").splitlines():
                if line.strip():
                    stamp = f"{prefix}[{time.monotonic() - t0:6.0f}s]"
                    say(f"{stamp} {line}")
                    last_lines = [*last_lines[-30:], line]
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
    if not image_id:
        raise BuildError("docker build ended without an image id: " + " | ".join(last_lines[-3:]))
    return image_id


def build(cfg: ImageConfig, *, push: str | None = None, rc: int | None = None, nocache: bool = False,
          base_url: str | None = None, say: Printer = _default_printer, wheel_cache: Path | None = None) -> BuildResult:
    try:
        series = load_series(cfg.series_path)
    except PatchError as exc:
        raise UsageError(str(exc)) from None
    if series.version != cfg.sglang_version:
        raise UsageError(f"series {cfg.patch_series} is for sglang {series.version}, image pins {cfg.sglang_version}")
    client = connect(base_url)
    repo = repository(cfg, push)
    rc = rc if rc is not None else next_rc(client, cfg, repo, pushing=bool(push))
    if rc < 1:
        raise UsageError("rc must be >= 1")
    tag = f"{repo}:{tag_prefix(cfg)}{rc}"
    commit = git_commit()
    args = build_args(cfg, series.sha256, commit)
    say(f"[images] building {tag} (target {cfg.target}, arch {cfg.effective_arch_list}, "
        f"profile {cfg.install_profile}/{cfg.jit_scope}, base {cfg.base_image}, series {series.sha256[:12]})")
    wheels = fetch_wheelhouse(cfg, wheel_cache or (paths.WORK_ROOT / ".cache" / "wheelhouse"), say)
    ctx, size = build_context(cfg, wheels)
    say(f"[images] context {size / 1e6:.1f} MB")
    t0 = time.monotonic()
    try:
        chunks = client.api.build(fileobj=ctx, custom_context=True, tag=tag, buildargs=args,
                                  target=cfg.build_target, network_mode="host", rm=True, forcerm=True,
                                  pull=False, nocache=nocache, decode=True)
        image_id = _stream(chunks, say, prefix=f"{cfg.target} ")
    except docker.errors.APIError as exc:
        raise BuildError(f"docker build failed: {exc.explanation or exc}") from None
    finally:
        ctx.close()
    secs = time.monotonic() - t0
    img = client.images.get(image_id)
    labels = img.labels or {}
    expect = {"org.sglang.version": cfg.sglang_version, "org.fleet.target": cfg.target,
              "org.fleet.patch-series.sha256": series.sha256}
    wrong = {k: labels.get(k) for k, v in expect.items() if labels.get(k) != v}
    if wrong and cfg.build_target == "image":
        raise BuildError(f"built image has wrong provenance labels: {wrong}")
    say(f"[images] built {tag} ({image_id[:19]}) in {secs:.0f} s")
    result = BuildResult(image_id, [tag], labels, secs)
    if push:
        result.pushed, result.digest = push_image(client, repo, tag.rsplit(":", 1)[1], say)
    return result


def push_image(client: docker.DockerClient, repo: str, tag: str, say: Printer) -> tuple[list[str], str]:
    digest = ""
    try:
        for chunk in client.api.push(repo, tag=tag, stream=True, decode=True):
            if "error" in chunk:
                raise BuildError(f"push of {repo}:{tag} refused: {chunk['error'].strip()}")
            status = chunk.get("status", "")
            if m := re.search(r"digest: (sha256:[0-9a-f]{64})", status):
                digest = m.group(1)
            if status and "id" not in chunk:
                say(f"[images] push: {status}")
    except docker.errors.APIError as exc:
        raise BuildError(f"push of {repo}:{tag} failed: {exc.explanation or exc}") from None
    if not digest:
        raise BuildError(f"push of {repo}:{tag} reported no digest")
    say(f"[images] pushed {repo}:{tag} {digest}")
    return [f"{repo}:{tag}"], digest
