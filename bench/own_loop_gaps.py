"""How far the loops of stored gate_families items trail the reference model's greedy choice.

    python bench/own_loop_gaps.py --out docs/results/own-loop-gaps-2026-12-02.json

Reads every item of docs/gate-*-seed*.json that the text detectors flagged with loop checks only
(ngram_loop, near_repeat) and scores it with the fluency judge, recording per item the widest gap (nats
between the reference's most likely token and the text's token) over the whole text and over the first two
periods of its longest back-to-back token loop. This calibrates judge.own_loop_max_gap: the real T=0 loops
of the embedded model against the loops the corruption families write (docs/detectors-lab.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.history import raw_header, read_json, seed_files  # noqa: E402
from sglfleet.textscore.judge import CHAT_PREFIX, LOOP_CHECKS, FluencyJudge  # noqa: E402
from sglfleet.validation.config import GateConfig  # noqa: E402


def loop_items() -> list[dict[str, Any]]:
    files = [*seed_files(), "docs/gate-calibration-seed1.json"]  # removed ones from git history
    items, seen = [], set()
    for f in files:
        for x in read_json(f).get("items", []):
            checks = {str(fi).split(":")[0] for fi in x.get("findings", [])}
            if not checks or not checks <= set(LOOP_CHECKS) or (x["text"], x.get("prompt")) in seen:
                continue
            seen.add((x["text"], x.get("prompt")))
            items.append({**x, "checks": sorted(checks), "file": Path(f).name})
    return items


def longest_run(ids: list[int], max_period: int = 64) -> tuple[int, int, int] | None:
    """(covered tokens, period, start) of the longest back-to-back repeat of a block of token ids."""
    best = None
    for p in range(1, min(max_period, len(ids) // 2) + 1):
        r = 0
        for i in range(p, len(ids)):
            r = r + 1 if ids[i] == ids[i - p] else 0
            if r >= p and (best is None or r + p > best[0]):
                best = (r + p, p, i - r - p + 1)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = GateConfig().judge
    out = []
    with FluencyJudge(cfg) as j:
        for x in loop_items():
            prefix = [i for i, _ in j.tokenize(CHAT_PREFIX.format(prompt=(x.get("prompt") or "")[:2000]))][-64:]
            toks = j.tokenize(x["text"])[-cfg.max_tokens:]
            ids = [i for i, _ in toks]
            _, gap = j.nll_and_gap(prefix, ids)
            run = longest_run(ids)
            a, b = (run[2], min(len(ids), run[2] + 2 * run[1])) if run else (0, len(ids))
            out.append({"label": x["label"], "class": x["class"], "file": x["file"], "checks": x["checks"],
                        "loop_run": run, "loop_max_gap": round(max(gap[a:b]), 3),
                        "whole_max_gap": round(max(gap), 3), "loop_text": "".join(p for _, p in toks[a:b])[:120],
                        "tokens": len(ids)})
    own = [o["whole_max_gap"] for o in out if o["label"] == "ok" and o["class"].endswith("_T0")]
    bad = [o["whole_max_gap"] for o in out if o["label"] == "bad"]
    result = {**raw_header("bench/own_loop_gaps.py"),
              "judge_config": cfg.model_dump(mode="json"),
              "summary": {"real_T0_loops": len(own), "real_T0_max_whole_gap": max(own, default=None),
                          "garbled_loops": len(bad), "garbled_min_whole_gap": min(bad, default=None),
                          "garbled_at_or_under_limit": sum(1 for g in bad if g <= (cfg.own_loop_max_gap or 0))},
              "items": out}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
