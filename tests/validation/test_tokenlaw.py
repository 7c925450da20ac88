"""The per-token T>0 test (validation/tokenlaw.py): every sampled token placed in the law its request defines.

The laws here are drawn from random logits and sampled by an independent reference written in this file (each
engine's truncation order spelled out step by step over the sorted row), so the code under test and the
sampler share nothing but numpy. A correct sampler's PITs must be uniform under every order and parameter mix;
samplers that are wrong in the ways a speculative verify pass goes wrong (its law, its parameters, another
row's parameters, reused randomness is tested in test_likelihood_pit.py) must be refused at gate size."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sglfleet.validation.config import LikelihoodConfig, load_gate_config
from sglfleet.validation.likelihood import check_trust, gate_token_power, token_verdict
from sglfleet.validation.scorers import AnswerScore, per_token
from sglfleet.validation.tokenlaw import (
    CUT_MASK_COL,
    CUT_REACH,
    CUTS_ON_COL,
    DRAW_COLUMNS,
    FAMILIES,
    N_FAMILIES,
    ORDERS,
    Alphas,
    EdgeCount,
    PooledAlphas,
    PowerInput,
    SamplingParams,
    binomial_lower,
    binomial_sum_tail,
    binomial_upper,
    chi2_sf,
    cut_by,
    cut_counts_p,
    cut_reaches,
    dispersion,
    dispersion_inflation,
    edge_of,
    edge_p,
    ks_critical,
    ks_p,
    ks_uniform,
    law_of,
    order_of,
    pit,
    pooled_test,
    power_statement,
    row_from_logits,
    row_from_topk,
    serial,
    serial_p,
    threshold_reach,
    token_power,
    token_test,
    uniform_of,
    wrong_draws,
)

V = 200
PROFILES = Path(__file__).resolve().parents[2] / "src" / "sglfleet" / "validation" / "profiles"
A = Alphas(ks=5e-4, mean=3e-4, outside=2e-4)  # about the shipped profile's per-temperature shares
MIX = [SamplingParams(0.6, 0.9, 0, 0.0), SamplingParams(0.8, 1.0, 20, 0.05), SamplingParams(1.0, 0.95, 50, 0.02),
       SamplingParams(0.8), SamplingParams(0.6, 0.8, 20, 0.0)]


def reference_law(logits: np.ndarray, p: SamplingParams, order: str) -> np.ndarray:
    """The engine's law written out independently: sort, apply each step of the engine in order, renormalise."""
    lp = logits - logits.max()
    srt = np.lexsort((np.arange(lp.size), -lp))
    keep = np.ones(lp.size, bool)
    if order == "sglang":  # all cuts on p_T at once
        pt = np.exp(lp[srt] / p.temperature)
        pt /= pt.sum()
        before = np.cumsum(pt) - pt
        if p.top_k:
            keep &= np.arange(lp.size) < p.top_k
        keep &= before < p.top_p
        keep &= pt >= pt[0] * p.min_p
        keep[0] = True
    else:
        scale = 1.0
        for step in ORDERS[order]:
            if step == "temperature":
                scale = 1.0 / p.temperature
            elif step == "top_k" and p.top_k:
                keep &= np.arange(lp.size) < p.top_k
            elif step == "top_p" and p.top_p < 1:
                w = np.exp(lp[srt] * scale) * keep
                w /= w.sum()
                keep &= (np.cumsum(w) - w) < p.top_p
            elif step == "min_p" and p.min_p > 0:
                keep &= lp[srt] * scale >= lp[srt][0] * scale + math.log(p.min_p)
    q = np.zeros(lp.size)
    q[srt[keep]] = np.exp(lp[srt[keep]] / p.temperature)
    return q / q.sum()


def pits(order: str, n_pos: int, seed: int, draw_with: object = None, score_order: str | None = None
         ) -> list[float | None]:
    """n_pos positions of random logits, each sampled from `draw_with(logits, params)` (default: the correct law),
    scored under the request's own law in `score_order` (default: the engine's)."""
    rng = np.random.default_rng(seed)
    out: list[float | None] = []
    for k in range(n_pos):
        logits = rng.normal(0, 2.5, V)
        p = MIX[k % len(MIX)]
        q = draw_with(logits, p, k) if callable(draw_with) else reference_law(logits, p, order)
        tok = int(rng.choice(V, p=q))
        row = row_from_logits(logits, p.temperature)
        law = law_of(row, p, ORDERS[score_order or order])
        out.append(pit(law, int(np.flatnonzero(row.ids == tok)[0]), uniform_of(f"s{seed}/{k}")))
    return out


@pytest.mark.parametrize("order", list(ORDERS))
def test_a_correct_sampler_gives_uniform_pits_under_every_order(order: str) -> None:
    u = pits(order, 4000, 1)
    assert all(x is not None for x in u)  # never outside the law
    d = ks_uniform(np.asarray(u))
    assert ks_p(d, len(u)) > 1e-3, d


def test_the_orders_really_differ() -> None:
    """llama.cpp's top-p on p_1 after top-k and SGLang's joint cut on p_T are different laws: scoring one
    engine's draws under the other's order is refused (so the order must be the engine's)."""
    u = pits("llamacpp", 4000, 2, score_order="sglang")
    v = token_test(u, pits("sglang", 4000, 3), A)
    assert not v.ok


def wrong_temperature(logits: np.ndarray, p: SamplingParams, k: int) -> np.ndarray:
    return reference_law(logits, SamplingParams(1.0, p.top_p, p.top_k, p.min_p), "sglang")


def no_top_p(logits: np.ndarray, p: SamplingParams, k: int) -> np.ndarray:
    return reference_law(logits, SamplingParams(p.temperature, 1.0, p.top_k, p.min_p), "sglang")


def other_row(logits: np.ndarray, p: SamplingParams, k: int) -> np.ndarray:
    """A batch-row fault: the request's parameters are its neighbour's (the next entry of the mix)."""
    nb = MIX[(k + 1) % len(MIX)]
    return reference_law(logits, SamplingParams(nb.temperature, nb.top_p, nb.top_k, nb.min_p), "sglang")


def greedy_share(share: float) -> object:
    def f(logits: np.ndarray, p: SamplingParams, k: int) -> np.ndarray:
        q = reference_law(logits, p, "sglang")
        if (k * 7919) % 1000 < share * 1000:
            q = np.zeros_like(q)
            q[int(np.argmax(logits))] = 1.0
        return q
    return f


@pytest.mark.parametrize("fault", [wrong_temperature, no_top_p, other_row, greedy_share(0.1)],
                         ids=["wrong_temperature", "no_top_p", "other_row", "greedy_10pct"])
def test_wrong_samplers_are_refused_at_gate_size(fault: object) -> None:
    base = pits("sglang", 3000, 10)
    cand = pits("sglang", 3000, 11, draw_with=fault)
    v = token_test(cand, base, A)
    assert not v.ok, v.reason
    assert token_test(pits("sglang", 3000, 12), base, A).ok


def test_tokens_outside_the_law_are_counted_against_the_baselines() -> None:
    even = list(np.linspace(0.0005, 0.9995, 2000))
    base = [*even, None, None]
    assert token_test([*even, None, None, None], base, A).outside_p > 0.1
    v = token_test(even + [None] * 40, base, A)
    assert not v.ok and "outside the request's top-k/top-p/min-p" in v.reason


def test_the_scorers_own_deviation_is_measured_on_the_baseline_and_allowed_up_to_its_limit() -> None:
    rng = np.random.default_rng(5)
    bent = rng.random(6000) ** 1.08  # a scorer whose law is slightly off the engine's
    v = token_test(list(rng.random(6000) ** 1.08), list(bent), A)
    assert v.noise_allowance > 0 and v.mean_allowance > 0 and v.ok, v.reason  # the candidate deviates as it does
    far = list(rng.random(6000) ** 2.0)
    v = token_test(far, far, A, limit=0.05)
    assert not v.ok and "does not reproduce the engine's law" in v.reason
    v = token_test(list(rng.random(6000)), list(rng.random(6000)), A)
    assert v.noise_allowance == 0.0 and v.ok


def test_ks_pieces_against_known_values() -> None:
    assert ks_p(0.0, 100) == 1.0
    assert abs(ks_p(ks_critical(1000, 0.01), 1000) - 0.01) < 1e-3
    assert abs(ks_critical(10_000, 0.05) * math.sqrt(10_000) - 1.358) < 0.01  # the classic 1.36 / sqrt(n)
    assert abs(binomial_upper(3, 10, 0.5) - 0.9453125) < 1e-9
    assert binomial_upper(0, 10, 0.1) == 1.0


