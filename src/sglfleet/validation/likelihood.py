"""The T>0 verdict from the target's own likelihood: candidate answers against target-only answers.

A speculative decoder is correct exactly when, at every temperature, it samples from the target model's
own distribution. At T>0 no single answer proves that, but the target can score every answer: each token's
log-probability under the target (the target-only SGLang server's `/generate` with input log-probs, or,
for the embedded llama.cpp target, the in-process numpy forward pass of the same model,
textscore/refmodel.py): the scorers are validation/scorers.py; this module holds the statistics. Per
temperature T:

1. **Support.** p_T = softmax(logits / T). A correct sampler at T with top_p <= 1 (top_p, top-k and min-p
   only remove candidates, and keep at least top_p of the mass) gives any one token at most p_T(tok) / top_p.
   At one position the tokens with p_T < eps hold less than V * eps of the mass (V the vocabulary size: all
   of them may lie below eps at once), so over N candidate tokens a correct sampler emits one with
   probability below N * V * eps / top_p. Every candidate token with log p_T < log(eps) fails the
   temperature; eps is the configured limit, lowered at gate time until that bound is within the support's
   share of alpha. Token-level corruption (a foreign KV slot, a wrong row) emits exactly such tokens. A token
   whose text holds U+FFFD is not checked: the text lost the engine's bytes there (it still counts in 2.).
2. **Distribution.** Per answer, the mean NLL at T (-mean log p_T) and the worst `window`-token window of
   it. A stratified (by prompt) two-sample permutation test compares the candidate's answers with the
   baseline's: the statistic is the sum over prompts of (candidate mean - baseline mean) / the prompt's
   pooled spread, labels are permuted within each prompt, p = (1 + #{|S*| >= |S|}) / (1 + permutations),
   a fixed RNG seed. Two-sided: a corruption that loops lowers the NLL (the model predicts its own
   repetition), garbage raises it. A third statistic is tested the same way: the lag-1 autocorrelation of
   each token's mid-PIT under p_T in vocabulary order, where an inverse-CDF sampler had its uniform
   (`pit_lag1`): a sampler can keep every token's law exact and still draw successive tokens from one
   shared random number, which no NLL mean sees.
3. **Alpha.** `alpha` is the false-fail rate of the whole T>0 verdict: alpha / (number of T>0 temperatures)
   per temperature (Bonferroni), `support_share` of that to the support check, `token_share` to the per-token
   test (validation/tokenlaw.py), `pooled_share` to its statistics pooled over the temperatures
   (tokenlaw.pooled_test), the rest split evenly over the statistics (a statistic the scorer cannot give keeps
   its share unspent).
4. **Power.** From the baseline's own scored answers and corrupted variants of them (textscore/synth.py,
   scored by the same scorer), Monte Carlo draws of a candidate whose answers are corrupted with rate r give
   the rejection probability at this sample count; the verdict reports the smallest r rejected with
   probability >= power_target.

    scorer = scorers.make_scorer("reference", gate_cfg, model=name, candidate_url=url)   # or the baseline's URL
    a = scorer.score(messages, answer_text, temperature, stop=True)                    # scorers.AnswerScore
    verdict = likelihood_test(candidate_scores, baseline_scores, gate_cfg, n_temperatures=3, variants=v)
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sglfleet.validation import tokenlaw
from sglfleet.validation.scorers import AnswerScore, Scorer, ScoreRequest, score_all, score_key
from sglfleet.validation.tokenlaw import SamplingParams

DEFAULT_VOCAB = 262_144  # the support bound's V when no answer says its vocabulary


# ---------------------------------------------------------------------------- the test


@dataclass
class LikelihoodVerdict:
    """One temperature's likelihood test."""

    temperature: float
    ok: bool
    alpha: float                 # this temperature's share of the family-wise alpha
    p_value: float               # the smallest p of the statistics (1.0 when not tested)
    n_candidate: int
    n_baseline: int
    statistic: dict[str, Any]
    support: dict[str, Any]
    power: dict[str, Any]
    method: str
    evidence: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    # answers scored on the ids the server sampled, per side (the rest on their text re-tokenized)
    on_ids: dict[str, int] = field(default_factory=dict)
    # the per-token test (tokenlaw.TokenVerdict.as_dict()), None when the answers carry no sampling parameters (not
    # "token": the reports redact values under keys ending so)
    per_token: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


STATS = ("mean_nll", "worst_window_nll", "pit_lag1")
_PIT_STATS = ("pit_lag1",)
# the floor of a prompt's pooled spread per statistic: the NLLs' is likelihood.sd_floor (nats); an
# autocorrelation of ~50 mid-PITs spreads by ~0.14, and 0.01 only keeps a zero spread from dividing
_PIT_SD_FLOOR = 0.01


