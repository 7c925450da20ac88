"""Render the held-out rates table of docs/validation.md from the raw JSON of bench/gate_families.py.

    python bench/render_gate_table.py docs/gate-heldout-seed20261201.json [more.json ...] [--doc docs/validation.md]

Replaces the text between `<!-- heldout-table:start -->` and `<!-- heldout-table:end -->` in the doc
(nothing in that block is typed by hand); --check exits 1 when the doc is not what the JSON renders.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

START, END = "<!-- heldout-table:start -->", "<!-- heldout-table:end -->"


def render(res: dict, src: str) -> str:
    s = res["summary"]
    t = res["timing_s"]
    lines = [
        f"Raw result: `{src}` — command `{res['command']}`, {res['date']}, seed {res['seed']}, "
        f"load average {res['loadavg_start_end'][0]:.1f} → {res['loadavg_start_end'][-1]:.1f}.",
        "",
        "| set | items | flagged | false-fail rate | false-pass rate |",
        "|---|---:|---:|---:|---:|",
        f"| coherent (real model output, generated tricky families, corpus) | {s['coherent']} | {s['false_fail']} | "
        f"{s['false_fail_rate']:.1%} | |",
        f"| garbled (14 corruption families, corpus) | {s['garbled']} | {s['garbled'] - s['false_pass']} | | "
        f"{s['false_pass_rate']:.1%} |",
        "",
        "| label / class | items | flagged | wrong |",
        "|---|---:|---:|---:|",
    ]
    for key, v in s["per_class"].items():
        label = key.split("/", 1)[0]
        wrong = v["flagged"] if label == "ok" else v["n"] - v["flagged"]
        lines.append(f"| {key} | {v['n']} | {v['flagged']} | {wrong} |")
    caught = ", ".join(f"{k} {v}" for k, v in sorted(s["caught_by"].items(), key=lambda kv: -kv[1]))
    lines += ["", f"Per class and by check from the same raw result, `{src}`. Findings on garbled items by check: "
              f"{caught}. Garbled items caught by the fluency judge alone: {s['fluency_only_catches']}.",
              f"Time: generating the real answers {t['generate_real']} s; scoring all {s['coherent'] + s['garbled']} "
              f"items {t['score_all']} s, of which the judge {t['judge_busy']} s and the text detectors "
              f"{t['detectors']} s."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("result", nargs="+", help="one or more raw results, rendered in this order")
    ap.add_argument("--doc", default="docs/validation.md")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    blocks = []
    for path in a.result:
        res = json.loads(Path(path).read_text())
        blocks.append(f"#### Seed {res['seed']}\n\n" + render(res, path))
    doc = Path(a.doc).read_text()
    if START not in doc or END not in doc:
        print(f"error: {a.doc} has no {START} ... {END} block", file=sys.stderr)
        return 2
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    body = "\n\n".join(blocks)
    new = f"{head}{START}\n{body}\n{END}{tail}"
    if a.check:
        return 0 if new == doc else 1
    Path(a.doc).write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