def test_a_servers_top_k_row_gives_the_exact_law_where_the_nucleus_fits() -> None:
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 3, V)
    full = row_from_logits(logits, 1.0)
    p = SamplingParams(1.0, 0.9, 0, 0.0)
    top = list(zip(full.lp[1:64].tolist(), full.ids[1:64].tolist(), strict=True))
    part = row_from_topk(float(full.lp[0]), int(full.ids[0]), top, 1.0)
    a, b = law_of(full, p, ORDERS["sglang"]), law_of(part, p, ORDERS["sglang"])
    assert a.n == b.n and np.allclose(a.q / a.total, b.q / b.total)
    # at T < 1 the tail's share is estimated: the law is flagged approximate, and close
    p6 = SamplingParams(0.6, 0.9)
    full6 = row_from_logits(logits, 0.6)
    part6 = row_from_topk(float(full.lp[0]), int(full.ids[0]), top, 0.6)
    c, d = law_of(full6, p6, ORDERS["sglang"]), law_of(part6, p6, ORDERS["sglang"])
    assert d.approximate and c.n == d.n and np.allclose(c.q / c.total, d.q / d.total, atol=1e-3)


def test_the_power_statement_finds_a_small_greedy_share_at_gate_size() -> None:
    rng = np.random.default_rng(9)
    draws = []
    for k in range(2000):
        logits = rng.normal(0, 2.5, V)
        p = MIX[k % len(MIX)]
        row = row_from_logits(logits, p.temperature)
        law = law_of(row, p, ORDERS["sglang"])
        draws.append(wrong_draws(row, law, p, ORDERS["sglang"], rng))
    d = np.asarray(draws)
    e = d[:, -1]
    cut = ~np.isnan(e)  # the baseline's 6,000 tokens at these positions draw the token at the cut as often as expected
    base_edge = EdgeCount(round(3 * float(e[cut].sum())), 3 * float(e[cut].sum()), 3 * int(cut.sum()))
    a = Alphas(ks=5e-4, mean=3e-4, outside=2e-4, edge=1e-4)
    pw = token_power(d, 6000, 0.0, 6000, 0, a, 0.9, 60, 1, base_edge=base_edge)
    fam = pw["families"]
    assert set(fam) == set(FAMILIES) and pw["estimated"]
    # a support one token short is refused through the draws at the cut, and only through them
    assert fam["cut_short"]["min_rate"] is not None and fam["cut_short"]["min_rate"] <= 0.5
    assert token_power(d, 6000, 0.0, 6000, 0, A, 0.9, 20, 1)["families"]["cut_short"]["min_rate"] is None
    assert fam["greedy"]["min_rate"] is not None and fam["greedy"]["min_rate"] <= 0.1
    assert fam["greedy"]["rejection_rate"]["0.001"] < 0.5  # tiny shares are not claimed
    # the bisection brackets the share: every tried share at or above it is refused at the target, none below it
    tried = {float(r): got for r, got in fam["greedy"]["rejection_rate"].items()}
    assert all(got >= 0.9 for r, got in tried.items() if r >= fam["greedy"]["min_rate"] * (1 + 1e-9))
    assert any(got < 0.9 and r > fam["greedy"]["min_rate"] / 1.1 for r, got in tried.items())
    # the deviation in total-variation units: each family's distance from the law, and what the share makes of it
    for f in FAMILIES:
        assert 0 < fam[f]["mean_tv_of_law"] <= 1
    assert abs(fam["greedy"]["min_mean_tv"] - fam["greedy"]["min_rate"] * fam["greedy"]["mean_tv_of_law"]) < 1e-12
    # a family not refused even at r = 1 counts with its whole distance (here: top-k lost, a tiny deviation)
    assert pw["min_mean_tv_all_families"] == max(
        fam[f]["mean_tv_of_law"] if f in pw["unrefused_families"] else fam[f]["min_mean_tv"] for f in FAMILIES)


def test_order_of_reads_a_llamacpp_chain_and_refuses_nonsense() -> None:
    chain = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
    assert order_of(chain) == ORDERS["llamacpp"]
    with pytest.raises(ValueError, match="no temperature"):
        order_of(["top_k", "top_p"])
    with pytest.raises(ValueError, match="unknown sampler order"):
        order_of("vllm")
    with pytest.raises(ValueError):
        SamplingParams(0.0)
    assert SamplingParams(0.8, top_k=0).request_fields("sglang")["top_k"] == -1
    assert SamplingParams(0.8, top_k=0).request_fields("llamacpp")["top_k"] == 0


def _scored(pid: str, seed: int, lps: list[float], tok: list[float | None] | None = None) -> AnswerScore:
    wrong = tuple((0.1, 0.2, 0.3, 0.4, 0.5, 0.3, 0.2, 0.4) for _ in lps) if tok is not None else None
    return AnswerScore(pid, 0.8, seed, tuple(lps), tuple(lps), tuple("x" for _ in lps), 16,
                       tok_pit=tuple(tok) if tok is not None else None, wrong=wrong)


def test_the_verdict_carries_the_per_token_test_and_its_power() -> None:
    rng = np.random.default_rng(3)
    lc = LikelihoodConfig(token_power_reps=20)
    cand = [_scored("p", s, list(-rng.random(300)), list(rng.random(300))) for s in range(4)]
    base = [_scored("p", 100 + s, list(-rng.random(300)), list(rng.random(300))) for s in range(4)]
    v = token_verdict(cand, base, lc, 3)
    assert v is not None and v.ok and v.n_candidate == 1200 and v.power["estimated"]
    sharp = [_scored("p", s, list(-rng.random(300)), list(rng.random(300) ** 1.6)) for s in range(4)]
    v = token_verdict(sharp, base, lc, 3)
    assert v is not None and not v.ok and "not distributed as the target's law" in v.reason
    assert token_verdict([_scored("p", 1, [-0.1])], base, lc, 3) is None  # no parameters: not run


def test_the_candidate_is_trusted_as_scorer_only_when_it_reproduces_the_baselines_scores() -> None:
    lc = LikelihoodConfig()
    rec = {"p@T0.8/seed1": [-0.5, -1.25, -0.01], "q@T0.8/seed2": [-2.0, -0.3]}
    same = [_scored("p", 1, [-0.51, -1.25, -0.01]), _scored("q", 2, [-2.0, -0.31])]
    t = check_trust(rec, same, "sglang", lc)
    assert t.ok and t.tokens == 5, t.reason
    other = [_scored("p", 1, [-0.9, -0.8, -0.4]), _scored("q", 2, [-1.2, -0.9])]
    t = check_trust(rec, other, "sglang", lc)
    assert not t.ok and "not the baseline's" in t.reason
    t = check_trust(rec, [_scored("p", 1, [-0.5, -1.25])], "sglang", lc)
    assert not t.ok and "another tokenizer" in t.reason
    assert not check_trust(rec, [_scored("r", 3, [-0.5])], "sglang", lc).ok  # nothing recorded to compare


def test_the_sglang_scorers_rows_place_tokens_as_the_full_row_does() -> None:
    """The SGLang scorer builds each position's law from the server's top-k rows (log p_1, id) and the sampled
    token's own log p_1: where the nucleus fits in the listed candidates its PITs are the full row's."""
    from sglfleet.validation.scorers import SGLangScorer

    rng = np.random.default_rng(11)
    sc = SGLangScorer("http://127.0.0.1:9", 64, 16, 5.0)
    p = SamplingParams(1.0, 0.9, 0, 0.0)
    lp, alts, toks, want = [], [], [], []
    for k in range(40):
        full = row_from_logits(rng.normal(0, 3, V), 1.0)
        tok = int(full.ids[k % 5])
        lp.append(float(full.lp[k % 5]))
        alts.append(list(zip(full.lp[:64].tolist(), full.ids[:64].tolist(), strict=True)))
        toks.append(tok)
        want.append(pit(law_of(full, p, ORDERS["sglang"]), k % 5, uniform_of(f"q@T1/seed7/{k}")))
    got = sc._per_token("q", 1.0, 7, lp, alts, toks, p, tuple(toks))
    assert sc._per_token("q", 1.0, 7, lp, alts, toks, p)["tok_pit"] == ()  # scored on text: no drawn token known
    sc.close()
    assert np.allclose([x if x is not None else -1 for x in got["tok_pit"]],
                       [x if x is not None else -1 for x in want])


def test_the_mean_refuses_a_small_location_shift() -> None:
    """A sampler a little too sharp (u ~ U^1.04: 2% lower mean) over 6,000 tokens: the mean refuses it."""
    rng = np.random.default_rng(21)
    v = token_test(list(rng.random(6000) ** 1.04 * 0.98), list(rng.random(6000)), A)
    assert not v.ok and v.mean_p < A.mean and "mean u" in v.reason


def test_a_correct_candidate_is_refused_at_about_alpha() -> None:
    """400 null gates of 1,500 tokens (and a baseline of as many) at alphas summing to 0.03: about 12 refusals."""
    rng = np.random.default_rng(8)
    a = Alphas(ks=0.015, mean=0.009, outside=0.006)
    fails = sum(not token_test(list(rng.random(1500)), list(rng.random(1500)), a).ok for _ in range(400))
    assert fails <= 24, fails