def _stat(a: AnswerScore, name: str) -> float:
    v = {"mean_nll": a.mean_nll, "worst_window_nll": a.worst_window_nll, "pit_lag1": a.pit_lag1}[name]
    return float(v) if v is not None else float("nan")


def _computable(answers: list[AnswerScore]) -> tuple[str, ...]:
    """The statistics every answer has (the PIT statistics need the scorer's PITs)."""
    return tuple(n for n in STATS if n not in _PIT_STATS or all(a.pit is not None for a in answers))


def permutation_test(cand: dict[str, np.ndarray], base: dict[str, np.ndarray], permutations: int, seed: int,
                     sd_floor: float) -> dict[str, Any]:
    """Stratified two-sided permutation test: S = sum over strata of (mean_c - mean_b) / pooled sd, labels
    permuted within each stratum; p = (1 + #{|S*| >= |S|}) / (1 + permutations)."""
    rng = np.random.default_rng(seed)
    strata = sorted(set(cand) & set(base))
    obs = 0.0
    perm = np.zeros(permutations)
    per: dict[str, Any] = {}
    for s in strata:
        c, b = cand[s], base[s]
        x = np.concatenate([c, b])
        sd = max(float(x.std()), sd_floor)
        d = (c.mean() - b.mean()) / sd
        obs += d
        keys = rng.random((permutations, x.size))
        idx = np.argsort(keys, axis=1)[:, :c.size]
        mc = x[idx].mean(axis=1)
        mb = (x.sum() - c.size * mc) / b.size
        perm += (mc - mb) / sd
        per[s] = {"candidate_mean": float(c.mean()), "baseline_mean": float(b.mean()), "sd": sd,
                  "shift_sd": float(d), "n_candidate": int(c.size), "n_baseline": int(b.size)}
    p = (1 + int(np.sum(np.abs(perm) >= abs(obs) - 1e-12))) / (1 + permutations)
    z = obs / float(perm.std()) if perm.std() > 0 else 0.0
    return {"S": float(obs), "z": float(z), "p_value": float(p), "strata": per}


def smallest_p(sizes: list[tuple[int, int]], permutations: int) -> float:
    """The smallest p-value `permutation_test` can give for strata of (candidate, baseline) answers: the
    observed labelling is one of M = prod C(c + b, c) within-prompt labellings (two when every stratum has
    c == b: swapping all labels only flips the sign of S), and the Monte Carlo estimate adds one to both
    counts. When it is not below the statistic's alpha the test cannot reject whatever the answers are."""
    m = math.prod(math.comb(c + b, c) for c, b in sizes) if sizes else 1
    exact = (2 if sizes and all(c == b for c, b in sizes) else 1) / m
    return max(exact, 1 / (1 + permutations))


def design_problem(lc: Any, n_prompts: int, n_temperatures: int) -> str | None:
    """Why this sampling plan (len(seeds) candidate and len(baseline_seeds) baseline answers per prompt, over
    n_prompts prompts) can never fail the distribution test at its alpha, or None when it can."""
    a_stat = _alphas(lc, n_temperatures)[2]
    c, b = len(lc.seeds), len(lc.baseline_seeds)
    floor = smallest_p([(c, b)] * n_prompts, lc.permutations)
    if floor < a_stat:
        return None
    return (f"likelihood: {c} candidate and {b} baseline answer(s) per prompt over {n_prompts} prompts give the "
            f"permutation test no p-value below {floor:.3g}, and each statistic needs p < {a_stat:.3g} (alpha "
            f"{lc.alpha:g} over {n_temperatures} T>0 temperature(s)): the test could never fail; add seeds to "
            "likelihood.seeds / baseline_seeds")


def _alphas(lc: Any, n_temperatures: int, token: bool = True) -> tuple[float, float, float]:
    """(a temperature's alpha, the support check's share, each answer-level statistic's share); the per-token
    test's share is `token_alphas` (token False: the answers carry no sampling parameters, so the per-token test
    cannot run and its share goes back to the answer-level statistics)."""
    a_t = lc.alpha / max(1, n_temperatures)
    share = float(getattr(lc, "token_share", 0.0)) + float(getattr(lc, "pooled_share", 0.0)) if token else 0.0
    return a_t, a_t * lc.support_share, a_t * (1 - lc.support_share - share) / len(STATS)


def token_alphas(lc: Any, n_temperatures: int) -> tokenlaw.Alphas:
    """The per-token test's alphas: `token_share` of the temperature's alpha, three tenths to the KS test, a
    quarter to the mean u, three twentieths to the count of tokens outside the law, a tenth each to the answers'
    dispersion, the draws at the law's cut (tokenlaw.edge_p) and consecutive tokens' dependence
    (tokenlaw.serial_p)."""
    a_tok = lc.alpha / max(1, n_temperatures) * lc.token_share
    return tokenlaw.Alphas(ks=0.3 * a_tok, mean=0.25 * a_tok, outside=0.15 * a_tok, dispersion=0.1 * a_tok,
                           edge=0.1 * a_tok, serial=0.1 * a_tok)


