"""Digest of the held-out gate seeds: one summary per seed file, with where its full raw file lives.

Each `bench/gate_families.py --seed N` run writes a few hundred kB (every text, every verdict). The results
page shows one row per seed; the full files of the older seeds stay in git history only. This script reads
the seed files (from the tree, or from a commit with --commit) and writes their `summary` sections and
their fresh/fixed split (bench/render_gate_table.py `split`: items generated at that seed vs the corpus and
stored SGLang answers scored at every seed), with the seed, the run's date and command, and the file's path,
commit and git blob id, so that any row can be checked against the full file: `git show COMMIT:PATH`.

    python bench/gate_heldout_seeds.py --out docs/results/gate-heldout-seeds.json [--commit REV] [FILE ...]

A new seed: commit its file under docs/, run the command without FILE: the seed files in the tree are read
(again), and the rows of an existing --out for files no longer in the tree are kept as they are (they name
their commit); `--fresh` drops those. Exit 2 on a missing or unreadable seed file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.history import seed_files_in_tree  # noqa: E402
from bench.render_gate_table import split  # noqa: E402


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def _read(path: str, commit: str | None) -> tuple[dict[str, Any], str, str]:
    """(parsed file, its commit, its blob id)."""
    if commit:
        rev = _git("rev-parse", commit)
        data = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, check=True).stdout
        blob = _git("rev-parse", f"{rev}:{path}")
    else:
        f = REPO / path
        data = f.read_bytes()
        rev = _git("log", "-1", "--format=%H", "--", path) or "uncommitted"
        blob = _git("hash-object", str(f))
    if path.endswith(".gz"):  # a large seed file kept compressed (its blob is the compressed file's)
        data = gzip.decompress(data)
    return json.loads(data.decode("utf-8")), rev, blob


def digest(paths: list[str], commit: str | None, keep: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    seeds: list[dict[str, Any]] = []
    for p in paths:
        raw, rev, blob = _read(p, commit)
        if "summary" not in raw or "seed" not in raw:
            raise ValueError(f"{p}: no seed/summary (not a bench/gate_families.py result)")
        seeds.append({"seed": raw["seed"], "date": raw.get("date"), "command": raw.get("command"),
                      "source": {"path": p, "commit": rev, "blob": blob}, "summary": raw["summary"],
                      "split": split(raw)})
    # a kept row stands for a seed file no longer in the tree; a seed read again (also from a moved file) replaces it
    read = {s["seed"] for s in seeds}
    seeds += [s for s in keep or [] if s["source"]["path"] not in paths and s["seed"] not in read]
    seeds.sort(key=lambda s: s["seed"])
    return {"command": "python bench/gate_heldout_seeds.py " + " ".join(sys.argv[1:]),
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "seeds": seeds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*",
                    help="seed files relative to the repository (default: docs/results/gate-heldout-seed*.json[.gz])")
    ap.add_argument("--commit", help="read the files as they are at this commit")
    ap.add_argument("--out", required=True)
    ap.add_argument("--fresh", action="store_true", help="drop the rows of --out whose files are not read again")
    args = ap.parse_args(argv)
    files = args.files or seed_files_in_tree()
    if not files:
        print("error: no seed files given or found", file=sys.stderr)
        return 2
    try:
        old = Path(args.out)
        keep = [] if args.fresh or not old.is_file() else json.loads(old.read_text(encoding="utf-8"))["seeds"]
        out = digest(files, args.commit, keep)
    except (OSError, ValueError, KeyError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # compact: the digest grows a row per seed and docs/ is kept small
    Path(args.out).write_text(json.dumps(out, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(out['seeds'])} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
