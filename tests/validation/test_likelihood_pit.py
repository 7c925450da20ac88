"""The likelihood test's mid-PIT statistic (validation/likelihood.py, `pit_lag1`): the mid-PIT itself (exact mean
1/2 under its own law, the same from full logits and from a top-k list that holds the whole vocabulary), and
the verdict on a small Markov "model" sampled by a correct sampler and by an inverse-CDF sampler whose draws
share one uniform across a step while every token keeps its law (the class the NLL statistics cannot see).
Not covered: a Gumbel-max sampler sharing its noise vector across positions (SGLang's seeded sampler keyed by
the wrong position) keeps the vocabulary-order PITs uncorrelated; docs/likelihood.md says so."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from sglfleet.validation.config import LikelihoodConfig
from sglfleet.validation.likelihood import likelihood_test
from sglfleet.validation.scorers import AnswerScore, _scores_from_logits, pit_from_topk, pit_of_row

V = 48          # vocabulary of the toy model
T = 0.8
PROMPTS = ("a", "b", "c", "d", "e", "f", "g", "h")
LC = LikelihoodConfig(permutations=2000, power_reps=0)


def test_the_mid_pit_has_mean_one_half_under_its_own_law() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        lp = np.round(rng.normal(0, 2, size=30) * 8) / 8  # a coarse grid: ties, as bf16 log-probs have
        p = np.exp(lp - lp.max())
        p /= p.sum()
        row = {i: float(v) for i, v in enumerate(lp)}
        assert sum(p[i] * pit_of_row(row, i) for i in range(30)) == pytest.approx(0.5, abs=1e-12)


def test_full_logits_and_a_whole_vocabulary_top_k_give_the_same_pit() -> None:
    rng = np.random.default_rng(1)
    logits = (rng.normal(0, 3, size=(5, 200))).astype(np.float32)
    ids = [int(i) for i in rng.integers(0, 200, size=5)]
    _, lpt, pit = _scores_from_logits(logits, ids, T)
    for k, i in enumerate(ids):
        lp1 = logits[k].astype(np.float64) - np.log(np.exp(logits[k].astype(np.float64)).sum())
        top = [(float(v), j) for j, v in enumerate(lp1) if j != i]
        assert pit_from_topk(float(lp1[i]), top, i, T) == pytest.approx(pit[k], abs=1e-5)
        q = np.exp(logits[k].astype(np.float64) / T)
        q /= q.sum()
        assert pit[k] == pytest.approx(q[:i].sum() + q[i] / 2, abs=1e-5)
        assert lpt[k] == pytest.approx(np.log(q[i]), abs=1e-4)


# ---------------------------------------------------------------------------- a toy model and its samplers

def _model(prompt: str) -> np.ndarray:
    """Logits of the next token given the previous one: a per-prompt random Markov chain."""
    return np.random.default_rng(sum(map(ord, prompt))).normal(0, 2.5, size=(V, V))


def _probs(w: np.ndarray, prev: int) -> np.ndarray:
    z = w[prev] / T
    p = np.exp(z - z.max())
    return p / p.sum()


Sampler = Callable[[np.ndarray, int, np.random.Generator], list[int]]


def independent(w: np.ndarray, n: int, rng: np.random.Generator) -> list[int]:
    """A correct sampler: one fresh uniform per token, inverse CDF in id order."""
    out, prev = [], 0
    for _ in range(n):
        c = np.cumsum(_probs(w, prev))
        prev = int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), V - 1))
        out.append(prev)
    return out


def shared_uniform(w: np.ndarray, n: int, rng: np.random.Generator, step: int = 4) -> list[int]:
    """Every token still drawn from its own law, but one uniform serves the `step` tokens of a verify step."""
    out, prev = [], 0
    for k in range(n):
        if k % step == 0:
            u = rng.random()
        c = np.cumsum(_probs(w, prev))
        prev = int(min(np.searchsorted(c, u * c[-1], side="right"), V - 1))
        out.append(prev)
    return out


def speculative(w: np.ndarray, n: int, rng: np.random.Generator) -> list[int]:
    """Speculative sampling of one drafted token per step from a drafter q (the chain, perturbed): accept with
    probability min(1, p/q), else draw from the residual max(p - q, 0) by inverse CDF with a fresh uniform.
    Exact: the null of the test, through the rule a speculative engine runs."""
    dq = w + np.random.default_rng(int(abs(w[0, 0]) * 1e6)).normal(0, 1.5, size=(V, V))  # a drafter close to p
    out, prev = [], 0
    for _ in range(n):
        p = _probs(w, prev)
        q = _probs(dq, prev)
        d = int(min(np.searchsorted(np.cumsum(q), rng.random(), side="right"), V - 1))
        u = rng.random()
        if u < min(1.0, p[d] / q[d]):
            prev = d
        else:
            r = np.maximum(p - q, 0.0)
            c = np.cumsum(r / r.sum())
            v = rng.random()
            prev = int(min(np.searchsorted(c, v * c[-1], side="right"), V - 1))
        out.append(prev)
    return out


def _score(prompt: str, toks: list[int], seed: int) -> AnswerScore:
    w = _model(prompt)
    logits = np.stack([w[p] for p in [0, *toks[:-1]]]).astype(np.float32)
    lp1, lpt, pit = _scores_from_logits(logits, toks, T)
    return AnswerScore(prompt, T, seed, tuple(lp1.tolist()), tuple(lpt.tolist()), tuple("x" for _ in toks), 16,
                       vocab=V, pit=tuple(pit.tolist()))


def _sides(cand: Sampler, rng: np.random.Generator, k: int = 3, n: int = 48
           ) -> tuple[list[AnswerScore], list[AnswerScore]]:
    c = [_score(p, cand(_model(p), n, rng), 100 + s) for p in PROMPTS for s in range(k)]
    b = [_score(p, independent(_model(p), n, rng), 200 + s) for p in PROMPTS for s in range(k)]
    return c, b


@pytest.mark.parametrize("sampler", [independent, speculative], ids=["plain", "speculative"])
def test_a_correct_sampler_passes_at_about_alpha(sampler: Sampler) -> None:
    fails = sum(not likelihood_test(*_sides(sampler, np.random.default_rng(300 + i)), LC, 3, top_p=1.0).ok
                for i in range(40))
    # alpha per temperature is 0.0033 over the support check and three statistics: 0.13 expected in 40
    assert fails <= 2


@pytest.mark.parametrize("step", [2, 4])
def test_draws_that_share_a_uniform_are_refused_by_pit_lag1(step: int) -> None:
    def sampler(w: np.ndarray, n: int, rng: np.random.Generator) -> list[int]:
        return shared_uniform(w, n, rng, step)

    v = likelihood_test(*_sides(sampler, np.random.default_rng(7)), LC, 3, top_p=1.0)
    st = v.statistic
    assert not v.ok and st["pit_lag1"]["p_value"] < st["alpha_per_statistic"], (v.reason, st["pit_lag1"])
    assert st["pit_lag1"]["z"] > 0 and "not drawn independently" in v.reason
    assert not v.support["impossible"]  # every token is one its law allows: only the dependence gives it away


def test_without_pits_the_statistic_is_not_computed_and_its_alpha_not_spent() -> None:
    c, b = _sides(independent, np.random.default_rng(11))
    strip = lambda xs: [AnswerScore(a.prompt_id, a.temperature, a.seed, a.token_logprobs,  # noqa: E731
                                    a.support_logprobs, a.pieces, 16, vocab=V) for a in xs]
    v = likelihood_test(strip(c), strip(b), LC, 3, top_p=1.0)
    w = likelihood_test(c, b, LC, 3, top_p=1.0)
    assert "pit_lag1" not in v.statistic and v.statistic["not_computed"] == ["pit_lag1"]
    assert w.statistic["not_computed"] == [] and "pit_lag1" in w.statistic
    assert v.statistic["alpha_per_statistic"] == w.statistic["alpha_per_statistic"]
    assert v.statistic["mean_nll"]["p_value"] == w.statistic["mean_nll"]["p_value"]


def test_lag1_is_zero_for_short_or_flat_answers() -> None:
    a = AnswerScore("a", T, 1, (-1.0, -1.0), (-1.0, -1.0), ("x", "x"), 16, pit=(0.2, 0.9))
    flat = AnswerScore("a", T, 1, (-1.0,) * 5, (-1.0,) * 5, ("x",) * 5, 16, pit=(0.5,) * 5)
    none = AnswerScore("a", T, 1, (-1.0,), (-1.0,), ("x",), 16)
    assert a.pit_lag1 == 0.0 and flat.pit_lag1 == 0.0 and none.pit_lag1 is None
