"""The T>0 likelihood verdict (validation/likelihood.py): the test's statistics on synthetic scores, the
support bound, the reference scorer on the real numpy model, and the scorer's bad-input probes against real
local servers (the embedded llama.cpp target, which cannot return input log-probs)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator

import numpy as np
import pytest
from pydantic import ValidationError

from sglfleet.pipeline.errors import UsageError
from sglfleet.pipeline.reports import redact
from sglfleet.validation.config import GateConfig, LikelihoodConfig
from sglfleet.validation.likelihood import likelihood_test, permutation_test, support_limit
from sglfleet.validation.scorers import AnswerScore, _support_from_logits, make_scorer, support_from_topk

PROMPTS = ("poem", "prose", "code", "factual", "list", "table", "arithmetic", "long")
LC = LikelihoodConfig(permutations=2000, power_reps=0)


def fake_answer(pid: str, t: float, seed: int, rng: np.random.Generator, shift: float = 0.0, n: int = 40,
                level: float = 1.0) -> AnswerScore:
    """Per-token log p_T drawn from a per-prompt law (an exchangeable stand-in for a scored answer)."""
    lp = -(rng.gamma(2.0, level / 2.0, size=n) + shift)
    return AnswerScore(pid, t, seed, tuple((lp * t).tolist()), tuple(lp.tolist()), tuple("x" for _ in range(n)), 16)


def sides(rng: np.random.Generator, k: int = 3, shift: float = 0.0, t: float = 0.8,
          ) -> tuple[list[AnswerScore], list[AnswerScore]]:
    levels = {p: 0.3 + 0.2 * i for i, p in enumerate(PROMPTS)}   # prompts differ: the test is stratified
    cand = [fake_answer(p, t, 100 + s, rng, shift, level=levels[p]) for p in PROMPTS for s in range(k)]
    base = [fake_answer(p, t, 200 + s, rng, level=levels[p]) for p in PROMPTS for s in range(k)]
    return cand, base


def test_p_values_on_exchangeable_samples_are_uniform() -> None:
    ps = []
    for seed in range(300):
        cand, base = sides(np.random.default_rng(seed))
        by = lambda xs: {p: np.array([a.mean_nll for a in xs if a.prompt_id == p]) for p in PROMPTS}  # noqa: E731
        ps.append(permutation_test(by(cand), by(base), 400, seed, 0.05)["p_value"])
    ps = np.array(ps)
    # uniform on (0, 1]: each decile holds about 10 %, the 5 % tail about 5 %
    hist = np.histogram(ps, bins=5, range=(0, 1))[0] / len(ps)
    assert all(0.12 <= h <= 0.28 for h in hist), hist
    assert 0.01 <= float(np.mean(ps < 0.05)) <= 0.10
    assert 0.42 <= float(ps.mean()) <= 0.58


def test_the_verdict_passes_exchangeable_samples_at_about_alpha() -> None:
    fails = sum(not likelihood_test(*sides(np.random.default_rng(1000 + i)), LC, 3, top_p=0.95).ok
                for i in range(150))
    assert fails <= 4  # alpha per temperature is 0.0033: 0.5 expected; 4 or more has probability < 0.2 %


@pytest.mark.parametrize("shift", [0.6, -0.6])
def test_shifted_samples_are_rejected_either_way(shift: float) -> None:
    # a corruption that raises the NLL (garbage) or lowers it (a loop the model predicts)
    v = likelihood_test(*sides(np.random.default_rng(7), shift=shift), LC, 3, top_p=0.95)
    assert not v.ok and v.p_value < v.statistic["alpha_per_statistic"]
    assert v.statistic["mean_nll"]["z"] * shift > 0
    assert v.evidence and "z" in v.evidence[0]


def test_the_test_is_deterministic() -> None:
    a = likelihood_test(*sides(np.random.default_rng(3)), LC, 3, top_p=0.95)
    b = likelihood_test(*sides(np.random.default_rng(3)), LC, 3, top_p=0.95)
    assert a.p_value == b.p_value and a.statistic["mean_nll"]["S"] == b.statistic["mean_nll"]["S"]


def test_zero_answers_never_pass() -> None:
    cand, base = sides(np.random.default_rng(1))
    for c, b in (([], base), (cand, []), ([], [])):
        v = likelihood_test(c, b, LC, 3, top_p=0.95)
        assert not v.ok and "never pass" in v.reason
    few = likelihood_test(cand[:LC.min_answers - 1], base, LC, 3, top_p=0.95)
    assert not few.ok


def test_an_unscorable_candidate_answer_fails() -> None:
    cand, base = sides(np.random.default_rng(2))
    broken = AnswerScore("poem", 0.8, 9, (), None, (), 16, error="server answered HTTP 500")
    v = likelihood_test([*cand, broken], base, LC, 3, top_p=0.95)
    assert not v.ok and "could not be scored" in v.reason and v.evidence[0]["answer"] == "poem@T0.8/seed9"


def test_one_impossible_token_fails_with_its_position_and_the_bound() -> None:
    rng = np.random.default_rng(5)
    cand, base = sides(rng)
    a = cand[4]
    lp = list(a.support_logprobs)
    lp[17] = -60.0
    cand[4] = AnswerScore(a.prompt_id, a.temperature, a.seed, a.token_logprobs, tuple(lp), a.pieces, 16)
    v = likelihood_test(cand, base, LC, 3, top_p=0.95)
    assert not v.ok
    bad = v.support["impossible"]
    assert len(bad) == 1 and bad[0]["position"] == 17 and bad[0]["answer"] == cand[4].label
    assert bad[0]["p_T"] == pytest.approx(math.exp(-60.0))
    # the stated bound is the support's share of this temperature's alpha, or below
    assert v.support["bound"] <= LC.alpha / 3 * LC.support_share * (1 + 1e-9)
    assert v.evidence[0]["impossible"]["position"] == 17
    # what the report writes: the reports mask values under secret-looking keys ("...token"); the piece and the
    # evidence must not sit under one (on the H200 the piece came back as "***", 2026-12-03)
    assert redact(v.evidence)[0]["impossible"]["piece"] == bad[0]["piece"] == a.pieces[17]
    # the same token shown as U+FFFD (the engine's bytes lost in the text) is not the text's to vouch for
    pieces = list(a.pieces)
    pieces[17] = "\ufffd"
    cand[4] = AnswerScore(a.prompt_id, a.temperature, a.seed, a.token_logprobs, tuple(lp), tuple(pieces), 16)
    w = likelihood_test(cand, base, LC, 3, top_p=0.95)
    assert not w.support["impossible"] and w.support["unvouched_tokens"] == 1


def test_the_support_limit_keeps_its_bound_at_any_token_count() -> None:
    a_sup = LC.alpha / 3 * LC.support_share
    for n in (10, 3_000, 10**6, 10**9):
        log_eps, bound = support_limit(LC, n, 0.95, a_sup, 49152)
        assert log_eps <= LC.support_log_eps
        assert bound <= a_sup * (1 + 1e-9)
        assert bound == pytest.approx(n * 49152 * math.exp(log_eps) / 0.95)


def test_the_support_bound_holds_for_a_real_sampler() -> None:
    # a sampler drawing from p_T emits a token below eps at a rate <= the mass below eps <= V * eps
    rng = np.random.default_rng(0)
    V, t, eps = 300, 0.7, 2e-3
    logits = rng.normal(0, 3, size=(4000, V))
    p = np.exp(logits / t - np.logaddexp.reduce(logits / t, axis=1, keepdims=True))
    ids = [int(rng.choice(V, p=row)) for row in p]
    _, lpt = _support_from_logits(logits, ids, t)
    assert np.allclose(lpt, np.log(p[np.arange(len(ids)), ids]))
    below = float(np.mean(lpt < math.log(eps)))
    mass = float(np.mean(np.where(p < eps, p, 0).sum(axis=1)))
    assert mass <= V * eps
    assert below <= mass + 4 * math.sqrt(mass / len(ids)) + 1e-3  # what was drawn matches the mass below eps


def test_top_k_support_never_underestimates_p_t() -> None:
    rng = np.random.default_rng(4)
    for _ in range(50):
        lg = rng.normal(0, 3, size=500)
        lp1 = lg - np.logaddexp.reduce(lg)
        tok = int(rng.integers(500))
        t = float(rng.choice([0.5, 0.7, 1.3]))
        exact = lg[tok] / t - np.logaddexp.reduce(lg / t)
        top = [(float(lp1[i]), int(i)) for i in np.argsort(-lp1)[:20]]
        assert support_from_topk(float(lp1[tok]), top, tok, t) >= exact - 1e-9


def test_seeds_must_be_disjoint_unless_allowed() -> None:
    with pytest.raises(ValidationError, match="seeded identity"):
        LikelihoodConfig(seeds=[1, 2], baseline_seeds=[2, 3])
    assert LikelihoodConfig(seeds=[1, 2], baseline_seeds=[2, 3], allow_shared_seeds=True)
    with pytest.raises(ValidationError, match="power_families"):
        LikelihoodConfig(power_families=["nope"])


# ---------------------------------------------------------------------------- the real numpy model


@pytest.fixture(scope="module")
def scorer() -> Iterator:
    s = make_scorer("reference", GateConfig(), model="smollm2-135m-instruct")
    yield s
    s.close()


MSG = [{"role": "user", "content": "Write a short poem about the ocean."}]


def greedy(scorer, n: int = 24) -> str:
    j = scorer._judge
    prefix = scorer.prompt_ids(MSG)
    ids: list[int] = []
    for _ in range(n):
        row = j.logits(prefix, [*ids, 0])[-1]   # the logits after prefix + ids
        ids.append(int(np.argmax(row)))
    return j._tk._tok.decode(ids)


def test_the_prompt_is_the_models_own_chat_template(scorer) -> None:
    text = scorer._judge._tk._tok.decode(scorer.prompt_ids(MSG), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert "Write a short poem about the ocean.<|im_end|>" in text


def test_a_greedy_answer_scores_near_zero_and_a_shuffled_one_worse(scorer) -> None:
    text = greedy(scorer)
    g = scorer.score(MSG, text, 0.2, prompt_id="poem", seed=1)
    assert g.n_tokens >= 10 and g.error is None
    nll_t, nll_1 = -np.asarray(g.support_logprobs), -np.asarray(g.token_logprobs)
    assert g.mean_nll < 0.25 and float(np.median(nll_t)) < 0.01   # at T=0.2 the argmax holds most of p_T
    assert np.all(nll_t <= nll_1 + 1e-9)   # sharpening (T<1) only raises the most likely token's probability
    words = text.split()
    random.Random(0).shuffle(words)
    s = scorer.score(MSG, " ".join(words), 0.2, prompt_id="poem", seed=1)
    assert s.mean_nll > g.mean_nll + 2.0
    assert s.worst_window_nll > g.worst_window_nll
    # the end-of-turn token is scored when the answer stopped
    st = scorer.score(MSG, text, 1.0, prompt_id="poem", seed=1, stop=True)
    assert st.n_tokens == g.n_tokens + 1 and st.pieces[-1] == "<|im_end|>"


def test_t0_is_refused(scorer) -> None:
    with pytest.raises(ValueError, match="T>0"):
        scorer.score(MSG, "hello", 0.0)


def test_reference_scorer_refuses_another_model() -> None:
    with pytest.raises(UsageError, match="another model"):
        make_scorer("reference", GateConfig(), model="meta-llama/Llama-3.1-8B-Instruct")


def test_unknown_scorer_kind_is_bad_input() -> None:
    with pytest.raises(UsageError, match="'reference' or an http"):
        make_scorer("ftp://x", GateConfig())


def test_a_server_without_input_logprobs_cannot_score(embedded_target) -> None:
    # llama.cpp's server lists a model and tokenizes, but has no /generate with prompt log-probs
    with pytest.raises(UsageError, match="cannot return input log-probs"):
        make_scorer(embedded_target.url, GateConfig())
    with pytest.raises(UsageError, match=r"serves .* not the candidate's model 'other-model'"):
        make_scorer(embedded_target.url, GateConfig(), model="other-model")


def test_the_embedded_candidate_is_the_reference_models_own(embedded_target) -> None:
    # the llama.cpp candidate's /props names the reference model's file and /tokenize agrees token for token
    s = make_scorer("reference", GateConfig(), model="smollm2-135m-instruct", candidate_url=embedded_target.url)
    s.close()


@pytest.fixture
def other_tokenizer_server(http_peer) -> str:
    """A real local server whose /tokenize is another tokenizer (byte-level: one token per UTF-8 byte)."""

    def tokenize(_path: str, body: dict) -> tuple[int, str, bytes]:
        text = body.get("content") or body.get("prompt") or ""
        return 200, "application/json", json.dumps({"tokens": list(text.encode())}).encode()

    http_peer.on_post = tokenize
    return http_peer.url


@pytest.mark.integration
def test_a_candidate_with_another_tokenizer_is_refused(other_tokenizer_server: str) -> None:
    with pytest.raises(UsageError, match="another tokenizer"):
        make_scorer("reference", GateConfig(), model="smollm2-135m-instruct", candidate_url=other_tokenizer_server)


def sample(scorer, messages: list[dict[str, str]], t: float, seed: int, n: int = 14) -> str:
    """A real sampler: n tokens drawn from the reference model's own p_T (top_p 1)."""
    j, rng = scorer._judge, np.random.default_rng(seed)
    prefix = scorer.prompt_ids(messages)
    ids: list[int] = []
    for _ in range(n):
        row = np.asarray(j.logits(prefix, [*ids, 0])[-1], dtype=np.float64) / t
        p = np.exp(row - np.logaddexp.reduce(row))
        ids.append(int(rng.choice(p.size, p=p / p.sum())))
    return j._tk._tok.decode(ids)


