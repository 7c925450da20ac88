"""The SGLang patch series: load + validate, apply with zero fuzz, fetch pinned sources, report drift.

Layout, per pinned upstream version (shared contract with the DDTree patches of issue #5)::

    patches/sglang-<version>/series          one patch file name per line, `#` comments, applied in order
    patches/sglang-<version>/NNNN-name.patch unified diff, a/ b/ prefixes relative to site-packages
                                             (paths like a/sglang/srt/layers/attention/triton_backend.py)
    patches/sglang-<version>/manifest.yaml   per patch: file, purpose, upstream, test

Applying is `patch -p1 --fuzz=0` in the directory that contains the `sglang/` package. A reject,
a hunk that would need fuzz, or a patch that is already applied fails the whole series, and the
target tree is left untouched: the series is applied to a staged copy of the touched files and
copied back only when every patch applied.

This module needs only the standard library, PyYAML and pydantic, because the image build runs the
very same code (`python -m sglfleet.patches apply`) inside the Dockerfile.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sglfleet import paths

PATCHES_DIR = paths.PATCHES_DIR
DEFAULT_VERSION = "0.5.23"
DEFAULT_CACHE = paths.WORK_ROOT / ".cache" / "patches"
PATCH_NAME = re.compile(r"^\d{4}-[a-z0-9][a-z0-9._-]*\.patch$")
_TEST_PATH = re.compile(r"\btests/[\w./-]+\.py")
EXIT_FAIL = 1
EXIT_USAGE = 2


class PatchError(Exception):
    """One-line error; exit_code 2 = bad input (series/manifest/arguments), 1 = series does not apply."""

    exit_code = EXIT_USAGE


class ApplyError(PatchError):
    exit_code = EXIT_FAIL


class ManifestEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str = Field(description="patch file name, as listed in `series`")
    purpose: str = Field(min_length=10, description="what the patch fixes and why")
    upstream: str = Field(min_length=3, description="upstream issue/PR it relates to, or why none exists")
    test: str = Field(min_length=3, description="the test(s) that prove it: one or more tests/...py paths "
                      "(pytest node ids allowed), optionally with a note")

    @field_validator("file")
    @classmethod
    def _name(cls, v: str) -> str:
        if not PATCH_NAME.match(v):
            raise ValueError(f"'{v}' is not NNNN-short-name.patch")
        return v

    @field_validator("purpose", "upstream", "test")
    @classmethod
    def _strip(cls, v: str) -> str:
        v = " ".join(v.split())
        if not v:
            raise ValueError("must not be empty")
        return v

    @field_validator("test")
    @classmethod
    def _names_a_test(cls, v: str) -> str:
        if not _TEST_PATH.search(v):
            raise ValueError(f"'{v}' names no test file (tests/....py)")
        return v

    @property
    def test_paths(self) -> list[str]:
        return _TEST_PATH.findall(self.test)


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    upstream_package: str = "sglang"
    upstream_version: str
    patches: list[ManifestEntry] = Field(default_factory=list)


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    entry: ManifestEntry
    files: tuple[str, ...]  # paths relative to the site-packages root (old or new side)
    created: tuple[str, ...]
    deleted: tuple[str, ...]


@dataclass(frozen=True)
class Series:
    directory: Path
    version: str
    patches: tuple[Patch, ...]
    unlisted: tuple[str, ...] = ()  # *.patch files in the directory that `series` does not list

    @property
    def sha256(self) -> str:
        """Digest of the series as applied: patch names and contents, in order."""
        h = hashlib.sha256()
        h.update(f"sglang=={self.version}\n".encode())
        for p in self.patches:
            h.update(p.name.encode() + b"\0" + hashlib.sha256(p.path.read_bytes()).digest())
        return h.hexdigest()

    @property
    def touched(self) -> list[str]:
        seen: dict[str, None] = {}
        for p in self.patches:
            for f in p.files:
                seen.setdefault(f, None)
        return list(seen)


def series_dir_for(version: str, base: Path = PATCHES_DIR) -> Path:
    return base / f"sglang-{version}"


def read_series_names(path: Path) -> list[str]:
    names = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not PATCH_NAME.match(line):
            raise PatchError(f"{path}:{lineno}: '{line}' is not a NNNN-short-name.patch entry")
        names.append(line)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise PatchError(f"{path}: listed twice: {', '.join(dup)}")
    return names


_HDR = re.compile(r"^(---|\+\+\+) (\S+)")


def parse_patch_files(path: Path) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(files, created, deleted) of a unified diff with a/ b/ prefixes; rejects anything else."""
    files: dict[str, None] = {}
    created, deleted = [], []
    old = None
    text = path.read_text(encoding="utf-8", errors="replace")
    for line in text.splitlines():
        m = _HDR.match(line)
        if not m:
            continue
        side, name = m.groups()
        if side == "---":
            if name != "/dev/null" and not name.startswith("a/"):
                raise PatchError(f"{path.name}: '--- {name}' lacks the a/ prefix")
            old = name
            continue
        if old is None:
            continue
        if name != "/dev/null" and not name.startswith("b/"):
            raise PatchError(f"{path.name}: '+++ {name}' lacks the b/ prefix")
        rel = (name if name != "/dev/null" else old)[2:]
        if not rel.startswith("sglang/") or ".." in Path(rel).parts:
            raise PatchError(f"{path.name}: '{rel}' is not a path inside the sglang/ package")
        files.setdefault(rel, None)
        if old == "/dev/null":
            created.append(rel)
        if name == "/dev/null":
            deleted.append(rel)
        old = None
    if not files:
        raise PatchError(f"{path.name}: no unified-diff file headers found")
    return tuple(files), tuple(created), tuple(deleted)


