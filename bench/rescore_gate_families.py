"""Re-score a stored bench/gate_families.py result with the current text detectors.

    python bench/rescore_gate_families.py docs/gate-heldout-seed20261202.json [--profile P] [--out X.json]

The items (every text, its label, class and the fluency judge's stored score) are read back from the
raw JSON; only the text detectors run again, on the same texts, so a detector change is measured on
exactly the items of that seed (no regeneration, no judge run). The judge's verdict is the stored one:
it depends on the text and the judge config only, and neither changed. Prints false-fail / false-pass
before (stored) and after (now), and every item whose verdict changed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.history import read_json  # noqa: E402
from sglfleet.textscore.detectors import score_text  # noqa: E402
from sglfleet.validation.config import load_gate_config  # noqa: E402


def rates(items: list[dict], key: str) -> dict[str, object]:
    ok = [i for i in items if i["label"] == "ok"]
    bad = [i for i in items if i["label"] == "bad"]
    ff = sum(1 for i in ok if i[key])
    fp = sum(1 for i in bad if not i[key])
    return {"coherent": len(ok), "garbled": len(bad), "false_fail": ff, "false_pass": fp,
            "false_fail_rate": round(ff / max(1, len(ok)), 4), "false_pass_rate": round(fp / max(1, len(bad)), 4)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("result")
    ap.add_argument("--profile", help="deployment profile whose thresholds to use (default: the gate's defaults)")
    ap.add_argument("--out")
    args = ap.parse_args()
    th = load_gate_config(args.profile).thresholds
    data = read_json(args.result)  # a removed seed file: from git history
    changed = []
    for it in data["items"]:
        fluency = [f for f in it["findings"] if f.startswith("fluency")]
        it["findings_now"] = [f"{f.check}: {f.reason}" for f in score_text(it["text"], th)] + fluency
        it["flagged_now"] = bool(it["findings_now"])
        if it["flagged_now"] != it["flagged"]:
            changed.append(it)
    out = {"command": "python bench/rescore_gate_families.py " + " ".join(sys.argv[1:]),
           "result": args.result, "profile": args.profile, "seed": data.get("seed"),
           "before": rates(data["items"], "flagged"), "after": rates(data["items"], "flagged_now"),
           "changed": [{k: it[k] for k in ("id", "label", "class", "findings", "findings_now", "text")}
                       for it in changed]}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({k: out[k] for k in ("result", "profile", "before", "after")}, indent=1))
    for it in changed:
        print(f"changed: {it['id']} ({it['label']}/{it['class']}): {it['findings'][:2]} -> {it['findings_now'][:2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
