"""The per-token test's power as a function of the gate's size, from a real baseline's own rows (issue 41, item 2).

The gate states its per-token power in every report, at its own size, by Monte Carlo over the baseline's rows
(validation/tokenlaw.py power_statement). This script asks the same question at other sizes: a recorded baseline
file's T>0 answers are scored once by the reference scorer (the embedded SmolLM2's numpy forward pass: full
logits, each token placed in its request's own law), and the statement is computed with `--tokens` candidate
tokens per temperature (the wrong laws' draws resampled from the baseline's rows, the alphas of the profile),
per temperature alone and for every temperature's test together. It sizes a profile: how many candidate tokens
per temperature a gate needs for a given smallest refused mean total-variation distance.

    OPENBLAS_NUM_THREADS=1 python bench/token_power_size.py \
        --baseline testbed/fixtures/embedded-baseline-samples-2026-12-04.json.gz \
        --config src/sglfleet/validation/profiles/embedded.yaml --tokens 2500,5000,7500,10000,12500,15000 \
        --reps 200 --out docs/results/token-power-size-2026-12-05.json

The rows are the embedded 135M model's (llama.cpp, 24 answers per temperature, each with the parameters of its
mix entry); another model's rows (a sharper or a
flatter law) give other numbers, which is why every gate report states its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any

from likelihood_common import REPO, provenance

sys.path.insert(0, str(REPO / "src"))

from sglfleet.pipeline.errors import UsageError
from sglfleet.validation import tokenlaw
from sglfleet.validation.baseline import BaselineSample
from sglfleet.validation.config import load_gate_config
from sglfleet.validation.likelihood import pooled_alphas, power_input, token_alphas, token_verdict
from sglfleet.validation.scorers import ReferenceScorer, ScoreRequest, score_all
from sglfleet.validation.suite import load_suite


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="a baseline file recorded by `validation record-baseline`")
    ap.add_argument("--config", required=True, help="the profile whose alphas and power settings apply")
    ap.add_argument("--tokens", default="2500,5000,7500,10000", help="candidate tokens per temperature to try")
    ap.add_argument("--order", default="llamacpp", choices=sorted(tokenlaw.ORDERS),
                    help="the sampler order the baseline's engine applied (llamacpp: the embedded target)")
    ap.add_argument("--reps", type=int, default=200, help="Monte Carlo draws per share tried")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        sizes = sorted({int(x) for x in a.tokens.split(",") if x.strip()})
        if not sizes or min(sizes) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --tokens must be positive integers, got {a.tokens!r}", file=sys.stderr)
        return 2
    try:
        cfg = load_gate_config(a.config)
        raw = Path(a.baseline).read_bytes()
        doc = json.loads(gzip.decompress(raw) if a.baseline.endswith(".gz") else raw)
        # every T>0 answer with the parameters it was sampled with (its own law; the profile's mix need not match)
        rows = [BaselineSample.from_record(r) for r in doc.get("samples") or [] if float(r["temperature"]) > 0]
    except (OSError, ValueError, KeyError, TypeError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not rows or any(s.params() is None for s in rows) or not any(s.output_ids for s in rows):
        print("error: the baseline's T>0 answers need their sampling parameters and sampled ids (record it again)",
              file=sys.stderr)
        return 2
    suite = load_suite(cfg.suite)
    prompts = {p.id: p for p in suite.prompts}
    lc = cfg.likelihood
    scorer = ReferenceScorer(cfg.judge, lc.window)
    scorer.order = tokenlaw.ORDERS[a.order]
    temps = sorted({s.temperature for s in rows})
    t0 = time.time()
    scored: dict[float, list[Any]] = {}
    try:
        for t in temps:
            mine = [s for s in rows if s.temperature == t]
            scored[t] = score_all(scorer, [ScoreRequest(prompts[s.prompt_id].messages(), s.text, t, s.prompt_id,
                                                        s.seed, False, s.output_ids, s.params()) for s in mine])
            print(f"T={t:g}: {len(mine)} answers scored ({time.time() - t0:.0f} s)", flush=True)
    finally:
        scorer.close()
    n_t = len(temps)
    alphas = token_alphas(lc, n_t)
    pooled = pooled_alphas(lc) if lc.pooled_share > 0 else None
    base_inputs = {}
    for t in temps:
        tv = token_verdict(scored[t], scored[t], lc.model_copy(update={"token_power_reps": 0}), n_t)
        if tv is None:
            print(f"error: T={t:g}: no per-token rows", file=sys.stderr)
            return 1
        base_inputs[t] = power_input(tv.as_dict(), scored[t], alphas)
    out: dict[str, Any] = {**provenance(sys.argv), "baseline": a.baseline, "config": a.config, "order": a.order,
                           "reps": a.reps, "target": lc.token_power_target,
                           "alphas": {"ks": alphas.ks, "mean": alphas.mean, "outside": alphas.outside,
                                      "dispersion": alphas.dispersion, "edge": alphas.edge},
                           "pooled_alphas": None if pooled is None else dataclasses.asdict(pooled),
                           "families": list(tokenlaw.FAMILIES),
                           "rows_per_temperature": {f"{t:g}": int(base_inputs[t].draws.shape[0]) for t in temps},
                           "sizes": []}
    for n in sizes:
        ins = {t: dataclasses.replace(x, n_cand=n) for t, x in base_inputs.items()}
        per_t = {f"{t:g}": tokenlaw.power_statement([x], lc.token_power_target, a.reps, lc.rng_seed)
                 for t, x in ins.items()}
        # as the gate states it (likelihood.gate_token_power): every temperature's tests and the pooled ones
        both = tokenlaw.power_statement(list(ins.values()), lc.token_power_target, a.reps, lc.rng_seed + 1,
                                        pooled=pooled)
        out["sizes"].append({"tokens_per_temperature": n, "per_temperature": per_t, "all_temperatures": both})
        shown = ", ".join(f"T{t}: {v['min_mean_tv_all_families']}" for t, v in per_t.items())
        print(f"{n} tokens per temperature: {shown}; together {both['min_mean_tv_all_families']} "
              f"({time.time() - t0:.0f} s)", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
