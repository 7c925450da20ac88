"""Which stored texts a detector change flips: the text detectors of a git revision against the working tree.

    python bench/detector_diff.py --base REV docs/gate-heldout-seed20261201.json [more.json ...] [--out X.json]

Loads src/sglfleet/textscore/detectors.py (src/sglfleet/validation/detectors.py before the textscore package,
validation/detectors.py before the src/ layout) as it was at REV
(git show) next to the current one and scores every item
of the given bench/gate_families.py results with both (text detectors only; the judge is not involved).
Writes every item whose verdict differs, with its label, and the counts per label: a change meant to catch
garbled texts should flip garbled items only. Exit 1 when a coherent item flips to flagged.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import sglfleet.textscore.detectors as current  # noqa: E402
from bench.history import commit, read_json  # noqa: E402

DETECTORS = "src/sglfleet/textscore/detectors.py"
OLDER = ("src/sglfleet/validation/detectors.py",  # revisions before the textscore package
         "validation/detectors.py")              # revisions before the src/sglfleet layout


def _load_at(rev: str) -> object:
    for rel in (DETECTORS, *OLDER):
        src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{rel}"], capture_output=True, text=True)
        if src.returncode == 0:
            break
    else:
        raise SystemExit(f"detector_diff: no textscore/detectors.py at {rev!r} (neither {DETECTORS} nor "
                         f"{' nor '.join(OLDER)}): {src.stderr.strip()}")
    text = src.stdout
    if rel == OLDER[-1]:  # its imports name the packages before the sglfleet namespace
        text = re.sub(r"^(\s*)from (validation|pipeline)([.\s])", r"\1from sglfleet.\2\3", text, flags=re.M)
    path = Path(tempfile.mkdtemp(prefix="detdiff-")) / "detectors_base.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("validation.detectors_base", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="git revision whose detectors to compare against")
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out")
    args = ap.parse_args()
    base = _load_at(args.base)
    flips, n = [], 0
    for f in args.results:
        try:
            items = read_json(f)["items"]  # a removed seed file: from git history
        except (OSError, ValueError, KeyError) as exc:
            print(f"detector_diff: {f}: not a gate_families result ({exc})", file=sys.stderr)
            return 2
        for it in items:
            n += 1
            before = [x.reason for x in base.score_text(it["text"])]  # type: ignore[attr-defined]
            after = [x.reason for x in current.score_text(it["text"])]
            if bool(before) != bool(after):
                flips.append({"file": f, "id": it["id"], "label": it["label"], "class": it["class"],
                              "before": before[:2], "after": after[:2]})
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", DETECTORS],
                           capture_output=True, text=True).stdout.strip()
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python bench/detector_diff.py " + " ".join(sys.argv[1:]),
        "base": args.base, "head": commit() + (" (detectors modified)" if dirty else ""),
        "items": n,
        "coherent_now_flagged": sum(1 for x in flips if x["label"] == "ok" and x["after"]),
        "coherent_now_passed": sum(1 for x in flips if x["label"] == "ok" and not x["after"]),
        "garbled_now_flagged": sum(1 for x in flips if x["label"] == "bad" and x["after"]),
        "garbled_now_passed": sum(1 for x in flips if x["label"] == "bad" and not x["after"]),
        "flips": flips,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "flips"}))
    for x in flips:
        print(f"  {x['file']} {x['id']} ({x['label']}): {x['before'][:1]} -> {x['after'][:1]}")
    return 1 if result["coherent_now_flagged"] else 0


if __name__ == "__main__":
    sys.exit(main())