def load_series(directory: Path | str) -> Series:
    """Load and validate series + manifest + patch files; any inconsistency is a PatchError."""
    d = Path(directory)
    m = re.match(r"^sglang-(.+)$", d.name)
    if not m:
        raise PatchError(f"{d}: series directory must be named sglang-<version>")
    version = m.group(1)
    series_file, manifest_file = d / "series", d / "manifest.yaml"
    for f in (series_file, manifest_file):
        if not f.is_file():
            raise PatchError(f"missing {f}")
    names = read_series_names(series_file)
    try:
        raw = yaml.safe_load(manifest_file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PatchError(f"{manifest_file}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if isinstance(raw, list):  # the short form: just the list of entries; version from the directory
        raw = {"upstream_version": version, "patches": raw}
    elif raw is None:
        raw = {"upstream_version": version, "patches": []}
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        errs = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise PatchError(f"{manifest_file}: invalid manifest: {errs}") from None
    if manifest.upstream_version != version:
        raise PatchError(f"{manifest_file}: upstream_version {manifest.upstream_version} != directory {version}")
    by_name = {e.file: e for e in manifest.patches}
    if len(by_name) != len(manifest.patches):
        raise PatchError(f"{manifest_file}: a patch is described twice")
    missing = [n for n in names if n not in by_name]
    extra = [n for n in by_name if n not in names]
    if missing:
        raise PatchError(f"{manifest_file}: no manifest entry for {', '.join(missing)}")
    if extra:
        raise PatchError(f"{manifest_file}: describes patches not in series: {', '.join(extra)}")
    patches = []
    for n in names:
        p = d / n
        if not p.is_file():
            raise PatchError(f"{series_file}: lists {n}, but {p} does not exist")
        files, created, deleted = parse_patch_files(p)
        patches.append(Patch(n, p, by_name[n], files, created, deleted))
    unlisted = tuple(sorted(p.name for p in d.glob("*.patch") if p.name not in names))
    return Series(d, version, tuple(patches), unlisted)


# --------------------------------------------------------------------------- apply

@dataclass
class PatchResult:
    name: str
    ok: bool
    offsets: list[str] = field(default_factory=list)  # "file: hunk #n offset k"
    problem: str = ""
    output: str = ""


@dataclass
class ApplyReport:
    root: str
    series_sha256: str
    results: list[PatchResult]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)


_OFFSET = re.compile(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")
_FUZZ = re.compile(r"with fuzz \d+")


def patch_binary() -> str:
    exe = shutil.which("patch")
    if not exe:
        raise PatchError("GNU patch not found on PATH (apt-get install patch)")
    return exe


def apply_one(patch: Patch, workdir: Path, *, exe: str | None = None) -> PatchResult:
    """`patch -p1 --fuzz=0` one patch inside workdir; classify the outcome."""
    cmd = [exe or patch_binary(), "-p1", "--fuzz=0", "--forward", "--batch", "--no-backup-if-mismatch",
           "--reject-file=-", "-d", str(workdir), "-i", str(patch.path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    out = (proc.stdout + proc.stderr).strip()
    res = PatchResult(patch.name, proc.returncode == 0, output=out)
    current = ""
    for line in out.splitlines():
        if line.startswith("patching file "):
            current = line.removeprefix("patching file ").strip("'")
        if m := _OFFSET.search(line):
            res.offsets.append(f"{current}: hunk #{m.group(1)} offset {m.group(3)}")
    if _FUZZ.search(out):
        res.ok, res.problem = False, "needs fuzz"
    elif "previously applied" in out or "Reversed (or previously applied)" in out:
        res.ok, res.problem = False, "already applied (or reversed)"
    elif proc.returncode != 0:
        failed = [ln for ln in out.splitlines() if "FAILED" in ln or "can't find file" in ln or "No file" in ln]
        res.problem = "; ".join(failed[:4]) or f"patch exited {proc.returncode}"
    return res


def apply_series(series: Series, root: Path | str, *, dry_run: bool = False) -> ApplyReport:
    """Apply the series to the tree at root (the directory containing `sglang/`).

    Works on a staged copy of the touched files; copies back only if every patch applied and
    dry_run is False, so a failing series leaves root exactly as it was.
    """
    root = Path(root)
    if not (root / "sglang").is_dir():
        raise PatchError(f"{root}: no sglang/ package here (give the site-packages directory)")
    exe = patch_binary()
    report = ApplyReport(str(root), series.sha256, [])
    with tempfile.TemporaryDirectory(prefix="patches-stage-") as tmp:
        stage = Path(tmp)
        for rel in series.touched:
            src = root / rel
            if src.is_file():
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, stage / rel)
        for p in series.patches:
            res = apply_one(p, stage, exe=exe)
            report.results.append(res)
            if not res.ok:
                return report
        if not dry_run:
            for rel in series.touched:
                staged, dest = stage / rel, root / rel
                if staged.is_file():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(staged, dest)
                elif dest.exists():
                    dest.unlink()
    return report


# --------------------------------------------------------------------------- sources from PyPI

def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)


def fetch_sglang(version: str, cache: Path = DEFAULT_CACHE) -> Path:
    """Unpacked `sglang/` package of sglang==version from PyPI (pip download --no-deps), cached.

    Returns the directory that contains `sglang/` (the site-packages-like root).
    """
    dest = cache / "src" / f"sglang-{version}"
    if (dest / ".complete").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Several people/CI jobs share the cache: serialise download + unpack per version.
    with open(cache / "src" / f".sglang-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".complete").is_file():
            return dest
        wheels = cache / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        whl = sorted(wheels.glob(f"sglang-{version}-*.whl"))
        if not whl:
            proc = _pip("download", f"sglang=={version}", "--no-deps", "--only-binary=:all:", "-q", "-d", str(wheels))
            whl = sorted(wheels.glob(f"sglang-{version}-*.whl"))
            if proc.returncode != 0 or not whl:
                tail = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
                raise PatchError(f"cannot download sglang=={version} from PyPI: {tail}")
        partial = Path(tempfile.mkdtemp(prefix=f".sglang-{version}.", dir=dest.parent))
        try:
            with zipfile.ZipFile(whl[0]) as zf:
                zf.extractall(partial, [n for n in zf.namelist() if n.startswith("sglang/")])
            (partial / ".complete").write_text(whl[0].name + "\n")
            shutil.rmtree(dest, ignore_errors=True)  # an incomplete leftover
            partial.rename(dest)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return dest


def _vkey(v: str) -> tuple:
    parts = []
    for piece in re.split(r"[.]", v):
        m = re.match(r"^(\d+)(.*)$", piece)
        parts.append((int(m.group(1)), m.group(2)) if m else (-1, piece))
    return tuple(parts)


def newest_release() -> str:
    """Newest sglang release on the package index (pip index versions)."""
    proc = _pip("index", "versions", "sglang")
    m = re.search(r"Available versions: (.+)", proc.stdout)
    if proc.returncode != 0 or not m:
        tail = (proc.stderr.strip().splitlines() or ["no answer"])[-1]
        raise PatchError(f"cannot list sglang releases: {tail}")
    versions = [v.strip() for v in m.group(1).split(",") if v.strip()]
    finals = [v for v in versions if re.fullmatch(r"[\d.]+(\.post\d+)?", v)]
    return max(finals or versions, key=_vkey)


def _digest(p: Path) -> str | None:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None


@dataclass
class DriftReport:
    pinned: str
    newest: str
    results: list[PatchResult]
    changed_files: list[str]  # touched files whose upstream content differs between pinned and newest

    @property
    def clean(self) -> bool:
        return all(r.ok and not r.offsets for r in self.results) and not self.changed_files


def drift(series: Series, newest: str, cache: Path = DEFAULT_CACHE) -> DriftReport:
    """Apply the series (dry run) to sglang==newest and compare the touched upstream files."""
    pinned_root = fetch_sglang(series.version, cache)
    newest_root = fetch_sglang(newest, cache)
    changed = [rel for rel in series.touched if _digest(pinned_root / rel) != _digest(newest_root / rel)]
    rep = apply_series(series, newest_root, dry_run=True)
    return DriftReport(series.version, newest, rep.results, changed)