def test_the_wrong_laws_distances_are_total_variation() -> None:
    """Greedy is 1 - q_0; dropping a top-p cut is the cut mass; a law equal to the correct one is 0."""
    rng = np.random.default_rng(4)
    logits = rng.normal(0, 2.5, V)
    row = row_from_logits(logits, 0.8)
    p = SamplingParams(0.8, 0.9)
    law = law_of(row, p, ORDERS["sglang"])
    q = reference_law(logits, p, "sglang")
    full = reference_law(logits, SamplingParams(0.8), "sglang")
    tv = wrong_draws(row, law, p, ORDERS["sglang"], rng)[len(FAMILIES):]
    assert abs(tv[0] - (1 - q.max())) < 1e-9
    assert abs(tv[1] - 0.5 * np.abs(full - q).sum()) < 1e-9
    plain = SamplingParams(1.0)
    row1 = row_from_logits(logits, 1.0)
    tv1 = wrong_draws(row1, law_of(row1, plain, ORDERS["sglang"]), plain, ORDERS["sglang"], rng)[len(FAMILIES):]
    assert tv1[1] < 1e-9 and tv1[2] < 1e-9  # untruncated and T=1 are the law itself here


def test_a_token_far_past_the_cut_is_refused_and_one_at_the_edge_is_not() -> None:
    """outside_excess: 0 for the first token past the law's cut (scorer noise can flip it), the cut-off mass
    between for a token deeper in the tail; one clearly outside token fails the test whatever the statistics."""
    from sglfleet.validation.tokenlaw import outside_excess

    rng = np.random.default_rng(12)
    logits = rng.normal(0, 2.5, V)
    row = row_from_logits(logits, 0.8)
    law = law_of(row, SamplingParams(0.8, 0.5), ORDERS["sglang"])
    assert outside_excess(row, law, law.n, 0.8) == 0.0
    deep = outside_excess(row, law, law.n + 10, 0.8)
    pt = np.exp(row.lp / 0.8 - row.log_z)
    assert abs(deep - pt[law.n:law.n + 10].sum()) < 1e-12 and deep > 0.01
    even = list(np.linspace(0.0005, 0.9995, 2000))
    v = token_test([*even, None], even, A, cand_excess=[deep], exact_cut=True)
    assert not v.ok and v.clearly_outside == 1 and "clearly outside" in v.reason
    v = token_test([*even, None], even, A, cand_excess=[0.002], exact_cut=True)
    assert v.ok and v.clearly_outside == 0
    # a scorer that is not exact at the cut for this engine (the baseline's own tokens lie outside it somewhere):
    # no zero tolerance, the outside count's binomial test alone
    v = token_test([*even, None], [*even, None], A, cand_excess=[deep], exact_cut=False)
    assert v.ok and v.clearly_outside == 0


def test_only_tokens_the_server_said_it_drew_are_placed_in_the_law() -> None:
    """An end-of-turn token the scorer appends after an answer that stopped is no observed draw (llama.cpp may have
    ended on another end-of-generation token: on 2026-12-04 an appended <|im_end|> lay 0.029 of p_T past a min-p
    cut and failed a correct build); an answer scored on its re-tokenized text has no observed draws at all."""
    from sglfleet.validation.scorers import drawn_count

    assert drawn_count((5, 6, 7), [5, 6, 7, 2]) == 3  # the appended end of turn is left out
    assert drawn_count((5, 6, 2), [5, 6, 2]) == 3  # the server named its end token: a draw
    assert drawn_count(None, [5, 6, 7, 2]) == 0


def _draws(rng: np.random.Generator, params: list[SamplingParams], n: int) -> np.ndarray:
    out = []
    for k in range(n):
        p = params[k % len(params)]
        row = row_from_logits(rng.normal(0, 2.5, V), p.temperature)
        out.append(wrong_draws(row, law_of(row, p, ORDERS["sglang"]), p, ORDERS["sglang"], rng))
    return np.asarray(out)


def test_a_family_that_is_the_law_itself_is_no_deviation_and_an_unrefusable_one_bounds_the_statement() -> None:
    """At T=1 with no truncation every family but greedy and flat IS the law (untruncated, kept at T=1): no
    deviation, left out of the statement. A family refused at no share leaves its whole distance unrefused."""
    rng = np.random.default_rng(4)
    pw = token_power(_draws(rng, [SamplingParams(1.0)], 1500), 3000, 0.0, 3000, 0, A, 0.9, 40, 2)
    fam = pw["families"]
    assert fam["untruncated"]["no_deviation"] and fam["kept_at_t1"]["no_deviation"]
    assert fam["untruncated"]["min_rate"] is None and "untruncated" not in pw["unrefused_families"]
    assert pw["min_mean_tv_all_families"] == max(fam[f]["min_mean_tv"] for f in ("greedy", "flat"))
    # 3 tokens: not even all of them greedy is refused; the statement is then the family's whole distance
    small = token_power(_draws(rng, [SamplingParams(1.0)], 300), 3, 0.0, 30, 0, A, 0.9, 40, 2)
    assert "greedy" in small["unrefused_families"] and small["min_rate_all_families"] is None
    assert small["min_mean_tv_all_families"] >= small["families"]["greedy"]["mean_tv_of_law"]


def test_tests_of_several_temperatures_together_refuse_a_smaller_share_than_each_alone() -> None:
    rng = np.random.default_rng(5)
    xs = [PowerInput(_draws(rng, [SamplingParams(t, top_p=0.95)], 1200), 1500, 0.0, 3000, 0, A)
          for t in (0.6, 0.8, 1.0)]
    alone = [power_statement([x], 0.9, 60, 3) for x in xs]
    together = power_statement(xs, 0.9, 60, 3)
    assert together["n_tokens"] == 4500
    for f in ("greedy", "flat"):
        assert together["families"][f]["min_rate"] < min(a["families"][f]["min_rate"] for a in alone)


def test_the_gate_states_its_power_for_every_temperature_together() -> None:
    """gate_token_power: the per-token tests of three temperatures' answers as one statement, on the gate's own
    token counts; a temperature without per-token scores leaves no statement."""
    rng = np.random.default_rng(8)
    lc = LikelihoodConfig(token_power_reps=30)

    def side(n: int, base: int) -> list[AnswerScore]:
        out = []
        for s in range(n):
            sc = _scored("p", base + s, list(-rng.random(200)), list(rng.random(200)))
            out.append(AnswerScore(**{**sc.__dict__, "wrong": tuple(
                (float(rng.random()) * 0.3, float(rng.random()), float(rng.random()), 0.5 + 0.5 * float(rng.random()),
                 0.4, 0.02, 0.1, 0.5) for _ in range(200))}))
        return out

    sides = [(side(3, 0), side(6, 100)) for _ in range(3)]
    tests = [token_verdict(c, b, lc.model_copy(update={"token_power_reps": 0}), 3) for c, b in sides]
    st = gate_token_power([(tv.as_dict() if tv else None, b) for tv, (_, b) in zip(tests, sides, strict=True)], lc)
    assert st is not None and st["estimated"] and st["n_tokens"] == 3 * 600
    alone = token_verdict(sides[0][0], sides[0][1], lc, 3)
    assert alone is not None
    assert st["families"]["greedy"]["min_rate"] < alone.power["families"]["greedy"]["min_rate"]
    bare = [(c, [AnswerScore(**{**b.__dict__, "tok_pit": None}) for b in base]) for c, base in sides]
    none = [token_verdict(c, b, lc, 3) for c, b in bare]
    assert gate_token_power([(tv.as_dict() if tv else None, b) for tv, (_, b) in zip(none, bare, strict=True)],
                            lc) is None


# ---------------------------------------------------------------------------- the answers' dispersion


def _answers(rng: np.random.Generator, n: int, draw) -> list[list[float]]:
    """n answers of 2..90 tokens each, each answer's u from draw(rng, size)."""
    return [list(draw(rng, int(rng.integers(2, 91)))) for _ in range(n)]


def test_chi2_sf_matches_the_tables_and_a_simulation() -> None:
    for x, k, want in [(3.841, 1, 0.05), (6.635, 1, 0.01), (18.307, 10, 0.05), (37.566, 20, 0.01),
                       (124.342, 100, 0.05), (0.0158, 1, 0.9)]:
        assert chi2_sf(x, k) == pytest.approx(want, rel=2e-3)
    z = np.random.default_rng(4).standard_normal((200_000, 7))
    assert chi2_sf(16.0, 7) == pytest.approx(float(((z ** 2).sum(axis=1) > 16.0).mean()), abs=1e-3)
    assert chi2_sf(0.0, 5) == 1.0 and chi2_sf(1e4, 5) == 0.0


def test_the_dispersion_test_is_conservative_under_independent_draws() -> None:
    """2,000 null gates of 40 answers of 2..90 independent uniforms: refused at alpha 0.01 about that often, never
    more (each term is lighter-tailed than its chi-square)."""
    rng = np.random.default_rng(12)
    ps = []
    for _ in range(2000):
        d, k = dispersion([rng.random(int(n)) for n in rng.integers(2, 91, size=40)])
        ps.append(chi2_sf(d, k))
    rate = float(np.mean(np.asarray(ps) < 0.01))
    assert 0.003 <= rate <= 0.013, rate


