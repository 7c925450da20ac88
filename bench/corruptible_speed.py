"""Decode speed of the corruptible engine per mode: target-only, and speculative at several budgets / faults.

    python bench/corruptible_speed.py [--modes plain,b3,b5,b7,b11,b5:mask_width,...] [--max-tokens 64]
        [--prompts poem,prose,code,long] [--rounds 2] [--out docs/results/corruptible-speed-DATE.json]

In process (the real engine, testbed/corruptible/engine.py), one BLAS thread. Every round runs every mode on
every prompt at T=0, modes interleaved so the machine's load (2 cores shared with other work) hits them
alike; per mode it records tokens, seconds, tokens/s (emitted tokens over wall time, prefill included), target
passes, and the accept length (tokens per target pass). It also times the model's per-layer matmuls at one
and two BLAS threads, interleaved, which is why the engine pins one. Load averages are recorded with the
numbers: on a shared machine they are the context of every rate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")  # loaded with 2 so the 1-vs-2 comparison can set either

import numpy as np  # noqa: E402

from bench.history import raw_header  # noqa: E402
from testbed.corruptible.engine import FAULTS, Engine, EngineConfig, Request, set_blas_threads  # noqa: E402

PROMPTS = {
    "poem": "Write a short poem about the ocean.",
    "prose": "In one paragraph, explain why the sky looks blue during the day.",
    "code": "Write a Python function that returns the n-th Fibonacci number. Keep it short.",
    "long": "Write a detailed guide with several paragraphs on how to plant and care for a small vegetable garden.",
}


def parse_mode(m: str) -> EngineConfig:
    """plain | b<budget>[k<topk>][:<fault>]"""
    if m == "plain":
        return EngineConfig(speculative=False)
    head, _, fault = m.partition(":")
    if not head.startswith("b") or (fault and fault not in FAULTS):
        raise ValueError(f"mode {m!r}: plain or b<budget>[k<topk>][:<fault>]")
    b, _, k = head[1:].partition("k")
    return EngineConfig(budget=int(b), topk=int(k) if k else EngineConfig.model_fields["topk"].default,
                        fault=fault or None)


def blas_matmuls(engine: Engine, reps: int) -> dict[str, Any]:
    """Seconds for one pass of every layer's matmuls (n = 1 and n = 6 rows), at 1 and 2 BLAS threads."""
    lm = engine.lm
    out: dict[str, Any] = {}
    for n in (1, 6):
        x = np.random.default_rng(0).random((n, lm.hp.n_embd), dtype=np.float32)
        x2 = np.random.default_rng(1).random((n, lm.hp.n_ff), dtype=np.float32)
        times: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(reps):
            for th in (1, 2):
                set_blas_threads(th)
                t0 = time.perf_counter()
                for layer in range(lm.hp.n_layer):
                    x @ lm.wqkv[layer]
                    x @ lm.wo[layer]
                    x @ lm.wgu[layer]
                    x2 @ lm.wd[layer]
                x @ lm.out_t
                times[th].append(time.perf_counter() - t0)
        out[f"rows_{n}"] = {f"threads_{th}": {"median_ms": round(1000 * statistics.median(v), 1),
                                              "all_ms": [round(1000 * t, 1) for t in v]} for th, v in times.items()}
    set_blas_threads(1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="plain,b3,b5,b7,b11,b15")
    ap.add_argument("--prompts", default="poem,prose,code,long")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--blas-reps", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "docs" / "results" /
                                         f"corruptible-speed-{time.strftime('%Y-%m-%d')}.json"))
    args = ap.parse_args()
    try:
        cfgs = {m: parse_mode(m.strip()) for m in args.modes.split(",") if m.strip()}
        prompts = {p: PROMPTS[p] for p in args.prompts.split(",")}
    except (ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    set_blas_threads(1)
    engines = {m: Engine(c) for m, c in cfgs.items()}
    first = next(iter(engines.values()))
    ids = {p: first.encode(first.render([{"role": "user", "content": t}])) for p, t in prompts.items()}
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in engines}
    loads: list[float] = []
    for r in range(args.rounds):
        for p in prompts:
            for m, e in engines.items():
                g = e.generate(Request(ids[p], args.max_tokens))
                rows[m].append({"round": r, "prompt": p, "tokens": len(g.tokens), "seconds": round(g.seconds, 3),
                                "target_passes": g.target_passes, "draft_n": g.draft_n,
                                "draft_accepted": g.draft_accepted})
                loads.append(os.getloadavg()[0])
                print(f"{m} {p}: {len(g.tokens)} tokens in {g.seconds:.1f}s", flush=True)
    summary = {}
    plain_tokens = None
    for m, rs in rows.items():
        toks, secs = sum(x["tokens"] for x in rs), sum(x["seconds"] for x in rs)
        passes = sum(x["target_passes"] for x in rs)
        summary[m] = {"config": cfgs[m].model_dump(include={"speculative", "budget", "topk", "fault"}),
                      "verify_width": cfgs[m].verify_width, "tokens": toks, "seconds": round(secs, 2),
                      "tokens_per_s": round(toks / secs, 2), "tokens_per_target_pass": round(toks / passes, 3),
                      "median_request_tokens_per_s": round(statistics.median(x["tokens"] / x["seconds"]
                                                                             for x in rs), 2)}
        if m == "plain":
            plain_tokens = [x["tokens"] for x in rs]
        elif plain_tokens is not None and cfgs[m].fault is None:
            summary[m]["same_token_counts_as_plain"] = [x["tokens"] for x in rs] == plain_tokens
    doc = {**raw_header("bench/corruptible_speed.py", note="shared with other work"),
           "load_average_1m": {"min": round(min(loads), 2), "median": round(statistics.median(loads), 2),
                               "max": round(max(loads), 2)},
           "max_tokens": args.max_tokens, "prompts": list(prompts), "rounds": args.rounds, "summary": summary,
           "blas_matmuls_per_pass": blas_matmuls(first, args.blas_reps), "requests": rows}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