def pooled_alphas(lc: Any) -> tokenlaw.PooledAlphas:
    """The pooled per-token tests' alphas: `pooled_share` of every temperature's alpha, summed over them (the
    whole verdict's alpha times the share): a quarter to the outside count, a quarter to the outside counts by
    truncation (a twelfth each to top-k, top-p, min-p), 0.35 to consecutive tokens, 0.15 to the draws at the
    law's cut (each temperature's edge test already has much power)."""
    a = lc.alpha * float(getattr(lc, "pooled_share", 0.0))
    return tokenlaw.PooledAlphas(outside=0.25 * a, edge=0.15 * a, serial=0.35 * a, cut=0.25 * a / len(tokenlaw.CUTS))


def token_verdict(cand: list[AnswerScore], base: list[AnswerScore], lc: Any, n_temperatures: int,
                  exact_cut: bool = False, reach: tuple[float, float] = (math.inf, 0.0)
                  ) -> tokenlaw.TokenVerdict | None:
    """The per-token test of one temperature's answers (validation/tokenlaw.py), with its power at this gate's
    size from the baseline's rows; None when an answer was scored without its sampling parameters."""
    if not cand or not base or any(a.tok_pit is None for a in cand + base):
        return None
    alphas = token_alphas(lc, n_temperatures)
    cp = [x for a in cand for x in a.tok_pit or ()]
    bp = [x for a in base for x in a.tok_pit or ()]
    if not cp or not bp:  # no drawn token known on a side (every answer scored on its text): nothing to place
        return None
    tv = tokenlaw.token_test(cp, bp, alphas, approximate=sum(a.approx_tokens for a in cand),
                             limit=lc.token_noise_limit, cand_excess=[e for a in cand for e in a.tok_excess],
                             exact_cut=exact_cut, cand_answers=[a.tok_pit or () for a in cand],
                             base_answers=[a.tok_pit or () for a in base],
                             cand_edge=sum((a.edge for a in cand), tokenlaw.EdgeCount()),
                             base_edge=sum((a.edge for a in base), tokenlaw.EdgeCount()),
                             cand_mid=[a.pit for a in cand if a.pit], base_mid=[a.pit for a in base if a.pit],
                             cand_cut=_cut_counts(cand), base_cut=_cut_counts(base),
                             cand_reach=[r for a in cand for r in a.tok_reach], reach_margin=reach[0],
                             baseline_reach=reach[1])
    tv.cut_reach_candidate, tv.cut_reach_baseline = _cut_reaches(cand), _cut_reaches(base)
    if lc.token_power_reps:
        tv.power = tokenlaw.power_statement([power_input(tv.as_dict(), base, alphas)], lc.token_power_target,
                                            lc.token_power_reps, lc.rng_seed)
    return tv


def reach_margin(lc: Any, base: list[AnswerScore]) -> tuple[float, float]:
    """(the margin past a threshold cut beyond which a candidate token refuses, the farthest the baseline's own
    tokens lie past one): `reach_floor` logits or `reach_factor` times that farthest, whichever is larger; inf
    when the profile turns the rule off (`threshold_reach`). The baseline's tokens were drawn by the target-only
    server's correct sampler, so how far they lie past a cut is the scorer's own numeric reach on this model."""
    farthest = max((r for a in base for r in a.tok_reach if r is not None), default=0.0)
    if not getattr(lc, "threshold_reach", False):
        return math.inf, farthest
    return max(float(lc.reach_floor), float(lc.reach_factor) * farthest), farthest


def _cut_reaches(answers: list[AnswerScore]) -> dict[str, list[float]]:
    """Per threshold cut (top_k, min_p): the reaches of the answers' tokens it leaves outside, sorted (logits)."""
    out: dict[str, list[float]] = {"top_k": [], "min_p": []}
    for a in answers:
        for k, m in a.tok_cut_reach:
            if k is not None:
                out["top_k"].append(round(k, 6))
            if m is not None:
                out["min_p"].append(round(m, 6))
    return {name: sorted(v) for name, v in out.items()}


def _cut_counts(answers: list[AnswerScore]) -> dict[str, list[int]]:
    """Per truncation (tokenlaw.CUTS): [the tokens of the answers whose requests turn it on, those outside it]."""
    return {name: [sum(a.cut_tokens[i] for a in answers), sum(a.cut_outside[i] for a in answers)]
            for i, name in enumerate(tokenlaw.CUTS)}


