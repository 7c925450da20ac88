"""False-fail and false-pass rates of the likelihood test on a pool of real answers of one correct target.

    OPENBLAS_NUM_THREADS=1 python bench/likelihood_rates.py --pool /tmp/lik/pool.jsonl \
        --out docs/results/likelihood-rates-embedded-2026-12-03.json [--splits 200]

The pool is bench/likelihood_pool.py's: every suite prompt at every T>0, once per seed, from the embedded
target (SmolLM2-135M on llama.cpp). Every answer is scored once under the target model (the in-process
reference model; the end-of-turn token scored where the answer stopped). Then:

- **false fail**: `--splits` draws of 2 x k distinct seeds (k = the gate's seeds per side, 3), the first k
  the candidate, the rest the baseline; each draw is one gate's T>0 verdict (every T>0 temperature tested,
  alpha split over them). Baseline = the target itself, so every rejection is a false fail. `--split shared`
  uses the same seeds for every prompt, as the gate did before validation/likelihood.answer_seed: a seed is
  then a random effect shared by all prompts (llama.cpp draws the same uniforms for the same seed, so a
  "lucky" seed lowers the NLL of every prompt at once) and the per-prompt permutation test is anti-
  conservative; `--split per-prompt` (default) draws seeds per prompt and temperature, as answer_seed makes
  a gate run do.
- **false pass / power on generated corruptions**: draws whose candidate seeds come from the first
  `--variant-seeds` seeds (the baseline's from the rest), with a fraction r of the candidate's
  answers at every temperature replaced by a corrupted variant of themselves (textscore/synth.py families,
  one family per answer, drawn at random), scored by the same scorer: the rejection rate per r (1 minus the
  false-pass rate), per family at r = 1.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.history import raw_text  # noqa: E402
from bench.likelihood_common import ScoreCache, provenance  # noqa: E402
from sglfleet.pipeline.errors import UsageError, cli_main  # noqa: E402
from sglfleet.textscore.synth import corrupt  # noqa: E402
from sglfleet.validation.config import load_gate_config  # noqa: E402
from sglfleet.validation.likelihood import likelihood_test  # noqa: E402
from sglfleet.validation.scorers import make_scorer  # noqa: E402
from sglfleet.validation.suite import load_suite  # noqa: E402

FAMILIES = ("soup_tail", "block_loop", "word_shuffle", "near_repeat", "token_soup", "glued_shuffle",
            "word_stutter", "subword_repeat", "mojibake_tail", "punct_flood")


def _median(xs: object) -> float | None:
    v = sorted(x for x in xs if x is not None)  # type: ignore[union-attr]
    return v[len(v) // 2] if v else None


@cli_main
def _all_ids(row: dict) -> tuple[int, ...] | None:
    """A pool row's sampled ids when they are all of them (as pipeline.client.ids_from_logprobs keeps them: one per
    token drawn, the end-of-turn token of a stopped answer aside); None: the answer is scored on its text."""
    ids, n = row.get("ids"), row.get("completion_tokens")
    if not ids or n is None:
        return None
    stop = row.get("finish_reason") == "stop"
    return tuple(ids) if len(ids) in (n, n - 1 if stop else n) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/likelihood_rates.py")
    ap.add_argument("--pool", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default="/tmp/lik/scores-pool.jsonl")
    ap.add_argument("--config", help="gate profile (default: the gate's defaults)")
    ap.add_argument("--splits", type=int, default=200)
    ap.add_argument("--per-side", type=int, default=3)
    ap.add_argument("--split", choices=["per-prompt", "shared"], default="per-prompt",
                    help="per-prompt: each prompt and temperature draws its own seeds (what answer_seed gives a gate "
                    "run: no two answers share a sampler stream); shared: the same seeds for every prompt")
    ap.add_argument("--rates", default="0.125,0.25,0.5,1.0")
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--variant-seeds", type=int, default=8, help="corrupted variants are made (and scored) for "
                    "the answers of the first N seeds only; corruption draws take the candidate from those")
    ap.add_argument("--score-only", action="store_true", help="score the pool (and its variants) and stop")
    ap.add_argument("--on", choices=["ids", "text"], default="ids",
                    help="score each answer on the ids the server sampled where the pool row has all of them (the "
                    "gate's way), or every answer on its text re-tokenized (the gate before ids)")
    a = ap.parse_args(argv)
    cfg = load_gate_config(a.config)
    cfg = cfg.model_copy(update={"likelihood": cfg.likelihood.model_copy(update={"power_reps": 0})})
    suite = load_suite(cfg.suite)
    rows = [json.loads(x) for x in raw_text(Path(a.pool)).splitlines() if x.strip()]  # .jsonl or .jsonl.gz
    rows = [r for r in rows if not r.get("error")]
    temps = sorted({float(r["temperature"]) for r in rows})
    prompts = [p.id for p in suite.prompts]
    have = defaultdict(set)
    for r in rows:
        have[(r["prompt_id"], float(r["temperature"]))].add(r["seed"])
    seeds = sorted(set.intersection(*(have[(p, t)] for p in prompts for t in temps)))
    if len(seeds) < 2 * a.per_side:
        raise UsageError(f"the pool has {len(seeds)} complete seeds; {2 * a.per_side} are needed")
    rows = [r for r in rows if r["seed"] in set(seeds)]
    t0 = time.time()
    scorer = make_scorer("reference", cfg)
    cache = ScoreCache(a.cache, scorer, suite)
    rng = random.Random(a.seed)
    score = {}
    variant = {}
    on_ids = 0
    for i, r in enumerate(rows):
        k = (r["prompt_id"], float(r["temperature"]), r["seed"])
        stop = r.get("finish_reason") == "stop"
        ids = _all_ids(r) if a.on == "ids" else None
        on_ids += ids is not None
        score[k] = cache.score(r["prompt_id"], k[1], r["seed"], r["text"], stop, ids)
        if r["seed"] not in seeds[:a.variant_seeds]:
            continue
        fams = list(FAMILIES)
        rng.shuffle(fams)
        for fam in fams:   # one corrupted variant per answer, of the first family that can corrupt it
            try:
                bad = corrupt(r["text"], fam, random.Random(f"{a.seed}-{k}-{fam}"))
            except ValueError:
                continue
            variant[k] = (fam, cache.score(r["prompt_id"], k[1], r["seed"], bad, False))
            break
        if i % 24 == 23:
            print(f"scored {i + 1}/{len(rows)} answers and their variants in {time.time() - t0:.0f}s",
                  file=sys.stderr, flush=True)
    scorer.close()
    if a.score_only:
        return 0
    rates = [float(x) for x in a.rates.split(",")]
    def draw(pool_c: list[int], pool_b: list[int] | None = None) -> tuple[dict, dict]:
        """{(prompt, T): candidate seeds}, {(prompt, T): baseline seeds}"""
        cs, bs = {}, {}
        shared = rng.sample(pool_c, a.per_side) if pool_b else rng.sample(pool_c, 2 * a.per_side)
        shared_b = rng.sample(pool_b, a.per_side) if pool_b else None
        for p in prompts:
            for t in temps:
                if a.split == "shared":
                    cs[(p, t)], bs[(p, t)] = ((shared, shared_b) if pool_b
                                              else (shared[:a.per_side], shared[a.per_side:]))
                elif pool_b:
                    cs[(p, t)], bs[(p, t)] = rng.sample(pool_c, a.per_side), rng.sample(pool_b, a.per_side)
                else:
                    x = rng.sample(pool_c, 2 * a.per_side)
                    cs[(p, t)], bs[(p, t)] = x[:a.per_side], x[a.per_side:]
        return cs, bs

    draws = [draw(seeds) for _ in range(a.splits)]
    fam_of = Counter(f for f, _ in variant.values())

    def gate(cand_seeds: dict, base_seeds: dict, r: float, frng: random.Random) -> dict:
        out = {"ok": True, "temps": {}}
        for t in temps:
            keys = [(p, t, s) for p in prompts for s in cand_seeds[(p, t)]]
            n_bad = round(r * len(keys))
            swap = set(frng.sample([k for k in keys if k in variant], min(n_bad, sum(k in variant for k in keys))))
            cand = [variant[k][1] if k in swap else score[k] for k in keys]
            base = [score[(p, t, s)] for p in prompts for s in base_seeds[(p, t)]]
            v = likelihood_test(cand, base, cfg, n_temperatures=len(temps))
            out["temps"][f"{t:g}"] = {"ok": v.ok, "p": v.p_value, "impossible": len(v.support["impossible"]),
                                      "families": sorted({variant[k][0] for k in swap})}
            out["ok"] &= v.ok
        return out

    vseeds, rest = seeds[:a.variant_seeds], seeds[a.variant_seeds:]
    if len(vseeds) < a.per_side or len(rest) < a.per_side:
        raise UsageError(f"--variant-seeds {a.variant_seeds} leaves too few seeds on one side of {len(seeds)}")
    cdraws = [draw(vseeds, rest) for _ in range(a.splits)]
    null = [gate(c, b, 0.0, random.Random(i)) for i, (c, b) in enumerate(draws)]
    ff = sum(not g["ok"] for g in null)
    per_t = {f"{t:g}": sum(not g["temps"][f"{t:g}"]["ok"] for g in null) for t in temps}
    min_p = {f"{t:g}": min(g["temps"][f"{t:g}"]["p"] for g in null) for t in temps}
    imp = {f"{t:g}": sum(g["temps"][f"{t:g}"]["impossible"] for g in null) for t in temps}
    print(f"false fail: {ff}/{len(draws)} gate verdicts; per T {per_t}; smallest p {min_p}", flush=True)
    power = {}
    for r in rates:
        res = [gate(c, b, r, random.Random(10_000 + i)) for i, (c, b) in enumerate(cdraws)]
        power[f"{r:g}"] = {"gate_rejections": sum(not g["ok"] for g in res), "of": len(res),
                           "per_temperature": {f"{t:g}": sum(not g["temps"][f"{t:g}"]["ok"] for g in res)
                                               for t in temps},
                           "by_impossible_token": sum(any(x["impossible"] for x in g["temps"].values())
                                                      for g in res)}
        print(f"rate {r:g}: {power[f'{r:g}']}", flush=True)
    # per family, every candidate answer corrupted by that family where it can be
    worst = defaultdict(list)
    for k, (f, s) in variant.items():
        base = score[k]
        worst[f].append({"min_log_p_T": min(s.support_logprobs) if s.support_logprobs else None,
                         "mean_nll_shift": (s.mean_nll or 0) - (base.mean_nll or 0)})
    correct_min = min(min(s.support_logprobs) for s in score.values() if s.support_logprobs)
    lowest = sorted((min(s.support_logprobs), s.label, s.pieces[s.support_logprobs.index(min(s.support_logprobs))])
                     for s in score.values() if s.support_logprobs)[:8]
    # the seed as a random effect shared by the prompts: per seed, the mean over prompts of the standardized
    # mean NLL; independent answers give it a variance of about 1 / (number of prompts)
    import numpy as np

    seed_effect = {}
    for t in temps:
        z = np.array([[score[(p, t, s)].mean_nll for s in seeds] for p in prompts], dtype=float)
        z = (z - z.mean(axis=1, keepdims=True)) / np.maximum(z.std(axis=1, keepdims=True), cfg.likelihood.sd_floor)
        m = z.mean(axis=0)
        seed_effect[f"{t:g}"] = {"variance_of_per_seed_mean_z": float(m.var()),
                                 "independent_expectation": float(z.var(axis=1).mean() / len(prompts)),
                                 "ratio": float(m.var() / (z.var(axis=1).mean() / len(prompts)))}
    doc = {**provenance(sys.argv), "seed_effect": seed_effect, "pool": a.pool, "pool_answers": len(rows),
           "seeds": seeds, "split": a.split,
           "temperatures": temps, "prompts": prompts, "per_side": a.per_side, "splits": len(draws),
           "scorer": cache.scorer.method, "likelihood_config": cfg.likelihood.model_dump(),
           "scored_on": a.on, "answers_on_ids": on_ids,
           "top_p": cfg.sampling.top_p, "wall_s": round(time.time() - t0, 1),
           "false_fail": {"gate_verdicts_failed": ff, "of": len(draws), "rate": ff / len(draws),
                          "per_temperature_failed": per_t, "smallest_p": min_p, "impossible_tokens": imp},
           "correct_answers_min_log_p_T": correct_min,
           "correct_answers_lowest_tokens": [{"log_p_T": v, "answer": lab, "token": tok} for v, lab, tok in lowest],
           "corruption": {"families_used": dict(fam_of), "by_rate": power,
                          "per_family": {f: {"n": len(v), "min_log_p_T_median": _median(x["min_log_p_T"] for x in v),
                                             "mean_nll_shift_median": _median(x["mean_nll_shift"] for x in v)}
                                         for f, v in worst.items()}}}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