@pytest.mark.slow
def test_the_whole_verdict_on_real_samples_of_the_model(scorer) -> None:
    from sglfleet.validation.likelihood import Answer, likelihood_verdicts

    # 4 + 4 answers over 2 prompts: with 3 + 3 the permutation test's smallest p, 2/20^2 = 0.005, is above the
    # 0.004 a statistic needs at one temperature, and such a plan never passes (smallest_p)
    cfg = GateConfig(likelihood=LikelihoodConfig(permutations=500, power_reps=20, power_permutations=200,
                                                 power_rates=[0.5, 1.0], min_answers=4))
    msgs = {"poem": MSG, "prose": [{"role": "user", "content": "Explain why the sky is blue."}]}
    cand = [Answer(p, 0.8, s, sample(scorer, m, 0.8, s)) for p, m in msgs.items() for s in (1, 2, 3, 7)]
    base = [Answer(p, 0.8, s, sample(scorer, m, 0.8, s)) for p, m in msgs.items() for s in (4, 5, 6, 8)]
    [v] = likelihood_verdicts(cand, base, scorer, cfg, msgs.__getitem__)
    assert v.ok, v.reason
    assert v.n_candidate == v.n_baseline == 8 and v.support["exact"]
    assert v.support["min_log_p_T"] > v.support["log_eps"] + 5   # real samples sit far above the limit
    assert v.power["estimated"] and v.power["n_variants"] > 0
    # the same answers with their words shuffled: the engine's word order gone wrong
    bad = [Answer(a.prompt_id, a.temperature, a.seed, " ".join(random.Random(a.seed).sample(a.text.split(),
                                                                                           len(a.text.split()))))
           for a in cand]
    [w] = likelihood_verdicts(bad, base, scorer, cfg.model_copy(update={"likelihood": cfg.likelihood.model_copy(
        update={"power_reps": 0})}), msgs.__getitem__)
    assert not w.ok and w.evidence