def power_input(tv: dict[str, Any], base: list[AnswerScore], alphas: tokenlaw.Alphas) -> tokenlaw.PowerInput:
    """One temperature's test as the power statement needs it: the wrong laws' draws over the baseline's tokens
    and the test's own sizes and allowances (`tv`: its TokenVerdict as a dict, as the verdict keeps it)."""
    draws = np.asarray([w for a in base for w in a.wrong or ()], dtype=np.float64)
    draws = draws.reshape(-1, draws.shape[1] if draws.ndim == 2 else tokenlaw.DRAW_COLUMNS)
    return tokenlaw.PowerInput(draws, tv["n_candidate"] + tv["outside_candidate"], tv["noise_allowance"],
                               tv["n_baseline"], tv["outside_baseline"], alphas, tv["mean_allowance"],
                               sum((a.edge for a in base), tokenlaw.EdgeCount()), _cut_counts(base))


def gate_token_power(sides: list[tuple[dict[str, Any] | None, list[AnswerScore]]], lc: Any) -> dict[str, Any] | None:
    """The power of the gate's per-token tests together: a sampler drawing a share of its tokens from a wrong law
    at every T>0 temperature is refused when any temperature's test refuses it (tokenlaw.power_statement over all
    of them). `sides`: per temperature, its per-token test (as the verdict keeps it; None: the temperature has
    none, and then there is no statement) and the baseline's scores."""
    if any(tv is None for tv, _ in sides):
        return None
    alphas = token_alphas(lc, len(sides))
    pooled = pooled_alphas(lc) if float(getattr(lc, "pooled_share", 0.0)) > 0 else None
    return tokenlaw.power_statement([power_input(tv, base, alphas) for tv, base in sides if tv is not None],
                                    lc.token_power_target, lc.token_power_reps, lc.rng_seed + 1, pooled=pooled)


def support_limit(lc: Any, n_tokens: int, top_p: float, a_support: float, vocab: int) -> tuple[float, float]:
    """(log eps, the false-fail bound N * V * eps / top_p) for N candidate tokens over a vocabulary of V."""
    log_eps = lc.support_log_eps
    if n_tokens > 0:
        log_eps = min(log_eps, math.log(a_support * top_p / (n_tokens * vocab)))
    return log_eps, n_tokens * vocab * math.exp(log_eps) / top_p


def _unvouched(piece: str) -> bool:
    """A token the text cannot vouch for: its piece holds U+FFFD, so the engine's bytes there were lost (a lone
    byte of a multi-byte character is shown as U+FFFD, and re-tokenizing the text scores the replacement
    character itself). Measured: every correct answer's token below -22 nats was one (docs/likelihood.md)."""
    return "\ufffd" in piece


def _impossible(answers: list[AnswerScore], log_eps: float) -> list[dict[str, Any]]:
    out = []
    for a in answers:
        if a.support_logprobs is None:
            continue
        for k, v in enumerate(a.support_logprobs):
            if v < log_eps and not (k < len(a.pieces) and _unvouched(a.pieces[k])):
                out.append({"answer": a.label, "position": k, "piece": a.pieces[k] if k < len(a.pieces) else "",
                            "log_p_T": v, "p_T": math.exp(v), "log_p_1": a.token_logprobs[k],
                            "context": a.text_at(k - 12, 12)[-60:]})
    return out


def _by_prompt(answers: list[AnswerScore], name: str) -> dict[str, np.ndarray]:
    g: dict[str, list[float]] = defaultdict(list)
    for a in answers:
        g[a.prompt_id].append(_stat(a, name))
    return {k: np.asarray(v) for k, v in g.items()}


def _decide(cand: list[AnswerScore], base: list[AnswerScore], lc: Any, log_eps: float, a_stat: float,
            permutations: int, normal: bool = False) -> tuple[bool, dict[str, Any], list[dict[str, Any]]]:
    """(pass, the statistics' tests, the impossible tokens). normal=True decides each statistic on the normal
    approximation of its permutation distribution (p = erfc(|z| / sqrt 2)) instead of the Monte Carlo count,
    which cannot go below 1 / (1 + permutations): the power estimate's few permutations would otherwise make
    every statistic unable to reject (as it was until 2026-12-04 at three T>0 temperatures)."""
    bad = _impossible(cand, log_eps)
    stats = {n: permutation_test(_by_prompt(cand, n), _by_prompt(base, n), permutations, lc.rng_seed,
                                 _PIT_SD_FLOOR if n in _PIT_STATS else lc.sd_floor)
             for n in _computable(cand + base)}
    if normal:
        ok = not bad and all(math.erfc(abs(s["z"]) / math.sqrt(2)) >= a_stat for s in stats.values())
    else:
        ok = not bad and all(s["p_value"] >= a_stat for s in stats.values())
    return ok, stats, bad


