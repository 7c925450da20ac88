"""How far each sampler fault of the corruptible engine moves a token's law: its strength, in the units of the
gate's per-token power statement (issue 41: is a fault that passes the gate too weak to be refused at the gate's
size, or is the gate blind to it?).

The correct speculative engine (testbed/corruptible) answers the suite's T>0 prompts with the profile's sampling
mix, as a gate's suite requests do. At every node its acceptance walk visits (each emits one token) the bench
takes the node's logits row and drafted children and computes, exactly, the law of the emitted token under each
sampler fault (testbed/corruptible/sampling.py emitted_law: no_residual, heldout_b; the verify pass's law for
verify_temperature and heldout_a) and its total-variation distance from the request's own law p_T; the walk
faults also as if the drafter had proposed the target's own top-k there (`@oracle`: how strong the same fault is
under a drafter whose drafts are usually accepted; the test bed's are accepted 7 % of the time). A prefill
token is drawn from p_T by every engine (distance 0). The mean over all emitted tokens is the fault's mean
total-variation distance, the number the gate's power statement is stated in (validation/tokenlaw.py).

    OPENBLAS_NUM_THREADS=1 python bench/corruptible_fault_strength.py --temperatures 0.6,0.8,1.0 \
        --seeds 1234,2345 --out docs/results/corruptible-fault-strength-2026-12-05.json

The laws are measured along the correct engine's own walks: a faulted engine walks other paths, which changes
which rows are visited, not how far each row's law is moved (first order).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from likelihood_common import REPO, provenance

sys.path.insert(0, str(REPO / "src"))

from sglfleet.pipeline.errors import UsageError
from sglfleet.validation import tokenlaw
from sglfleet.validation.config import load_gate_config
from sglfleet.validation.likelihood import answer_seed, token_alphas
from sglfleet.validation.suite import load_suite
from testbed.corruptible.engine import SAMPLER_FAULTS, Engine, EngineConfig, Request
from testbed.corruptible.sampling import emitted_law, node_probs, total_variation

DEFAULT_CONFIG = REPO / "testbed" / "corruptible" / "gate-profile.yaml"


# the walk faults measured again as if the drafter proposed the target's own top-k at every node (a drafter as good
# as a trained DFlash one is at its best): how strong the same fault is where drafts are usually accepted
ORACLE = ("no_residual", "heldout_b")
# the faults written blind to the gate whose effect is a node's law (heldout_d, the top-p cut one token short);
# heldout_c moves the law only off the first-child path and heldout_e only beside a greedy batch mate: no one
# node's law, so they are gated, not measured here
LAW_FAULTS = (*SAMPLER_FAULTS, "heldout_d")
KEYS = (*LAW_FAULTS, *(f"{f}@oracle" for f in ORACLE))
CORRECT = "correct"  # the request's own law: the baseline's draws in power_by_size


def fault_laws(row: np.ndarray, kids: list[int], t: float, top_p: float | None, top_k: int | None,
               min_p: float | None, oracle_k: int, rng: np.random.Generator, k: int
               ) -> dict[str, tuple[float, np.ndarray, np.ndarray]]:
    """Each sampler fault at one visited node (kids: its drafted children's tokens), and the correct law under
    CORRECT: the emitted law's distance from p_T; the PITs under p_T (descending-probability order, randomized, NaN
    outside the law: as the gate places a token, validation/tokenlaw.py) of k tokens drawn from that law, each with
    its own uniform; and for the edge test (tokenlaw.edge_p) per draw the probability of the token at p_T's cut
    where p_T is cut (two or more tokens kept; NaN elsewhere), negated when the draw is that token."""
    want = node_probs(row, t, top_p, top_k, None, min_p)
    laws = {}
    for f in LAW_FAULTS:
        walk = node_probs(row, 1.0 if f == "verify_temperature" else t, top_p, top_k, f, min_p)
        laws[f] = emitted_law(walk, kids, residual=f != "no_residual", held_last=f == "heldout_b")
    order = np.argsort(-want, kind="stable")
    for f in ORACLE:
        laws[f"{f}@oracle"] = emitted_law(want, [int(x) for x in order[:oracle_k]], residual=f != "no_residual",
                                          held_last=f == "heldout_b")
    laws[CORRECT] = want
    before = np.empty_like(want)
    before[order] = np.cumsum(want[order]) - want[order]  # p_T mass strictly ahead of each token in that order
    kept = int(np.count_nonzero(want))
    cut = kept < want.size and kept >= 2
    edge_tok = int(order[kept - 1]) if cut else -1
    out = {}
    for f, law in laws.items():
        c = np.cumsum(law)
        x = np.minimum(np.searchsorted(c, rng.random(k) * c[-1], side="right"), law.size - 1)
        u = before[x] + rng.random(k) * want[x]
        u[want[x] <= 0] = np.nan
        e = np.full(k, float(want[edge_tok]) if cut else np.nan)
        e[x == edge_tok] *= -1.0
        out[f] = (total_variation(law, want), u, e)
    return out


def _edge(e: np.ndarray) -> tokenlaw.EdgeCount:
    """The draws at the law's cut of a sample of fault_laws' edge column (negative: the draw was the cut token)."""
    at = ~np.isnan(e)
    return tokenlaw.EdgeCount(int(np.sum(e[at] < 0)), float(np.abs(e[at]).sum()), int(at.sum()))


def power_by_size(pool: dict[str, tuple[np.ndarray, np.ndarray]], sizes: list[int], alphas: tokenlaw.Alphas,
                  reps: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Per gate size (candidate tokens at one temperature, a clean baseline twice as large drawn from CORRECT's
    pool): the probability that the per-token test (tokenlaw.decide and the edge test, the shipped alphas)
    refuses an engine with each fault, every token drawn from the fault's law: n draws taken without replacement
    from the fault's pool. Sizes beyond a pool are not stated. `refused_without_edge`: the same without the edge
    test (what the gate refused before it had one)."""
    out = []
    bu, be = pool[CORRECT]
    for n in sizes:
        row: dict[str, Any] = {"tokens": n, "refused": {}, "refused_without_edge": {}}
        for f, (u, e) in pool.items():
            if f == CORRECT or n > u.size or 2 * n > bu.size:
                row["refused"][f] = row["refused_without_edge"][f] = None
                continue
            hits = hits_no_edge = 0
            for _ in range(reps):
                at = rng.choice(u.size, size=n, replace=False)
                pick = u[at]
                inside = pick[~np.isnan(pick)]
                bad = not tokenlaw.decide(inside, int(pick.size - inside.size), 2 * n, 0, 0.0, alphas)[0]
                hits_no_edge += bad
                if not bad:
                    base = _edge(be[rng.choice(bu.size, size=2 * n, replace=False)])
                    bad = tokenlaw.edge_p(_edge(e[at]), base) < alphas.edge
                hits += bad
            row["refused"][f] = hits / reps
            row["refused_without_edge"][f] = hits_no_edge / reps
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="the gate profile whose suite and mix are asked")
    ap.add_argument("--temperatures", default="0.8", help="T>0 temperatures (default: the test bed's)")
    ap.add_argument("--seeds", default="1234,2345", help="answers per prompt and temperature, by seed")
    ap.add_argument("--budget", type=int, default=None, help="engine budget (default: the engine's)")
    ap.add_argument("--topk", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None, help="default: the profile's")
    ap.add_argument("--sizes", default="800,2500,5000,12500,25000,50000",
                    help="gate sizes (candidate tokens per temperature) the power against each fault is stated at")
    ap.add_argument("--reps", type=int, default=200, help="Monte Carlo gates per size and fault")
    ap.add_argument("--draws-per-token", type=int, default=64,
                    help="tokens drawn from each fault's law at every emitted position (the power's pool)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        sizes = sorted({int(x) for x in a.sizes.split(",") if x.strip()})
        if not sizes or min(sizes) < 1:
            raise ValueError("--sizes must be positive integers")
        temps = [float(x) for x in a.temperatures.split(",") if x.strip()]
        seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
        if not temps or not seeds or min(temps) <= 0:
            raise ValueError("need T > 0 and at least one seed")
        cfg = load_gate_config(a.config)
        ecfg = EngineConfig(**{k: v for k, v in (("budget", a.budget), ("topk", a.topk)) if v is not None})
    except (ValueError, OSError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = Engine(ecfg)
    suite = load_suite(cfg.suite)
    sums: dict[str, dict[str, float]] = {f"{t:g}": dict.fromkeys(KEYS, 0.0) for t in temps}
    tokens: dict[str, int] = dict.fromkeys(sums, 0)
    per_answer: list[dict[str, Any]] = []
    draws: dict[str, dict[str, list[np.ndarray]]] = {k: {f: [] for f in (*KEYS, CORRECT)} for k in sums}
    edges: dict[str, dict[str, list[np.ndarray]]] = {k: {f: [] for f in (*KEYS, CORRECT)} for k in sums}
    rng = np.random.default_rng(20261205)
    t0 = time.time()
    for t in temps:
        for p in suite.prompts:
            mix = cfg.sampling_for(p.id, t)
            top_p = mix.top_p if mix.top_p < 1 else None
            top_k = mix.top_k or None
            min_p = mix.min_p or None
            for seed in seeds:
                ids = engine.encode(engine.render(p.messages()))
                acc = dict.fromkeys(KEYS, 0.0)
                walked = [0]

                def on_walk(path: list[int], children: list[list[int]], toks: list[int],
                            rows: dict[int, np.ndarray], acc: dict[str, float] = acc, walked: list[int] = walked,
                            t: float = t, top_p: float | None = top_p, top_k: int | None = top_k,
                            min_p: float | None = min_p) -> None:
                    for u in path:
                        got = fault_laws(rows[u], [toks[c] for c in children[u]], t, top_p, top_k, min_p,
                                         ecfg.topk, rng, a.draws_per_token)
                        for f, (d, us, es) in got.items():
                            if f != CORRECT:
                                acc[f] += d
                            draws[f"{t:g}"][f].append(us)
                            edges[f"{t:g}"][f].append(es)
                        walked[0] += 1

                req = Request(ids, a.max_tokens or cfg.max_tokens or p.max_tokens, t, top_p, top_k,
                              answer_seed(seed, p.id, t), None, min_p)
                gen = engine.generate(req, on_walk=on_walk)
                n = walked[0] + 1  # the prefill's token: p_T under every fault (its row is not seen: no edge)
                for f in (*KEYS, CORRECT):
                    draws[f"{t:g}"][f].append(rng.random(a.draws_per_token))
                    edges[f"{t:g}"][f].append(np.full(a.draws_per_token, np.nan))
                key = f"{t:g}"
                for f in KEYS:
                    sums[key][f] += acc[f]
                tokens[key] += n
                per_answer.append({"prompt_id": p.id, "temperature": t, "seed": seed, "sampling": mix.as_dict(),
                                   "emitted": len(gen.tokens), "walked_tokens": n,
                                   "accept_length": round(len(gen.tokens) / max(1, gen.verify_steps + 1), 3),
                                   "mean_tv": {f: round(acc[f] / n, 6) for f in KEYS}})
                print(f"T={t:g} {p.id} seed {seed}: {len(gen.tokens)} tokens, mean TV "
                      + ", ".join(f"{f} {acc[f] / n:.4f}" for f in KEYS)
                      + f" ({time.time() - t0:.0f} s)", flush=True)
    alphas = token_alphas(cfg.likelihood, 3)  # the shipped profiles' three T>0 temperatures
    power = {k: power_by_size({f: (np.concatenate(v), np.concatenate(edges[k][f])) for f, v in fs.items()}, sizes,
                              alphas, a.reps, rng)
             for k, fs in draws.items()}
    out: dict[str, Any] = {**provenance(sys.argv), "config": a.config, "engine": ecfg.model_dump(),
                           "temperatures": temps, "seeds": seeds,
                           "mean_tv": {k: {f: v / max(1, tokens[k]) for f, v in fs.items()} for k, fs in sums.items()},
                           "tokens": tokens, "power_alphas": {"ks": alphas.ks, "mean": alphas.mean,
                                                              "outside": alphas.outside, "edge": alphas.edge},
                           "power": power, "answers": per_answer}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["mean_tv"], indent=1))
    for k, rows in power.items():
        for r in rows:
            print(f"T={k} {r['tokens']} tokens: refused "
                  + ", ".join(f"{f} {v:.2f} ({r['refused_without_edge'][f]:.2f} without the edge test)"
                              if v is not None else f"{f} -" for f, v in r["refused"].items() if f != CORRECT))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