def test_dispersion_refuses_draws_that_share_their_randomness_within_an_answer() -> None:
    """Each answer's draws replay a few random numbers (a random state restored every step): every u is
    uniform, the answers' means stray and the dispersion refuses."""
    rng = np.random.default_rng(5)

    def replayed(r: np.random.Generator, n: int) -> np.ndarray:
        fixed = r.random(3)  # the step's replayed uniforms
        return (fixed[r.integers(0, 3, size=n)] + r.normal(0, 0.05, size=n)) % 1.0  # each u still uniform

    cand = _answers(rng, 48, replayed)
    base = _answers(rng, 96, lambda r, n: r.random(n))
    flat_c, flat_b = [x for g in cand for x in g], [x for g in base for x in g]
    a = Alphas(ks=4e-4, mean=3e-4, outside=1.5e-4, dispersion=1.5e-4)
    v = token_test(flat_c, flat_b, a, cand_answers=cand, base_answers=base)
    assert not v.ok and v.dispersion_p < 1e-20 and "not independent" in v.reason
    assert v.answers == 48 and v.dispersion is not None and v.dispersion > 3


def test_dispersion_refuses_a_law_wrong_per_request_in_opposite_directions() -> None:
    """Half the requests sample too sharp (another row's lower temperature), half too flat: pooled, the tokens
    look uniform; per answer they do not."""
    rng = np.random.default_rng(9)
    cand = [list(rng.random(60) ** (1.25 if i % 2 else 0.8)) for i in range(40)]
    base = _answers(rng, 80, lambda r, n: r.random(n))
    a = Alphas(ks=4e-4, mean=3e-4, outside=1.5e-4, dispersion=1.5e-4)
    v = token_test([x for g in cand for x in g], [x for g in base for x in g], a, cand_answers=cand,
                   base_answers=base)
    assert not v.ok and v.dispersion_p < a.dispersion and "not independent" in v.reason
    assert v.mean_p > a.mean and v.ks_p > a.ks  # pooled, the tokens pass
    # the same tokens as one stream (no grouping), or without a dispersion alpha: they pass
    flat_c, flat_b = [x for g in cand for x in g], [x for g in base for x in g]
    assert token_test(flat_c, flat_b, a).ok and token_test(flat_c, flat_b, A, cand_answers=cand).ok


def test_dispersion_allows_the_scorers_own_inflation_measured_on_the_baseline() -> None:
    """A scorer whose numbers differ from the engine's per answer (each answer's u bent by a per-answer power)
    inflates the baseline's dispersion as much as the candidate's: the allowance takes it out; a correct
    candidate passes and the inflation is reported."""
    rng = np.random.default_rng(3)

    def nudged(r: np.random.Generator, n: int) -> np.ndarray:
        return r.random(n) ** math.exp(r.normal(0, 0.15))  # a per-answer sharpness the scorer adds

    cand, base = _answers(rng, 48, nudged), _answers(rng, 200, nudged)
    a = Alphas(ks=4e-4, mean=3e-4, outside=1.5e-4, dispersion=1.5e-4)
    v = token_test([x for g in cand for x in g], [x for g in base for x in g], a, cand_answers=cand,
                   base_answers=base)
    assert v.ok and v.dispersion_inflation > 1.0, v.reason
    assert dispersion_inflation(*dispersion([rng.random(40) for _ in range(100)])) == 1.0


def cut_short(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The correct law with its least likely kept token cut away (top-p / top-k / min-p placed one token short)."""
    q = reference_law(logits, p, "sglang")
    kept = np.flatnonzero(q)
    if kept.size > 1:
        q[kept[np.argmin(q[kept])]] = 0.0
    return q / q.sum()


def cut_on_sharper_law(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The cut placed on the law at 0.8 of the request's temperature (a sharper law: a smaller nucleus, a higher
    min-p bar), the tokens drawn from p_T over what it keeps: the support shrinks by a varying number of tokens."""
    sharp = reference_law(logits, SamplingParams(0.8 * p.temperature, p.top_p, p.top_k, p.min_p), "sglang")
    q = reference_law(logits, SamplingParams(p.temperature), "sglang") * (sharp > 0)
    return q / q.sum()


def edge_run(n_pos: int, seed: int, law: object = None) -> tuple[list[float | None], EdgeCount]:
    """n_pos positions of random logits under MIX's parameters, SGLang's order, each token drawn from the correct
    law or from `law(logits, params)`, placed in the correct law by scorers.per_token: the PITs and the draws at
    the law's cut."""
    rng = np.random.default_rng(seed)
    by_params: dict[int, tuple[list, list[int]]] = {}
    for k in range(n_pos):
        logits = rng.normal(0, 2.5, V)
        j = k % len(MIX)
        q = law(logits, MIX[j]) if callable(law) else reference_law(logits, MIX[j], "sglang")
        rows, seq = by_params.setdefault(j, ([], []))
        rows.append(row_from_logits(logits, MIX[j].temperature))
        seq.append(int(rng.choice(V, p=q)))
    u: list[float | None] = []
    edge = EdgeCount()
    for j, (rows, seq) in by_params.items():
        got = per_token(f"e{seed}/{j}", MIX[j].temperature, rows, seq, MIX[j], ORDERS["sglang"])
        u += list(got["tok_pit"])
        edge = edge + got["edge"]
    return u, edge


def test_the_edge_is_the_least_likely_kept_token_where_the_law_is_cut_inside_the_row() -> None:
    rng = np.random.default_rng(5)
    row = row_from_logits(rng.normal(0, 2.5, V), 0.8)
    law = law_of(row, SamplingParams(0.8, 1.0, 20), ORDERS["sglang"])
    assert law.n == 20 and edge_of(row, law) == pytest.approx(float(law.q[19]) / law.total)
    assert edge_of(row, law_of(row, SamplingParams(0.8), ORDERS["sglang"])) is None  # no cut
    assert edge_of(row, law_of(row, SamplingParams(0.8, 1.0, 1), ORDERS["sglang"])) is None  # one token kept
    top = row_from_topk(float(row.lp[0]), int(row.ids[0]), zip(row.lp[:5], row.ids[:5], strict=True), 0.8)
    assert edge_of(top, law_of(top, SamplingParams(0.8, 1.0, 20), ORDERS["sglang"])) is None  # cut past the listing


def test_a_correct_sampler_draws_the_token_at_the_cut_as_often_as_the_law_says() -> None:
    for seed in (11, 12, 13):
        u, ce = edge_run(1200, seed)
        _, be = edge_run(2400, seed + 100)
        assert ce.positions > 700 and ce.expected > 10, ce
        assert abs(ce.drawn - ce.expected) < 4 * math.sqrt(ce.expected), ce
        assert edge_p(ce, be) > 1e-3
        v = token_test(u, edge_run(2400, seed + 100)[0], Alphas(ks=4e-4, mean=3e-4, outside=1.5e-4, edge=1e-4),
                       cand_edge=ce, base_edge=be)
        assert v.ok and v.edge_positions == ce.positions, v.reason


@pytest.mark.parametrize(("law", "n"), [(cut_short, 1200), (cut_on_sharper_law, 3000)])
def test_a_support_cut_short_of_the_requests_cut_is_refused_at_the_cut(law: object, n: int) -> None:
    """The class: the sampler's support ends short of the request's cut (top-p, top-k or min-p placed a token or
    more too far in, or on another law). The draws' PITs shift only near 1, where KS and the mean see little; the
    token at the cut is never drawn. (The sharper law's cut moves only where top-p or min-p decides it, not top-k:
    a weaker fault, refused at a larger size.)"""
    u, ce = edge_run(n, 21, law)
    bu, be = edge_run(2400, 121)
    assert ce.drawn < ce.expected / 2 and ce.expected > 10, ce
    v = token_test(u, bu, Alphas(ks=4e-4, mean=3e-4, outside=1.5e-4, edge=1e-4), cand_edge=ce, base_edge=be)
    assert not v.ok and v.edge_p < 1e-4 and "the law's cut" in v.reason, v.reason


def test_the_edge_test_allows_a_scorer_that_misplaces_the_cut_alike_on_both_sides() -> None:
    """The scorer's cut and the engine's can differ by its numerics: both sides then draw the scorer's cut token
    less often than it expects, and the comparison with the baseline cancels that."""
    ce, be = EdgeCount(6, 20.0, 900), EdgeCount(13, 40.0, 1800)
    assert edge_p(ce, be) > 0.3
    assert edge_p(EdgeCount(0, 20.0, 900), EdgeCount(0, 40.0, 1800)) == 1.0  # nothing drawn on either side
    assert binomial_lower(0, 40, 1 / 3) == pytest.approx((2 / 3) ** 40)


def test_the_edge_test_is_conservative_when_the_sampler_is_correct() -> None:
    """2,000 null gates: the cut token's probability differs per position (0.5 where two tokens are kept), each
    side's draws are Bernoulli; the conditional test refuses at most at alpha (Bernoulli counts vary less than the
    Poisson counts it assumes)."""
    rng = np.random.default_rng(31)
    ps = []
    for _ in range(2000):
        pc, pb = rng.uniform(0.002, 0.5, 300) ** 2 * 2, rng.uniform(0.002, 0.5, 600) ** 2 * 2
        ce = EdgeCount(int((rng.random(pc.size) < pc).sum()), float(pc.sum()), pc.size)
        be = EdgeCount(int((rng.random(pb.size) < pb).sum()), float(pb.sum()), pb.size)
        ps.append(edge_p(ce, be))
    ps_ = np.asarray(ps)
    for alpha in (0.01, 0.05, 0.2):
        assert (ps_ < alpha).mean() <= alpha * 1.2 + 0.005, (alpha, (ps_ < alpha).mean())
    assert (ps_ < 0.2).mean() > 0.05  # not a test that never refuses


def serial_answers(n_answers: int, length: int, seed: int, shared: bool = False, two_token_steps: float = 1 / 3
                   ) -> list[list[float]]:
    """Answers of random-logit positions at T 0.8, each token drawn by inverse CDF in vocabulary order (as
    torch.multinomial and FlashInfer draw), placed by its vocabulary-order mid-PIT (scorers.pit_of_row). With
    `shared`, the tokens of one verify step (two with probability `two_token_steps`, else one) share their
    uniform, as the DDTree worker's step_shared_random test fault draws."""
    from sglfleet.validation.scorers import pit_of_row

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_answers):
        mids: list[float] = []
        v, left = 0.0, 0
        for _ in range(length):
            if left == 0 or not shared:
                v, left = float(rng.random()), (2 if rng.random() < two_token_steps else 1)
            left -= 1
            q = np.exp(rng.normal(0, 2.5, V) / 0.8)
            q /= q.sum()
            tok = int(min(np.searchsorted(np.cumsum(q), v * q.sum(), side="right"), V - 1))
            mids.append(pit_of_row(dict(enumerate(np.log(q).tolist())), tok))
            if not shared:
                v = float(rng.random())
        out.append(mids)
    return out