def test_a_llamacpp_candidate_serving_another_file_is_refused(http_peer) -> None:
    from pathlib import Path

    from sglfleet.textscore.judge import judge_model_path

    props = lambda path: (200, "application/json", json.dumps({"model_path": path}).encode())  # noqa: E731
    http_peer.routes["/props"] = props("/models/Meta-Llama-3-8B-Instruct.Q4_K_M.gguf")
    with pytest.raises(UsageError, match="another model"):
        make_scorer("reference", GateConfig(), candidate_url=http_peer.url)
    # the same file on another machine (its path does not exist here): accepted by name
    http_peer.routes["/props"] = props("/srv/elsewhere/" + Path(judge_model_path()).name)
    make_scorer("reference", GateConfig(), candidate_url=http_peer.url).close()


def test_answer_seeds_give_every_answer_its_own_sampler_stream() -> None:
    from sglfleet.validation.likelihood import answer_seed

    cfg = LikelihoodConfig()
    seeds = [answer_seed(s, p, t) for s in cfg.seeds + cfg.baseline_seeds for p in PROMPTS for t in (0.6, 0.8, 1.0)]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2**31 for s in seeds)
    assert answer_seed(1234, "poem", 0.8) == answer_seed(1234, "poem", 0.8)   # reproducible


def _exact_min_p(sizes: list[tuple[int, int]], values: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The exact stratified test's p for these values: every within-stratum labelling enumerated."""
    from itertools import combinations, product

    per = []
    for (c, _b), (xc, xb) in zip(sizes, values, strict=True):
        x = np.concatenate([xc, xb])
        sd = max(float(x.std()), 0.05)
        per.append([(x[list(ix)].mean() - np.delete(x, list(ix)).mean()) / sd
                    for ix in combinations(range(x.size), c)])
    obs = sum(d[0] for d in per)  # combinations() starts with the first c indices: the observed labelling
    all_s = [sum(t) for t in product(*per)]
    return sum(abs(s) >= abs(obs) - 1e-12 for s in all_s) / len(all_s)


@pytest.mark.parametrize("sizes", [[(1, 1)] * 3, [(1, 2)] * 2, [(2, 2)] * 2, [(1, 1), (2, 1)]])
def test_smallest_p_is_the_floor_of_perfectly_separated_answers(sizes: list[tuple[int, int]]) -> None:
    """Candidate answers far above every baseline answer in every prompt: the exact test gives its smallest
    p, the Monte Carlo test that p up to its sampling error, and smallest_p says it in advance."""
    from sglfleet.validation.likelihood import smallest_p

    vals = [(np.arange(c, dtype=float) + 10.0, np.arange(b, dtype=float)) for c, b in sizes]
    floor = smallest_p(sizes, 20000)
    assert floor == pytest.approx(_exact_min_p(sizes, vals))
    got = permutation_test({f"p{i}": c for i, (c, _) in enumerate(vals)}, {f"p{i}": b for i, (_, b) in enumerate(vals)},
                           20000, 1, 0.05)["p_value"]
    assert got == pytest.approx(floor, rel=0.15)


def test_a_plan_whose_test_cannot_fail_is_named_and_never_passes() -> None:
    """One answer a side per prompt (the corruptible test bed's profile until 2026-12-04): over 8 prompts the
    smallest p is 2/256, above what each statistic needs, so even answers shifted by 3 nats 'passed'."""
    from sglfleet.validation.likelihood import design_problem

    one = LikelihoodConfig(seeds=[1], baseline_seeds=[2], permutations=1000, power_reps=0)
    assert "could never fail" in (design_problem(one, 8, 1) or "")
    assert design_problem(LikelihoodConfig(), 8, 3) is None
    assert design_problem(LikelihoodConfig(seeds=[1, 2], baseline_seeds=[3, 4, 5, 6]), 8, 1) is None
    cand, base = sides(np.random.default_rng(4), k=1, shift=3.0)
    v = likelihood_test(cand, base, one, 1, top_p=0.95)
    assert not v.ok and "smallest possible p" in v.reason and "never passes" in v.reason


def test_the_gate_refuses_such_a_plan_before_any_request(tmp_path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "gate.yaml"
    cfg.write_text("gate:\n  temperatures: [0, 0.8]\n  baseline_url: http://127.0.0.1:9\n"
                   "  likelihood: {seeds: [1234], baseline_seeds: [4321]}\n")
    for cmd in (["run", "--target", "http://127.0.0.1:9", "--config", str(cfg), "--no-judge"],
                ["record-baseline", "--target", "http://127.0.0.1:9", "--config", str(cfg),
                 "--out", str(tmp_path / "b.json")]):
        r = subprocess.run([sys.executable, "-m", "sglfleet.validation", *cmd], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 2, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: likelihood:") and "could never fail" in lines[0]
    assert not (tmp_path / "b.json").exists()


def test_the_power_estimate_can_reject_at_three_temperatures() -> None:
    """At three T>0 temperatures each statistic needs p < 8.9e-4, below what the power estimate's 500 Monte
    Carlo permutations can give (1/501): until 2026-12-04 every simulated candidate passed the statistics, and
    the H200 gates reported a rejection rate of 0 even with every answer corrupted. The estimate now decides
    on the permutation distribution's normal approximation."""
    rng = np.random.default_rng(21)
    cand, base = sides(rng)
    variants = [fake_answer(a.prompt_id, a.temperature, 900 + i, rng, shift=2.0, level=0.3 + 0.2 * PROMPTS.index(
        a.prompt_id)) for i, a in enumerate(base)]
    lc = LikelihoodConfig(power_reps=40, power_permutations=500, power_rates=[0.5, 1.0])
    v = likelihood_test(cand, base, lc, 3, variants=variants, top_p=0.95)
    assert v.statistic["alpha_per_statistic"] < 1 / 501
    rates = v.power["rejection_rate"]
    assert rates["1"] == 1.0 and rates["0"] <= 0.1, rates
    assert v.power["min_detectable_rate"] is not None