def likelihood_test(candidate: list[AnswerScore], baseline: list[AnswerScore], cfg: Any, n_temperatures: int,
                    variants: list[AnswerScore] | None = None, top_p: float | None = None,
                    exact_cut: bool = False, reach: tuple[float, float] = (math.inf, 0.0)) -> LikelihoodVerdict:
    """One temperature's verdict (every answer given must be at one T). cfg: a GateConfig (its likelihood and
    sampling.top_p) or a LikelihoodConfig with top_p given. variants: scored corruptions of the baseline's
    answers (make_variants) for the power estimate."""
    lc = getattr(cfg, "likelihood", cfg)
    if top_p is None:
        samp = getattr(cfg, "sampling", None)
        top_p = getattr(samp, "min_top_p", None) or getattr(samp, "top_p", None) or 1.0
    temps = {a.temperature for a in candidate} | {a.temperature for a in baseline}
    if len(temps) > 1:
        raise ValueError(f"likelihood_test takes one temperature's answers, got {sorted(temps)}")
    t = temps.pop() if temps else float("nan")
    per_token_on = bool(candidate) and bool(baseline) and all(a.tok_pit is not None for a in candidate + baseline)
    a_t, a_sup, a_stat = _alphas(lc, n_temperatures, per_token_on)
    unscored = [a for a in candidate if a.error or a.n_tokens == 0]
    cand = [a for a in candidate if not (a.error or a.n_tokens == 0)]
    base = [a for a in baseline if not (a.error or a.n_tokens == 0)]
    n_tok = sum(a.n_tokens for a in cand)
    vocab = max([a.vocab for a in cand], default=DEFAULT_VOCAB)
    log_eps, bound = support_limit(lc, n_tok, top_p, a_sup, vocab)
    method = (f"stratified two-sided permutation test ({lc.permutations} permutations, seed {lc.rng_seed}) of the "
              f"per-answer mean NLL, worst {lc.window}-token-window NLL and lag-1 autocorrelation of the "
              f"mid-PITs at T under the target model, by prompt; "
              f"alpha {lc.alpha:g} over {n_temperatures} T>0 temperatures -> {a_t:.3g} at T={t:g}: "
              f"{a_sup:.3g} to the support check (no token with log p_T < {log_eps:.2f}, false-fail bound "
              f"N*V*eps/top_p), {a_stat:.3g} to each statistic")
    sup: dict[str, Any] = {"log_eps": log_eps, "eps": math.exp(log_eps), "n_tokens": n_tok, "vocab": vocab,
                           "top_p": top_p,
                           "bound": bound, "alpha": a_sup, "exact": all(a.exact_support for a in cand),
                           "impossible": [], "min_log_p_T": None}
    sl = [min((v for k, v in enumerate(a.support_logprobs) if not (k < len(a.pieces) and _unvouched(a.pieces[k]))),
              default=0.0) for a in cand if a.support_logprobs]
    sup["unvouched_tokens"] = sum(1 for a in cand for p in a.pieces if _unvouched(p))
    sup["min_log_p_T"] = min(sl) if sl else None
    common = sorted({a.prompt_id for a in cand} & {a.prompt_id for a in base})
    v = LikelihoodVerdict(t, False, a_t, 1.0, len(cand), len(base), {"alpha_per_statistic": a_stat}, sup, {}, method)
    if unscored:
        v.reason = (f"{len(unscored)} candidate answer(s) could not be scored: "
                    + "; ".join(f"{a.label}: {a.error or 'no tokens'}" for a in unscored[:4]))
        v.evidence = [{"answer": a.label, "error": a.error or "no tokens"} for a in unscored]
        return v
    if len(cand) < lc.min_answers or len(base) < lc.min_answers or not common:
        v.reason = (f"{len(cand)} candidate and {len(base)} baseline answers scored at T={t:g} over "
                    f"{len(common)} shared prompts: fewer than likelihood.min_answers={lc.min_answers} per side "
                    "never pass")
        return v
    sizes = [(sum(1 for a in cand if a.prompt_id == p), sum(1 for a in base if a.prompt_id == p)) for p in common]
    floor = smallest_p(sizes, lc.permutations)
    if floor >= a_stat:  # what was scored cannot reject: a pass would be no verdict (the plan is checked at start)
        v.reason = (f"{len(cand)} candidate and {len(base)} baseline answers over {len(common)} prompts: the "
                    f"permutation test's smallest possible p is {floor:.3g}, not below {a_stat:.3g}; never passes")
        return v
    ok, stats, bad = _decide(cand, base, lc, log_eps, a_stat, lc.permutations)
    sup["impossible"] = bad
    v.statistic.update(stats)
    v.statistic["prompts"] = common
    v.statistic["prompts_not_shared"] = sorted(({a.prompt_id for a in cand} | {a.prompt_id for a in base})
                                               - set(common))
    v.p_value = min(s["p_value"] for s in stats.values())
    v.statistic["not_computed"] = [n for n in STATS if n not in stats]  # their alpha share stays unspent
    tv = token_verdict(cand, base, lc, n_temperatures, exact_cut, reach)
    if tv is not None:
        v.per_token = tv.as_dict()
        ok = ok and tv.ok
    v.ok = ok
    v.power = estimate_power(base, variants, lc, log_eps, a_stat, {p: sum(1 for a in cand if a.prompt_id == p)
                                                                   for p in common})
    if not ok:
        parts = []
        if bad:
            parts.append(f"{len(bad)} candidate token(s) with log p_T < {log_eps:.2f} (a correct sampler emits one "
                         f"with probability < {bound:.2g})")
        for n, s in stats.items():
            if s["p_value"] < a_stat:
                parts.append(f"{n} shifted by {s['z']:+.1f} sd (p={s['p_value']:.2g} < {a_stat:.2g})"
                             + (": successive tokens are not drawn independently" if n == "pit_lag1" else ""))
        if tv is not None and not tv.ok:
            parts.insert(0, f"per-token: {tv.reason}")
        v.reason = "; ".join(parts)
        v.evidence = _evidence(cand, stats, bad)
    else:
        v.reason = (f"no impossible token (min log p_T {sup['min_log_p_T']:.2f} >= {log_eps:.2f}); "
                    + ", ".join(f"{n} p={s['p_value']:.3g}" for n, s in stats.items())
                    + (f"; per-token: {tv.reason}" if tv is not None else ""))
    return v