def test_the_serial_test_holds_its_alpha_under_independent_draws() -> None:
    ps = []
    for seed in range(300):
        c, b = serial_answers(8, 25, 1000 + seed), serial_answers(16, 25, 5000 + seed)
        ps.append(serial_p(serial(c), serial(b))[1])
    ps_ = np.asarray(ps)
    assert (ps_ < 0.05).mean() <= 0.08 and (ps_ < 0.2).mean() > 0.08, (ps_ < 0.05).mean()


def test_the_serial_test_refuses_a_uniform_shared_by_the_tokens_of_a_step() -> None:
    """One step in three emits two tokens (the served accept length of the H100 run, 2026-12-05), and those two
    share their uniform: their tokens' laws are exact, so KS, the mean and the answers' dispersion see nothing."""
    c, b = serial_answers(60, 30, 77, shared=True), serial_answers(120, 30, 78)
    z, p = serial_p(serial(c), serial(b))
    assert z > 4 and p < 1e-4, (z, p)
    cu, bu = [x for g in c for x in g], [x for g in b for x in g]
    v = token_test(cu, bu, Alphas(ks=4e-4, mean=3e-4, outside=1.5e-4, serial=1e-4), cand_mid=c, base_mid=b)
    assert not v.ok and "consecutive tokens" in v.reason and v.serial_pairs == 60 * 29, v.reason
    assert token_test(cu, bu, Alphas(ks=4e-4, mean=3e-4, outside=1.5e-4)).ok  # the marginals alone pass


def test_the_sum_of_binomials_tail_is_exact() -> None:
    """One stratum: the binomial's own tail; several: a simulation of the sum agrees."""
    assert binomial_sum_tail(12, [(17, 0.34)]) == pytest.approx(binomial_upper(12, 17, 0.34), rel=1e-9)
    assert binomial_sum_tail(3, [(17, 0.34)], upper=False) == pytest.approx(binomial_lower(3, 17, 0.34), rel=1e-9)
    strata = [(7, 0.2), (17, 0.34), (12, 0.6), (5, 0.0), (3, 1.0)]
    rng = np.random.default_rng(5)
    x = sum(rng.binomial(m, s, 200_000) for m, s in strata)
    for k in (10, 16, 22):
        assert binomial_sum_tail(k, strata) == pytest.approx((x >= k).mean(), abs=0.004)
        assert binomial_sum_tail(k, strata, upper=False) == pytest.approx((x <= k).mean(), abs=0.004)
    assert binomial_sum_tail(0, strata) == 1.0 and binomial_sum_tail(100, strata) == 0.0


def _temperature(rng: np.random.Generator, rate: float, extra: int = 0, z: float | None = None,
                 n_c: int = 2600, n_b: int = 5100) -> dict[str, object]:
    """One temperature's per-token test as the verdict keeps it, for a correct sampler whose scorer puts `rate`
    of each side's tokens outside the law (numeric noise at the cut), plus `extra` outside tokens on the
    candidate's side; the serial z standard normal unless given."""
    oc, ob = int(rng.poisson(rate * n_c)) + extra, int(rng.poisson(rate * n_b))
    e_c, e_b = 45.0, 90.0
    return {"n_candidate": n_c - oc, "outside_candidate": oc, "n_baseline": n_b - ob, "outside_baseline": ob,
            "edge_candidate": int(rng.poisson(e_c)), "edge_expected_candidate": e_c,
            "edge_baseline": int(rng.poisson(e_b)), "edge_expected_baseline": e_b, "serial_pairs": n_c,
            "serial_z": float(rng.normal()) if z is None else z}


def test_the_pooled_tests_hold_their_alpha_for_a_correct_sampler() -> None:
    """2,000 null gates of three temperatures whose scorer noise differs (0.05 % to 0.3 % of tokens outside the
    law at the cut, alike on both sides): each pooled statistic refuses at most at its alpha."""
    rng = np.random.default_rng(41)
    a = PooledAlphas(outside=0.05, edge=0.05, serial=0.05)
    got = [pooled_test([_temperature(rng, r) for r in (0.0005, 0.0012, 0.003)], a) for _ in range(2000)]
    for name in ("outside_p", "edge_p", "serial_p"):
        ps = np.asarray([getattr(v, name) for v in got])
        assert (ps < 0.05).mean() <= 0.05 * 1.2 + 0.01, (name, (ps < 0.05).mean())
        assert (ps < 0.2).mean() > 0.05, name  # not a test that never refuses
    assert np.mean([not v.ok for v in got]) <= 0.15 * 1.2


