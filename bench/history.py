"""Raw results that left the tree: read them from git history, where `git rm` kept them.

Pages cite a removed raw file as `COMMIT:PATH`; the lab scripts that re-score old results (own loops,
sampled typicality, detector diffs) read such a file by its path alone: from the tree when it is there,
else from the last commit that still had it.

A lab script writes a raw file headed by `raw_header()`: the command, date, machine and commit it was
measured with (the renderers read those four fields by these names).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SEED_DIGEST = REPO / "docs" / "results" / "gate-heldout-seeds.json"


def _git(*args: str, repo: Path = REPO) -> str:
    r = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise FileNotFoundError(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def commit(repo: Path = REPO) -> str:
    """The checkout's short commit hash, or "unknown" outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def raw_header(script: str, argv: Sequence[str] | None = None, *, note: str | None = None) -> dict[str, str]:
    """The head of a raw result file: `command` (script is its path from the repo root, e.g.
    "bench/gate_time.py"; argv defaults to this process's arguments), `date`, `machine` (architecture, cores,
    then note, by default the host name) and `commit`."""
    args = sys.argv[1:] if argv is None else list(argv)
    return {"command": " ".join(["python", script, *args]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {note or platform.node()}",
            "commit": commit()}


def render_main(argv: Sequence[str], render: Any, script: str) -> int:
    """A renderer's command line: ``script RAW.json[.gz]`` prints ``render(raw, path)``; exit 2 on bad input."""
    if len(argv) != 1:
        print(f"usage: {script} RAW.json[.gz]", file=sys.stderr)
        return 2
    try:
        raw = json.loads(raw_text(Path(argv[0])))
    except (OSError, ValueError) as exc:
        print(f"error: cannot read {argv[0]}: {type(exc).__name__}", file=sys.stderr)
        return 2
    sys.stdout.write(render(raw, argv[0]))
    return 0


def raw_text(f: Path) -> str:
    """A committed raw file's text; a large one may be kept compressed: NAME.json.gz (gzip) or NAME.json.xz (xz,
    for the largest: the serve matrices' and the device series' raws shrink to a third to a fifth of their gzip)."""
    if f.suffix == ".gz":
        import gzip

        return gzip.decompress(f.read_bytes()).decode("utf-8")
    if f.suffix == ".xz":
        import lzma

        return lzma.decompress(f.read_bytes()).decode("utf-8")
    return f.read_text(encoding="utf-8")


def write_raw(out: Path, result: Any) -> None:
    """A raw result file: JSON, compressed where the name ends in .gz (gzip, no timestamp) or .xz (xz at its
    strongest preset, compact separators), as raw_text reads it; the same result gives the same bytes."""
    if out.name.endswith(".xz"):
        import lzma

        compact = (json.dumps(result, separators=(",", ":")) + "\n").encode()
        out.write_bytes(lzma.compress(compact, preset=9 | lzma.PRESET_EXTREME))
        return
    import gzip

    text = (json.dumps(result, indent=1) + "\n").encode()
    out.write_bytes(gzip.compress(text, 9, mtime=0) if out.name.endswith(".gz") else text)


def read_text(path: str | Path, repo: Path = REPO) -> str:
    """The file's text from the tree, or from the last commit before it was removed."""
    p = Path(path)
    f = p if p.is_absolute() else repo / p
    if f.is_file():
        return raw_text(f)
    rel = str(f.relative_to(repo)) if f.is_relative_to(repo) else str(p)
    last = _git("rev-list", "-1", "HEAD", "--", rel, repo=repo).strip()  # the commit that removed or last changed it
    if not last:
        raise FileNotFoundError(f"{rel}: not in the tree and never committed")
    try:
        return _git("show", f"{last}:{rel}", repo=repo)
    except FileNotFoundError:
        return _git("show", f"{last}^:{rel}", repo=repo)


def read_json(path: str | Path, repo: Path = REPO) -> Any:
    return json.loads(read_text(path, repo))


def seed_files_in_tree(repo: Path = REPO) -> list[str]:
    """The held-out seed files of bench/gate_families.py in the tree, `gate-heldout-seedN.json` or, once a large
    one is kept compressed, `gate-heldout-seedN.json.gz` (docs/: the files before 2026-12-04)."""
    names = []
    for d in ("docs", "docs/results"):
        for p in (repo / d).glob("gate-heldout-seed*.json*"):
            seed = p.name.removeprefix("gate-heldout-seed").removesuffix(".gz").removesuffix(".json")
            if seed.isdigit() and p.name.endswith((".json", ".json.gz")):
                names.append(str(p.relative_to(repo)))
    return sorted(names)


def seed_files() -> list[str]:
    """Every held-out seed file of bench/gate_families.py: those of the seed digest and those in the tree."""
    names = set(seed_files_in_tree())
    if SEED_DIGEST.is_file():
        names |= {s["source"]["path"] for s in json.loads(SEED_DIGEST.read_text())["seeds"]}
    return sorted(names)