def _evidence(cand: list[AnswerScore], stats: dict[str, Any], bad: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for a in cand:
        zs = {}
        for n in stats:
            st = stats[n]["strata"].get(a.prompt_id)
            if st:
                zs[n] = (_stat(a, n) - st["baseline_mean"]) / st["sd"]
        if not zs:
            continue
        w, at = a.worst_window()
        rows.append({"answer": a.label, "z": zs, "mean_nll": a.mean_nll, "worst_window_nll": w,
                     "worst_window_text": a.text_at(at, a.window)[:160], "key": max(abs(x) for x in zs.values())})
    rows.sort(key=lambda r: -r["key"])
    for r in rows:
        r.pop("key")
    # keys that are no secret's (the reports redact values under keys ending in "token")
    return [{"impossible": b} for b in bad[:12]] + rows[:6]


# ---------------------------------------------------------------------------- power


def make_variants(baseline: list[tuple[AnswerScore, list[dict[str, str]], str]], scorer: Scorer, lc: Any,
                  seed: int | None = None) -> list[AnswerScore]:
    """Corrupted variants of the baseline's own answers (one per family of lc.power_families, where the family
    can corrupt the text), scored by the same scorer at the answer's temperature. baseline: (its score, the
    prompt's messages, its text)."""
    from sglfleet.textscore.synth import corrupt

    rng = random.Random(lc.rng_seed if seed is None else seed)
    reqs = []
    for a, messages, text in baseline:
        for fam in lc.power_families:
            try:
                bad = corrupt(text, fam, rng)
            except ValueError:
                continue
            reqs.append(ScoreRequest(messages, bad, a.temperature, a.prompt_id, a.seed))
    return [s for s in score_all(scorer, reqs) if not s.error and s.n_tokens]


def estimate_power(base: list[AnswerScore], variants: list[AnswerScore] | None, lc: Any, log_eps: float,
                   a_stat: float, n_per_prompt: dict[str, int]) -> dict[str, Any]:
    """Monte Carlo rejection rate of the whole decision when a fraction r of the candidate's answers are
    corrupted: per prompt, n candidate answers drawn with replacement from the baseline's answers, each
    replaced with probability r by a corrupted variant (of that prompt), tested against the baseline."""
    if not variants or lc.power_reps == 0:
        return {"estimated": False, "why": "no scored corrupted variants" if lc.power_reps else "power_reps is 0"}
    rng = np.random.default_rng(lc.rng_seed + 1)
    bp: dict[str, list[AnswerScore]] = defaultdict(list)
    vp: dict[str, list[AnswerScore]] = defaultdict(list)
    for a in base:
        bp[a.prompt_id].append(a)
    for a in variants:
        vp[a.prompt_id].append(a)
    prompts = [p for p in n_per_prompt if bp.get(p)]
    rates = sorted(lc.power_rates)
    table = {}
    for r in [0.0, *rates]:
        rejected = 0
        for _ in range(lc.power_reps):
            cand = []
            for p in prompts:
                for _k in range(n_per_prompt[p]):
                    pool = vp[p] if vp.get(p) and rng.random() < r else bp[p]
                    cand.append(pool[int(rng.integers(len(pool)))])
            ok, _, _ = _decide(cand, base, lc.model_copy(update={"rng_seed": int(rng.integers(1 << 30))}),
                               log_eps, a_stat, lc.power_permutations, normal=True)
            rejected += not ok
        table[f"{r:g}"] = rejected / lc.power_reps
    hit = [r for r in rates if table[f"{r:g}"] >= lc.power_target]
    return {"estimated": True, "reps": lc.power_reps, "rejection_rate": table, "target": lc.power_target,
            "min_detectable_rate": hit[0] if hit else None, "families": list(lc.power_families),
            "n_variants": len(variants),
            "note": "candidate answers resampled from the baseline's own (rate 0 is the resampled null); each "
                    f"statistic decided on the normal approximation of {lc.power_permutations} permutations"}


# ---------------------------------------------------------------------------- the whole T>0 verdict


@dataclass(frozen=True)
class Answer:
    """One T>0 answer to score: what the gate sampled (candidate) or the baseline recorded."""

    prompt_id: str
    temperature: float
    seed: int | None
    text: str
    stopped: bool | None = None   # finish_reason == "stop"; None: unknown (a recorded baseline keeps texts only)
    ids: tuple[int, ...] | None = None  # the token ids the server sampled, where it said them
    params: SamplingParams | None = None  # the request's sampling parameters (the per-token test)


def likelihood_verdicts(candidate: list[Answer], baseline: list[Answer], scorer: Scorer, cfg: Any,
                        messages_of: Any, temperatures: list[float] | None = None,
                        on_score: Any = None, on_baseline: Any = None) -> list[LikelihoodVerdict]:
    """Every T>0 temperature's verdict: both sides scored by `scorer`, the baseline's corrupted variants made and
    scored for the power estimate, alpha split over the temperatures. messages_of(prompt_id) -> the prompt's
    chat messages. The end-of-turn token is scored only when every answer on both sides says whether it
    stopped (else on neither side: the two sides must be scored alike). The power estimate's variants are made
    of `likelihood.power_answers_per_prompt` baseline answers per prompt and temperature. on_score(score), if
    given, is called after every answer scored (progress)."""
    temps = sorted(temperatures or {a.temperature for a in candidate + baseline if a.temperature > 0})
    with_stop = all(a.stopped is not None for a in candidate + baseline)
    # the sampled ids where the server named them: a sampler may draw a non-canonical segmentation (" Or" "ter"
    # "ol" "le"), whose text re-tokenized holds a token it never drew (" Or" "terol" "le", log p -23.8: a false
    # "impossible token", H200 2026-12-03). Only when both sides have ids: one side scored on ids and the other
    # on text (a baseline recorded before ids were kept) would differ by that alone. Within that, an answer
    # without ids is scored on its text (llama.cpp names no ids for an answer holding a character drawn as
    # several tokens, an emoji): whether an answer has them depends on its content alone, alike on both sides
    # of a correct build, so the two sides stay exchangeable.
    with_ids = any(a.ids for a in candidate) and any(a.ids for a in baseline)

    def scored(rows: list[Answer]) -> list[AnswerScore]:
        # the per-token test needs every answer's parameters on both sides (a baseline recorded before they were
        # kept has none: the answer-level statistics judge alone then)
        with_params = all(a.params is not None for a in candidate + baseline)
        return score_all(scorer, [ScoreRequest(messages_of(a.prompt_id), a.text, a.temperature, a.prompt_id, a.seed,
                                               bool(with_stop and a.stopped), a.ids if with_ids else None,
                                               a.params if with_params else None)
                                  for a in rows], on_score)

    out = []
    sides = []
    for t in temps:  # every temperature scored first: the per-token test reads the baseline's tokens of all of them
        base_rows = [a for a in baseline if a.temperature == t]
        base = scored(base_rows)
        if on_baseline is not None:
            on_baseline(base)
        sides.append((t, base_rows, base, scored([a for a in candidate if a.temperature == t])))
    # the scorer is exact at the law's cut for this engine when none of the baseline's own drawn tokens, at any
    # temperature, lies outside its request's law (tokenlaw.token_test: then a candidate token clearly outside is
    # refused with zero tolerance)
    exact_cut = all(x is not None for _, _, base, _ in sides for a in base for x in (a.tok_pit or ()))
    lc = getattr(cfg, "likelihood", cfg)
    reach = reach_margin(lc, [a for _, _, base, _ in sides for a in base])
    for t, base_rows, base, cand in sides:
        variants = None
        if lc.power_reps:
            kept: dict[str, int] = defaultdict(int)
            chosen = []
            for sc, r in zip(base, base_rows, strict=True):
                if not sc.error and kept[r.prompt_id] < lc.power_answers_per_prompt:
                    kept[r.prompt_id] += 1
                    chosen.append((sc, messages_of(r.prompt_id), r.text))
            variants = make_variants(chosen, scorer, lc)
        v = likelihood_test(cand, base, cfg, n_temperatures=len(temps), variants=variants, exact_cut=exact_cut,
                            reach=reach)
        v.on_ids = {side: sum(1 for a in rows if with_ids and a.ids and a.temperature == t)
                    for side, rows in (("candidate", candidate), ("baseline", baseline))}
        out.append(v)
    lc = getattr(cfg, "likelihood", cfg)
    tests = [v.per_token for v in out]
    together = gate_token_power([(tv, base) for tv, (_, _, base, _) in zip(tests, sides, strict=True)], lc) if (
        len(sides) > 1 and lc.token_power_reps) else None
    for tv in tests if together is not None else ():
        tv["power"]["all_temperatures"] = together  # type: ignore[index]
    known = [tv for tv in tests if tv is not None]
    if getattr(lc, "pooled_share", 0.0) > 0 and known and len(known) == len(tests):
        pooled = tokenlaw.pooled_test(known, pooled_alphas(lc)).as_dict()
        for tv in known:
            tv["pooled"] = pooled
    return out


def answer_seed(seed: int, prompt_id: str, temperature: float) -> int:
    """The sampling seed to send for one (prompt, temperature) of a likelihood run: derived from the configured
    seed, the prompt and the temperature, so no two answers share a sampler stream.

    With one seed for every prompt, the answers of different prompts are not independent: llama.cpp (and any
    seeded sampler) draws the same uniforms for the same seed, so a seed whose draws land on likely tokens
    lowers the NLL of every prompt at once. Measured on 384 real answers of the embedded target
    (docs/likelihood.md): the per-seed mean over prompts varies 1.3-2x more than for independent answers,
    and the per-prompt permutation test then fails 6.5 % of correct gate runs instead of <= 1 %."""
    import hashlib

    h = hashlib.sha256(f"likelihood/{seed}/{prompt_id}/{temperature:g}".encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF


# ---------------------------------------------------------------------------- trusting the candidate as its own scorer


@dataclass
class ScorerTrust:
    """Whether a scorer reproduces the log-probs the target-only server gave the baseline's answers."""

    ok: bool
    scorer: str
    answers: int
    tokens: int
    median_abs: float | None
    p99_abs: float | None
    max_abs: float | None
    limits: dict[str, float]
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def check_trust(recorded: dict[str, list[float]], scored: list[AnswerScore], scorer_name: str, lc: Any
                ) -> ScorerTrust:
    """The scorer's log p_1 of the baseline's own answers against what the target-only server recorded for them:
    the median and 99th-percentile absolute differences within likelihood.trust_* (bf16 numerics differ between
    batch shapes; another model, another quantisation or a broken prefill differ by far more)."""
    limits = {"median_abs_nats": lc.trust_median_nats, "p99_abs_nats": lc.trust_p99_nats}
    diffs: list[float] = []
    n = 0
    missing = []
    for a in scored:
        want = recorded.get(score_key(a.prompt_id, a.temperature, a.seed))
        if want is None or a.error:
            missing.append(a.label)
            continue
        if len(want) != a.n_tokens:
            return ScorerTrust(False, scorer_name, n, len(diffs), None, None, None, limits,
                               f"{a.label}: {a.n_tokens} tokens scored, {len(want)} recorded: another tokenizer or "
                               "chat template than the baseline's")
        n += 1
        diffs += [abs(x - y) for x, y in zip(a.token_logprobs, want, strict=True)]
    if not diffs:
        return ScorerTrust(False, scorer_name, 0, 0, None, None, None, limits,
                           "no baseline answer with recorded scores was scored: nothing shows the scorer is the "
                           "target model" + (f" ({len(missing)} without)" if missing else ""))
    d = np.asarray(diffs)
    med, p99, mx = float(np.median(d)), float(np.quantile(d, 0.99)), float(d.max())
    ok = med <= lc.trust_median_nats and p99 <= lc.trust_p99_nats
    what = (f"{scorer_name} scored the baseline's {n} answers ({d.size} tokens) within |d log p| median {med:.4f}, "
            f"p99 {p99:.4f}, max {mx:.3f} nats of the target-only server's recorded log-probs")
    reason = what if ok else (what + f": beyond the limits (median {lc.trust_median_nats:g}, p99 "
                                      f"{lc.trust_p99_nats:g}): its target model is not the baseline's")
    return ScorerTrust(ok, scorer_name, n, int(d.size), med, p99, mx, limits, reason)