def test_a_support_too_wide_at_two_temperatures_is_refused_pooled_where_each_temperature_passes() -> None:
    """The H200 run of 2026-12-05 (min_p_on_t1, run 2): 11 / 11 / 4 candidate tokens outside the law against the
    baseline's 3 / 5 / 6 at T 0.6 / 0.8 / 1 (the fault widens min-p below T 1 only). Each temperature's count
    test stays above its alpha (2e-4 there); the pooled one refuses."""
    tests = []
    for oc, ob in ((11, 3), (11, 5), (4, 6)):
        tests.append({"n_candidate": 2600 - oc, "outside_candidate": oc, "n_baseline": 5065 - ob,
                      "outside_baseline": ob, "serial_pairs": 2600, "serial_z": 0.3})
        assert binomial_upper(oc, oc + ob, 2600 / 7665) > 2e-4
    v = pooled_test(tests, PooledAlphas(outside=2e-4, edge=1e-4, serial=2e-4))
    assert not v.ok and v.outside_p < 1e-4 and "wider than the request's" in v.reason, v.reason
    assert (v.outside_candidate, v.outside_baseline) == (26, 14)
    # the same counts on the baseline's side too: nothing to refuse
    same = [{**t, "outside_candidate": t["outside_baseline"] // 2} for t in tests]
    assert pooled_test(same, PooledAlphas(outside=2e-4, edge=1e-4, serial=2e-4)).ok


def test_consecutive_tokens_moving_together_at_every_temperature_are_refused_pooled() -> None:
    """The H200 run of 2026-12-05 (step_shared_random, run 1): serial z +1.7 / +2.4 / +3.0, each short of a
    temperature's alpha (1.3e-4, |z| 3.8); Stouffer's z +4.1 refuses. A fault at one temperature only is still
    each temperature's test's to find: z +5 at one of three pools to +2.9."""
    tests = [{"n_candidate": 2600, "outside_candidate": 0, "n_baseline": 5100, "outside_baseline": 0,
              "serial_pairs": 2600, "serial_z": z} for z in (1.7, 2.4, 3.0)]
    v = pooled_test(tests, PooledAlphas(outside=2e-4, edge=1e-4, serial=2e-4))
    assert not v.ok and v.serial_z == pytest.approx(4.1, abs=0.01) and "move together" in v.reason, v.reason
    one = [{**t, "serial_z": z} for t, z in zip(tests, (5.0, 0.0, 0.0), strict=True)]
    assert pooled_test(one, PooledAlphas(outside=2e-4, edge=1e-4, serial=2e-4)).ok


def test_a_support_cut_short_at_every_temperature_is_refused_pooled_at_the_cut() -> None:
    """The cut token drawn 27 of 45 expected at each temperature (p 0.01 each): pooled, 81 of 135, p < 1e-4."""
    tests = [{"n_candidate": 2600, "outside_candidate": 0, "n_baseline": 5100, "outside_baseline": 0,
              "edge_candidate": 27, "edge_expected_candidate": 45.0, "edge_baseline": 90,
              "edge_expected_baseline": 90.0, "serial_pairs": 2600, "serial_z": 0.0} for _ in range(3)]
    assert edge_p(EdgeCount(27, 45.0, 500), EdgeCount(90, 90.0, 1000)) > 1e-3
    v = pooled_test(tests, PooledAlphas(outside=2e-4, edge=1e-4, serial=2e-4))
    assert not v.ok and v.edge_p < 1e-4 and "ends short" in v.reason, v.reason


def test_the_statement_over_every_temperature_counts_the_pooled_tests() -> None:
    """With the pooled tests' alphas, a sampler whose support is too wide at every temperature (untruncated) is
    refused at a smaller share than by the temperatures' own tests alone; one temperature alone is unchanged."""
    rng = np.random.default_rng(9)
    xs = [PowerInput(_draws(rng, [SamplingParams(t, top_p=0.9)], 1200), 1500, 0.0, 3000, 4, A) for t in (0.6, 0.8, 1.0)]
    pooled = PooledAlphas(outside=2e-4, edge=1e-4, serial=2e-4)
    without = power_statement(xs, 0.9, 60, 3)
    with_pooled = power_statement(xs, 0.9, 60, 3, pooled=pooled)
    r0, r1 = without["families"]["untruncated"]["min_rate"], with_pooled["families"]["untruncated"]["min_rate"]
    assert r0 is not None and r1 is not None and r1 < 0.95 * r0, (r0, r1)
    one = [power_statement(xs[:1], 0.9, 60, 3, pooled=p) for p in (None, pooled)]
    assert one[0]["families"] == one[1]["families"]


def test_a_lost_truncation_is_a_wrong_law_whose_draws_are_placed_by_cut() -> None:
    """no_top_k / no_top_p / no_min_p: the request's law with one truncation lost. Its distance from the law is
    the total variation between the two laws written out independently; a token it draws outside the law is
    attributed to the lost cut; a request that does not turn the cut on makes it the law itself (distance 0)."""
    rng = np.random.default_rng(11)
    o = ORDERS["sglang"]
    p = SamplingParams(0.8, 0.9, 0, 0.1)
    fam = {f: i for i, f in enumerate(FAMILIES)}
    rows = []
    for _ in range(300):
        logits = rng.normal(0, 2.5, V)
        row = row_from_logits(logits, p.temperature)
        d = wrong_draws(row, law_of(row, p, o), p, o, rng)
        assert len(d) == DRAW_COLUMNS and d[CUTS_ON_COL] == 2 + 4  # top-p and min-p on
        rows.append(d)
    q = reference_law(logits, p, "sglang")
    for name, lost in (("no_min_p", SamplingParams(0.8, 0.9)), ("no_top_p", SamplingParams(0.8, 1.0, 0, 0.1))):
        want = 0.5 * np.abs(reference_law(logits, lost, "sglang") - q).sum()
        assert d[N_FAMILIES + fam[name]] == pytest.approx(want, abs=1e-9), name
    d = np.asarray(rows)
    out_min = np.isnan(d[:, fam["no_min_p"]])
    # min-p's cut only, and only past it by more than CUT_REACH (the draws the lost cut makes just past it: 0)
    got = d[out_min, CUT_MASK_COL + fam["no_min_p"]]
    assert out_min.sum() > 20 and set(got) <= {0.0, 4.0} and (got == 4.0).mean() > 0.8
    assert set(d[~out_min, CUT_MASK_COL + fam["no_min_p"]]) == {0.0}
    # here min-p cuts deeper than top-p: losing top-p changes nothing; a wide min-p under a tight top-p, the reverse
    assert not np.isnan(d[:, fam["no_top_p"]]).any() and not d[:, N_FAMILIES + fam["no_top_p"]].any()
    pp = SamplingParams(0.8, 0.5, 0, 0.01)
    dp = np.asarray([wrong_draws(r, law_of(r, pp, o), pp, o, rng) for r in
                     (row_from_logits(rng.normal(0, 2.5, V), 0.8) for _ in range(300))])
    out_p = np.isnan(dp[:, fam["no_top_p"]])
    assert out_p.sum() > 20 and set(dp[out_p, CUT_MASK_COL + fam["no_top_p"]]) == {2.0}  # top-p: every token
    assert not np.isnan(d[:, fam["no_top_k"]]).any() and not d[:, N_FAMILIES + fam["no_top_k"]].any()
    plain = SamplingParams(0.8, 0.9)
    row = row_from_logits(logits, 0.8)
    d1 = wrong_draws(row, law_of(row, plain, o), plain, o, rng)
    assert d1[N_FAMILIES + fam["no_min_p"]] == 0 and d1[CUTS_ON_COL] == 2


def test_the_statement_simulates_the_counts_by_cut() -> None:
    """A sampler that loses min-p at every temperature: its tokens outside the law are all min-p's. Counted by cut
    against min-p's own baseline noise (2 a temperature, where every cut together has 8), the pooled test refuses
    it at a smaller share than the all-cuts count alone; the statement simulates that count."""
    rng = np.random.default_rng(5)
    xs = [PowerInput(_draws(rng, [SamplingParams(t, top_p=0.9, min_p=0.1)], 1200), 1500, 0.0, 3000, 8, A,
                     base_cut={"top_k": [0, 0], "top_p": [3008, 6], "min_p": [3008, 2]}) for t in (0.6, 0.8, 0.9)]
    no_cut = PooledAlphas(outside=2e-4, edge=1e-4, serial=2e-4)
    by_cut = PooledAlphas(outside=2e-4, edge=1e-4, serial=2e-4, cut=7e-5)
    fams = ("no_min_p",)
    r0 = power_statement(xs, 0.9, 60, 3, families=fams, pooled=no_cut)["families"]["no_min_p"]["min_rate"]
    r1 = power_statement(xs, 0.9, 60, 3, families=fams, pooled=by_cut)["families"]["no_min_p"]["min_rate"]
    assert r0 is not None and r1 is not None and r1 < 0.8 * r0, (r0, r1)
    # without the baseline's counts by cut (an older report) the statement is the all-cuts one
    old = [PowerInput(x.draws, x.n_cand, x.allow, x.n_base, x.n_out_b, x.alphas) for x in xs]
    assert power_statement(old, 0.9, 60, 3, families=fams, pooled=by_cut)["families"]["no_min_p"]["min_rate"] == r0
    with pytest.raises(ValueError, match="unknown wrong-law families"):
        power_statement(xs, 0.9, 10, 3, families=("no_top_q",))


def test_each_token_outside_the_law_is_attributed_to_the_cuts_that_leave_it_out() -> None:
    """cut_by asks each truncation's law alone: the 25th token of a row under top-k 20 is outside top-k's cut
    only; with min-p 0.5 at T 0.8 every token below half the top one's p_T is outside min-p's; a token past the
    top-p nucleus is outside top-p's. An untruncated request has no cut to blame."""
    rng = np.random.default_rng(3)
    row = row_from_logits(rng.normal(0, 2.5, V), 0.8)
    o = ORDERS["sglang"]
    assert cut_by(row, SamplingParams(0.8, 1.0, 20), o, 24) == (True, False, False)
    assert cut_by(row, SamplingParams(0.8, 1.0, 20), o, 5) == (False, False, False)
    pt = np.exp(row.lp / 0.8)
    below = int(np.flatnonzero(pt < 0.5 * pt[0])[0])
    assert cut_by(row, SamplingParams(0.8, 1.0, 0, 0.5), o, below) == (False, False, True)
    assert cut_by(row, SamplingParams(0.8, 1.0, 0, 0.5), o, below - 1) == (False, False, False)
    nucleus = law_of(row, SamplingParams(0.8, 0.5), o).n
    assert cut_by(row, SamplingParams(0.8, 0.5, 0, 0.5), o, max(nucleus, below) + 3) == (False, True, True)
    assert cut_by(row, SamplingParams(0.8), o, V - 1) == (False, False, False)


def min_p_on_t1(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The worker fault `min_p_on_t1` written out: min-p's bar placed on the T=1 law, every other cut and the draw
    on p_T (below T 1 the bar is lower, so min-p keeps too much)."""
    bar = reference_law(logits, SamplingParams(1.0, min_p=p.min_p), "sglang") > 0
    q = reference_law(logits, SamplingParams(p.temperature, p.top_p, p.top_k), "sglang") * bar
    return q / q.sum()


def test_the_scorer_counts_a_min_p_fault_outside_min_p_cut_only() -> None:
    """Tokens drawn under MIX by the min_p_on_t1 fault and placed by scorers.per_token: every token outside the law
    is outside min-p's cut (none outside top-k's or top-p's alone; min-p counts those past it by more than
    CUT_REACH), and the tokens at risk are those of the
    requests with min-p on. The correct sampler's tokens are never outside (an exact scorer)."""
    rng = np.random.default_rng(23)
    got = {"tokens": np.zeros(3, int), "outside": np.zeros(3, int), "none": 0, "far": 0}
    for j, params in enumerate(MIX):
        rows, seq, good = [], [], []
        for _ in range(300):
            logits = rng.normal(0, 2.5, V)
            rows.append(row_from_logits(logits, params.temperature))
            seq.append(int(rng.choice(V, p=min_p_on_t1(logits, params))))
            good.append(int(rng.choice(V, p=reference_law(logits, params, "sglang"))))
        tok = per_token(f"m/{j}", params.temperature, rows, seq, params, ORDERS["sglang"])
        got["tokens"] += tok["cut_tokens"]
        got["outside"] += tok["cut_outside"]
        got["none"] += sum(1 for x in tok["tok_pit"] if x is None)
        got["far"] += sum(1 for r in tok["tok_reach"] if r is not None and r > CUT_REACH)
        clean = per_token(f"g/{j}", params.temperature, rows, good, params, ORDERS["sglang"])
        assert clean["cut_outside"] == (0, 0, 0) and None not in clean["tok_pit"]
    on = [sum(1 for m in MIX if m.top_k), sum(1 for m in MIX if m.top_p < 1), sum(1 for m in MIX if m.min_p)]
    assert list(got["tokens"]) == [300 * k for k in on]
    # min-p's count holds the outside tokens past its cut by more than CUT_REACH: most of them
    assert got["outside"][0] == got["outside"][1] == 0 and got["outside"][2] == got["far"] > 20, got
    assert got["far"] > 0.8 * got["none"], got


def _cuts(rng: np.random.Generator, n: int, shares: tuple[float, ...], rates: tuple[float, ...], extra: int = 0
          ) -> dict[str, list[int]]:
    """One side's tokens and outside counts per cut: `shares` of its n tokens turn each cut on, scorer noise puts
    `rates` of those outside; `extra` more outside min-p's cut."""
    out = {}
    for name, sh, r in zip(("top_k", "top_p", "min_p"), shares, rates, strict=True):
        m = int(sh * n)
        out[name] = [m, int(rng.poisson(r * m)) + (extra if name == "min_p" else 0)]
    return out


def test_the_counts_by_cut_hold_their_alpha_for_a_correct_sampler() -> None:
    """2,000 null gates of three temperatures whose noise differs by cut and by temperature (top-p's cumulative sum
    flips most): each cut's pooled count refuses at most at its alpha, and refuses something at a looser one."""
    rng = np.random.default_rng(77)
    shares = (0.4, 0.6, 0.35)
    rates = {0.6: (0.0004, 0.002, 0.0002), 0.8: (0.0008, 0.003, 0.0003), 1.0: (0.001, 0.004, 0.0005)}
    ps = {k: [] for k in ("top_k", "top_p", "min_p")}
    for _ in range(2000):
        tests = []
        for t in (0.6, 0.8, 1.0):
            tests.append({"cut_candidate": _cuts(rng, 2600, shares, rates[t]),
                          "cut_baseline": _cuts(rng, 5100, shares, rates[t])})
        for k, c in cut_counts_p(tests).items():
            ps[k].append(c["p"])
    for k, v in ps.items():
        a = np.asarray(v)
        assert a.size == 2000 and (a < 0.05).mean() <= 0.05 * 1.2 + 0.01, (k, (a < 0.05).mean())
        assert (a < 0.3).mean() > 0.05, k


def test_a_fault_of_one_cut_is_refused_by_its_count_where_the_count_of_all_cuts_passes() -> None:
    """Constructed at the H200's sizes (2,600 candidate and 5,100 baseline tokens a temperature; the noise mostly
    at top-p's cut): a min-p kept too wide adds 3 / 8 / 0 candidate tokens outside min-p at T 0.6 / 0.8 / 1 (the
    fault is nil at T 1). All cuts together: about 22 against the baseline's 14, short of the outside alpha; min-p's
    own count refuses. The same gate without the extra tokens passes both."""
    def gate(extra: tuple[int, int, int]) -> list[dict]:
        tests = []
        for (oc_p, ob_p, oc_m, ob_m), x in zip(((2, 3, 0, 0), (3, 4, 1, 1), (5, 6, 0, 0)), extra, strict=True):
            cc = {"top_k": [1000, 1], "top_p": [1500, oc_p], "min_p": [900, oc_m + x]}
            cb = {"top_k": [2000, 1], "top_p": [3000, ob_p], "min_p": [1800, ob_m]}
            oc = cc["top_k"][1] + oc_p + oc_m + x
            ob = cb["top_k"][1] + ob_p + ob_m
            tests.append({"n_candidate": 2600 - oc, "outside_candidate": oc, "n_baseline": 5100 - ob,
                          "outside_baseline": ob, "serial_pairs": 2600, "serial_z": 0.2,
                          "cut_candidate": cc, "cut_baseline": cb})
        return tests
    a = PooledAlphas(outside=1.25e-4, edge=7.5e-5, serial=1.75e-4, cut=4.2e-5)
    v = pooled_test(gate((3, 8, 0)), a)
    assert v.outside_p > a.outside, v.reason
    assert not v.ok and v.cuts["min_p"]["p"] < a.cut and "min-p keeps more" in v.reason, v.reason
    assert v.cuts["top_p"]["p"] > 0.05 and v.cuts["min_p"]["candidate"] == 12
    ok = pooled_test(gate((0, 0, 0)), a)
    assert ok.ok and set(ok.cuts) == {"top_k", "top_p", "min_p"} and "outside the min-p cut" in ok.reason, ok.reason
    assert pooled_test(gate((3, 8, 0)), PooledAlphas(outside=1.25e-4, edge=7.5e-5, serial=1.75e-4)).ok  # cut 0: off


def test_threshold_reach_is_the_least_raise_that_brings_a_token_inside_its_top_k_and_min_p_cuts() -> None:
    """Worked by hand on one row: log p_1 0, -1, -2, -4 (the tail below). min-p 0.1 at T 0.5 keeps a token whose
    log p_1 is within 0.5 * ln 10 = 1.151 of the top; top-k 2 keeps the first two."""
    lp = np.log(np.array([0.55, 0.2, 0.075, 0.01]))
    lp = lp - np.log(np.exp(lp).sum() + 0.02)
    row = tokenlaw_row(lp)
    mp = SamplingParams(0.5, min_p=0.1)
    assert threshold_reach(row, mp, ORDERS["sglang"], 1) is None  # 1.01 from the top: inside
    assert threshold_reach(row, mp, ORDERS["sglang"], 2) == pytest.approx(lp[0] - lp[2] - 0.5 * math.log(10))
    # min-p before the temperature (llama.cpp): the bar on p_1, ln 10 from the top
    assert threshold_reach(row, mp, ORDERS["llamacpp"], 2) is None
    assert threshold_reach(row, mp, ORDERS["llamacpp"], 3) == pytest.approx(lp[0] - lp[3] - math.log(10))
    # a llama.cpp chain without a min-p step (its /props samplers) applies none: no min-p reach, no error
    assert threshold_reach(row, mp, order_of(["top_k", "top_p", "temperature"]), 3) is None
    tk = SamplingParams(0.8, top_k=2)
    assert threshold_reach(row, tk, ORDERS["sglang"], 1) is None
    assert threshold_reach(row, tk, ORDERS["sglang"], 3) == pytest.approx(lp[1] - lp[3])
    assert threshold_reach(row, tk, ORDERS["sglang"], None) == pytest.approx(lp[1] - lp[3])  # unlisted: at least
    both = SamplingParams(0.5, top_k=3, min_p=0.1)  # the farther cut decides
    assert threshold_reach(row, both, ORDERS["sglang"], 3) == pytest.approx(lp[0] - lp[3] - 0.5 * math.log(10))
    assert threshold_reach(row, SamplingParams(0.8, top_p=0.5), ORDERS["sglang"], 3) is None  # top-p: a mass cut


def test_the_counts_by_threshold_cut_leave_the_scorers_flips_at_the_cut_out_of_both_sides() -> None:
    """cut_by with `far`: a threshold cut (top-k, min-p) counts a token only past it by more than `far` logits
    (cut_reaches, each cut alone); top-p, a mass cut, counts every token it leaves out. Worked by hand on one row,
    then on draws: a correct sampler whose logits differ from the scorer's by +-0.05 flips tokens across the cuts,
    counted at far 0 and never past CUT_REACH; min-p's bar on the T=1 law puts tokens past it."""
    lp = np.log(np.array([0.55, 0.2, 0.19, 0.01]))
    lp = lp - np.log(np.exp(lp).sum() + 0.02)
    row = tokenlaw_row(lp)
    o = ORDERS["sglang"]
    tk = SamplingParams(0.8, top_k=2)  # the third token is lp[1] - lp[2] = 0.051 past the cut, the fourth 3.0
    assert cut_reaches(row, tk, o, 2) == (pytest.approx(lp[1] - lp[2]), None)
    assert cut_by(row, tk, o, 2) == (True, False, False) and cut_by(row, tk, o, 2, CUT_REACH) == (False,) * 3
    assert cut_by(row, tk, o, 3, CUT_REACH) == (True, False, False)
    mp = SamplingParams(1.0, min_p=0.4)  # the bar at 0.4 x 0.55: the second token 0.095 below it, the third 0.147
    assert cut_reaches(row, mp, o, 1)[1] == pytest.approx(lp[0] - lp[1] + math.log(0.4))
    assert cut_by(row, mp, o, 1) == (False, False, True) and cut_by(row, mp, o, 1, CUT_REACH) == (False,) * 3
    assert cut_by(row, mp, o, 2, CUT_REACH) == (False, False, True) and cut_by(row, mp, o, 2, 0.2) == (False,) * 3
    tp = SamplingParams(0.8, top_p=0.5)
    assert cut_by(row, tp, o, 2, CUT_REACH) == cut_by(row, tp, o, 2) == (False, True, False)

    def counts(draw: object, far_seed: int) -> tuple[int, int]:
        rng = np.random.default_rng(far_seed)
        total, far = 0, 0
        for params in REACH_MIX:
            for _ in range(300):
                logits = rng.normal(0, 2.5, V)
                r = row_from_logits(logits, params.temperature)
                tok = int(rng.choice(V, p=draw(logits + rng.uniform(-0.05, 0.05, V), params)))
                rank = int(np.flatnonzero(r.ids == tok)[0])
                if rank >= law_of(r, params, o).n:
                    total += cut_by(r, params, o, rank)[2] + cut_by(r, params, o, rank)[0]
                    far += cut_by(r, params, o, rank, CUT_REACH)[2] + cut_by(r, params, o, rank, CUT_REACH)[0]
        return total, far

    good = counts(lambda lg, p: reference_law(lg, p, "sglang"), 5)
    assert good[0] > 0 and good[1] == 0, good  # the flips are counted at far 0 only
    bad = counts(min_p_on_t1, 5)
    assert bad[1] >= 10, bad


def test_the_verdict_records_each_outside_tokens_reach_by_cut_and_its_counts_follow_from_them() -> None:
    """The report keeps, per threshold cut and side, the reach of every token the cut leaves outside
    (cut_reach_candidate / cut_reach_baseline): the gate's counts by cut (past CUT_REACH) follow from them, and so
    would the counts at any other bar."""
    rng = np.random.default_rng(29)
    mix = [SamplingParams(0.6, min_p=0.1), SamplingParams(0.7, 0.95, 40, 0.05), SamplingParams(0.8, top_k=10)]

    def answers(draw: object, tag: str) -> list[AnswerScore]:
        out = []
        for j, params in enumerate(mix):
            rows, seq = [], []
            for _ in range(150):
                logits = rng.normal(0, 2.5, V)
                rows.append(row_from_logits(logits, params.temperature))
                seq.append(int(rng.choice(V, p=draw(logits + rng.uniform(-0.08, 0.08, V), params))))
            tok = per_token(f"{tag}/{j}", params.temperature, rows, seq, params, ORDERS["sglang"])
            out.append(AnswerScore(tag, params.temperature, j, (-1.0,) * len(seq), None, **tok))
        return out

    cand = answers(min_p_on_t1, "c")
    base = answers(lambda lg, p: reference_law(lg, p, "sglang"), "b")
    v = token_verdict(cand, base, LikelihoodConfig(token_power_reps=0), 3)
    assert v is not None and v.cut_reach_bar == CUT_REACH
    for side, counts in ((v.cut_reach_candidate, v.cut_candidate), (v.cut_reach_baseline, v.cut_baseline)):
        for name in ("top_k", "min_p"):
            assert side[name] == sorted(side[name]) and all(r >= 0 for r in side[name])
            assert sum(r > CUT_REACH for r in side[name]) == counts[name][1], (name, side[name], counts[name])
    assert len(v.cut_reach_candidate["min_p"]) > 10 and v.cut_reach_baseline["min_p"]  # noise flips, near the cut
    assert max(v.cut_reach_baseline["min_p"]) <= 0.16 + 1e-9 < max(v.cut_reach_candidate["min_p"])


def tokenlaw_row(lp: np.ndarray) -> object:
    from sglfleet.validation.tokenlaw import Row

    return Row(lp, np.arange(lp.size, dtype=np.int64), 0.0, True)


# threshold cuts whose wrong placements below reach past the shipped floor: min-p's band between the T=1 bar and
# the right one is (1 - T) ln(1 / min_p) logits wide (0.92 at T 0.6 and min-p 0.1, the lab profile's entry)
REACH_MIX = [SamplingParams(0.6, min_p=0.1), SamplingParams(0.6, top_k=20), SamplingParams(0.7, 0.95, 40, 0.05),
             SamplingParams(0.8, top_k=10, min_p=0.02)]


def _reaches(draw: object, eps: float, seed: int, n: int = 400) -> list[float]:
    """Tokens under REACH_MIX drawn by `draw(logits, params)` from the sampler's logits (the scorer's plus uniform
    noise of +-eps, the two numerics' difference) and placed by scorers.per_token on the scorer's: their reaches."""
    rng = np.random.default_rng(seed)
    out: list[float] = []
    for j, params in enumerate(REACH_MIX):
        rows, seq = [], []
        for _ in range(n):
            logits = rng.normal(0, 2.5, V)
            noisy = logits + rng.uniform(-eps, eps, V)
            rows.append(row_from_logits(logits, params.temperature))
            seq.append(int(rng.choice(V, p=draw(noisy, params))))
        tok = per_token(f"r/{seed}/{j}", params.temperature, rows, seq, params, ORDERS["sglang"])
        out += [r for r in tok["tok_reach"] if r is not None]
    return out


def no_top_k(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    return reference_law(logits, SamplingParams(p.temperature, p.top_p, 0, p.min_p), "sglang")


def no_min_p(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    return reference_law(logits, SamplingParams(p.temperature, p.top_p, p.top_k, 0.0), "sglang")


def min_p_halved(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    return reference_law(logits, SamplingParams(p.temperature, p.top_p, p.top_k, p.min_p / 2), "sglang")


def top_k_from_the_wrong_row(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    return reference_law(logits, SamplingParams(p.temperature, p.top_p, 4 * p.top_k, p.min_p), "sglang")


def test_a_correct_samplers_tokens_lie_within_the_scorers_reach_and_wrong_threshold_cuts_far_past_it() -> None:
    """The class the rule is for: a threshold cut computed on another law or with another parameter (min-p's bar
    on the T=1 law, min-p halved, top-k lost, another row's top-k). Correct draws whose logits differ from the
    scorer's by up to eps land outside the scorer's cut only within 2 eps of it; each wrong cut puts tokens past
    the shipped floor where the region it wrongly keeps reaches past it (REACH_MIX). A cut moved by less than the
    floor (min-p halved keeps T ln 2 logits more, 0.42-0.55 here) is left to the counts by cut: none past it."""
    eps = 0.05
    good = _reaches(lambda lg, p: reference_law(lg, p, "sglang"), eps, 1)
    assert good and max(good) <= 2 * eps + 1e-9, max(good)  # noise does flip tokens, never far
    floor = load_gate_config(str(PROFILES / "sglang-smollm2.yaml")).likelihood.reach_floor  # 0.5: the SGLang one
    for fault in (min_p_on_t1, no_min_p, no_top_k, top_k_from_the_wrong_row):
        bad = _reaches(fault, eps, 2)
        assert sum(1 for r in bad if r > floor) >= 10, (fault.__name__, sorted(bad)[-5:])
    near = _reaches(min_p_halved, eps, 3)
    assert len(near) >= 20 and max(near) <= max(p.temperature for p in REACH_MIX) * math.log(2) + 2 * eps, max(near)


def test_a_token_past_the_margin_refuses_the_temperature_and_the_margin_follows_the_baseline() -> None:
    from sglfleet.validation.likelihood import reach_margin

    rng = np.random.default_rng(5)
    u = list(rng.uniform(size=3000))
    ok = token_test(u, list(rng.uniform(size=6000)), A, cand_reach=[0.2, None, 0.49], reach_margin=0.5,
                    baseline_reach=0.1)
    assert ok.ok and ok.past_reach == 0 and ok.farthest_reach == 0.49, ok.reason
    bad = token_test(u, list(rng.uniform(size=6000)), A, cand_reach=[0.2, 0.7], reach_margin=0.5, baseline_reach=0.1)
    assert not bad.ok and bad.past_reach == 1 and "past the request's top-k/min-p cut" in bad.reason, bad.reason
    lc = LikelihoodConfig()

    def base(*r: float | None) -> AnswerScore:
        return AnswerScore("p", 0.8, 1, (-1.0,) * 3, None, tok_reach=tuple(r))
    assert reach_margin(lc, [base(0.1, None), base()]) == (lc.reach_floor, 0.1)
    assert reach_margin(lc, [base(0.5), base(0.05)]) == (pytest.approx(lc.reach_factor * 0.5), 0.5)
    assert lc.reach_floor == floor_of("sglang-ddtree.yaml") == 1.0 and floor_of("sglang-smollm2.yaml") == 0.5
    assert reach_margin(LikelihoodConfig(threshold_reach=False), [base(0.3)]) == (math.inf, 0.3)


def floor_of(profile: str) -> float:
    return float(load_gate_config(str(PROFILES / profile)).likelihood.reach_floor)
