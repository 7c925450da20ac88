"""Two fluency-judge set-ups side by side in one run. By default the two forward-pass engines: numpy
(textscore/refmodel.py, the default) against llama.cpp's /embedding on its Q8_0 copy (the engine the limits
were calibrated on); `--pair llamacpp-as-shipped,llamacpp-q8_0` compares the wheel's Q4_1 file with that copy.

    python bench/judge_engine.py [--pair numpy,llamacpp-q8_0] [--items docs/gate-heldout-seed20261212.json]
                                 [--n 120] [--reps 3] [--out docs/results/judge-engine.json]

Each judge is started (one at a time, so each has the 2 cores alone) and scores the same texts: the first --n
items of a stored bench/gate_families.py result, each after its prompt when it has one. Speed: text tokens
per second of the judge's busy time (tokenizing, forward pass over prompt prefix and text, projection), --reps rounds
in alternating order, the median per engine and their ratio, and each engine's start time. Agreement: per
item the worst-window NLL and the greedy gap under both, the largest and mean difference, and every item
whose verdict at the gate's default limits differs between the two. Writes the raw result with the command,
date and machine.
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

from bench.history import raw_header, read_json  # noqa: E402
from sglfleet.textscore.judge import FluencyJudge, JudgeScore, threshold_for  # noqa: E402
from sglfleet.validation.config import JudgeConfig  # noqa: E402

ENGINES = {"numpy": JudgeConfig(engine="numpy"), "llamacpp-q8_0": JudgeConfig(engine="llamacpp", weights="q8_0"),
           "llamacpp-as-shipped": JudgeConfig(engine="llamacpp", weights="as-shipped")}


def _score_all(cfg: JudgeConfig, items: list[dict]) -> tuple[float, float, int, list[JudgeScore]]:
    """(start seconds, busy seconds of the scoring, tokens through the model, scores) for one engine."""
    t0 = time.perf_counter()
    with FluencyJudge(cfg) as judge:
        start = time.perf_counter() - t0
        judge.score("A short warm-up sentence for the judge.", prompt="hello")
        busy0 = judge.busy_s
        scores = [judge.score(it["text"], it.get("prompt")) for it in items]
        busy = judge.busy_s - busy0
    return start, busy, sum(s.tokens for s in scores), scores


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="numpy,llamacpp-q8_0", help=f"two of {', '.join(ENGINES)}")
    ap.add_argument("--items", default="docs/gate-heldout-seed20261212.json")
    ap.add_argument("--n", type=int, default=120)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="docs/results/judge-engine.json")
    args = ap.parse_args()
    names = args.pair.split(",")
    if len(names) != 2 or len(set(names)) != 2 or not set(names) <= set(ENGINES):
        print(f"judge_engine: --pair takes two different of {', '.join(ENGINES)}, not {args.pair!r}", file=sys.stderr)
        return 2
    items = [it for it in read_json(args.items)["items"] if it["text"].strip()][: args.n]  # or from git history
    if not items:
        print(f"judge_engine: no items in {args.items}", file=sys.stderr)
        return 2
    jc = JudgeConfig()
    rates: dict[str, list[float]] = {e: [] for e in names}
    starts: dict[str, list[float]] = {e: [] for e in names}
    scores: dict[str, list[JudgeScore]] = {}
    for rep in range(args.reps):
        for e in (names if rep % 2 == 0 else names[::-1]):
            start, busy, tokens, sc = _score_all(ENGINES[e], items)
            rates[e].append(tokens / busy)
            starts[e].append(start)
            scores[e] = sc
            print(f"[judge-engine] round {rep + 1}: {e} start {start:.1f} s, {tokens} tokens in {busy:.1f} s "
                  f"({tokens / busy:.0f} tok/s)", flush=True)
    a_name, b_name = names
    diffs, gap_diffs, flips, errors = [], [], [], []
    for it, a, b in zip(items, scores[a_name], scores[b_name], strict=True):
        if a.error or b.error:
            errors.append({"id": it["id"], a_name: a.error, b_name: b.error})
            continue
        if a.worst_window_nll is None or b.worst_window_nll is None:
            continue
        diffs.append(abs(a.worst_window_nll - b.worst_window_nll))
        if a.max_gap is not None and b.max_gap is not None:
            gap_diffs.append(abs(a.max_gap - b.max_gap))
        limit = threshold_for(jc, it.get("category"), prompted=bool(it.get("prompt")))
        if (a.judged >= jc.min_tokens) and (a.worst_window_nll > limit) != (b.worst_window_nll > limit):
            flips.append({"id": it["id"], "label": it["label"], "limit": limit,
                          a_name: round(a.worst_window_nll, 3), b_name: round(b.worst_window_nll, 3)})
    med = {e: round(statistics.median(r), 1) for e, r in rates.items()}
    result = {
        **raw_header("bench/judge_engine.py", note=platform.processor() or "cpu"),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "items": {"file": args.items, "n": len(items)},
        "tokens_per_s": {e: [round(x, 1) for x in r] for e, r in rates.items()},
        "start_s": {e: [round(x, 2) for x in r] for e, r in starts.items()},
        "median_tokens_per_s": med,
        "pair": names,
        "speedup": round(med[a_name] / med[b_name], 3),   # the first against the second
        "worst_window_abs_diff": {"max": round(max(diffs), 3), "mean": round(sum(diffs) / len(diffs), 4),
                                  "n": len(diffs)},
        "max_gap_abs_diff": {"max": round(max(gap_diffs), 3), "mean": round(sum(gap_diffs) / len(gap_diffs), 4),
                             "n": len(gap_diffs)},
        "verdict_flips": flips,
        "errors": errors,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_tokens_per_s", "speedup", "worst_window_abs_diff",
                                             "max_gap_abs_diff")}))
    print(f"[judge-engine] {len(flips)} verdict flips, {len(errors)} errors; raw result {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
