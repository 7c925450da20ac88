"""The corruptible speculative engine (testbed/corruptible): exact when correct, wrong when faulted, and served
the way the gate talks to servers.

The engine runs in process here (the real numpy model, one BLAS thread); the server tests start it as a
child process (integration)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from sglfleet.validation.tokenlaw import chi2_sf
from testbed.corruptible.drafter import Drafter, Tree
from testbed.corruptible.engine import (
    BATCH_FAULTS,
    DFLASH_BLOCK,
    FAULTS,
    SAMPLER_FAULTS,
    VERIFY_FAULTS,
    Engine,
    EngineConfig,
    Request,
    set_blas_threads,
)
from testbed.corruptible.engine import (
    HELDOUT_FAULTS as BLIND_HELDOUT_FAULTS,
)
from testbed.corruptible.sampling import (
    accept_tree,
    emitted_law,
    node_probs,
    point_mass,
    sample,
    speculative_accept,
    target_probs,
    total_variation,
)

REPO = Path(__file__).resolve().parents[2]
PROSE = "In one paragraph, explain why the sky looks blue during the day."
POEM = "Write a short poem about the ocean."


def _chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """P-value of Pearson's chi-square goodness of fit (cells with expected < 5 pooled into one)."""
    n = counts.sum()
    exp_ = probs * n
    big = exp_ >= 5
    obs = np.append(counts[big], counts[~big].sum())
    ex = np.append(exp_[big], exp_[~big].sum())
    keep = ex > 0
    obs, ex = obs[keep], ex[keep]
    stat = float(((obs - ex) ** 2 / ex).sum())
    return chi2_sf(stat, len(obs) - 1)  # the gate's own chi-square tail (tests/validation/test_tokenlaw.py)


# ---------------------------------------------------------------------------- the acceptance rule


def test_target_probs_cuts_top_k_and_top_p() -> None:
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    assert np.allclose(target_probs(logits, 1.0), [0.5, 0.2, 0.15, 0.1, 0.05])
    assert np.allclose(target_probs(logits, 1.0, top_k=2), [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0])
    # top_p 0.8: 0.5 + 0.2 < 0.8, the third token crosses it and is kept
    assert np.allclose(target_probs(logits, 1.0, top_p=0.8), [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0])
    hot = target_probs(logits, 2.0)
    assert hot[0] < 0.5 and hot[-1] > 0.05
    with pytest.raises(ValueError):
        target_probs(logits, 0.0)


def _rule_counts(p: np.ndarray, q: np.ndarray, n: int, rng: np.random.Generator, broken: bool = False) -> np.ndarray:
    counts = np.zeros(len(p), dtype=np.int64)
    for _ in range(n):
        x = sample(q, rng)
        ok, r = speculative_accept(p, q, x, rng)
        if broken:  # a wrong rule: every draft accepted
            ok = True
        counts[x if ok else sample(r, rng)] += 1
    return counts


def test_speculative_accept_gives_the_target_distribution_and_the_test_can_fail() -> None:
    rng = np.random.default_rng(20261203)
    p = np.array([0.35, 0.25, 0.2, 0.1, 0.06, 0.04])
    q = np.array([0.05, 0.1, 0.4, 0.05, 0.3, 0.1])
    assert _chi2_p(_rule_counts(p, q, 20000, rng), p) > 1e-3
    # the same test rejects a rule that accepts every draft (its output is q, not p)
    assert _chi2_p(_rule_counts(p, q, 20000, rng, broken=True), p) < 1e-6


def test_no_residual_walk_over_represents_a_rejected_draft() -> None:
    """The `no_residual` fault: one drafted child x at the root. The right walk emits p; the faulted one draws
    from p again after rejecting x, so x comes out with probability p(x) + (1 - p(x)) p(x)."""
    p = np.array([0.4, 0.3, 0.2, 0.1])
    tree = Tree([9, 0], [-1, 0], [0, 1])
    rng = np.random.default_rng(20261204)

    def firsts(residual: bool) -> np.ndarray:
        counts = np.zeros(len(p), dtype=np.int64)
        for _ in range(20000):
            path, bonus = accept_tree(tree.children(), tree.tokens, lambda _u: p, rng, residual=residual)
            counts[tree.tokens[path[1]] if len(path) > 1 else bonus] += 1
        return counts

    assert _chi2_p(firsts(True), p) > 1e-3
    bad = firsts(False)
    assert _chi2_p(bad, p) < 1e-6
    assert abs(bad[0] / bad.sum() - (0.4 + 0.6 * 0.4)) < 0.02


HELDOUT_FAULTS = ("heldout_a", "heldout_b")


def _fit_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """_chi2_p, and 0 when a token outside the support of probs was drawn."""
    return 0.0 if counts[probs <= 0].sum() > 0 else _chi2_p(counts, probs)


@pytest.mark.parametrize("fault", HELDOUT_FAULTS)
def test_heldout_fault_walk_departs_from_the_target(fault: str) -> None:
    """heldout_a / heldout_b (docs/corruptible-engine.md). A small synthetic tree at T=0.8, top-p 0.85: the right
    walk's first token follows the target's distribution, the faulted walk's does not."""
    logits = {0: np.log([0.35, 0.25, 0.2, 0.1, 0.06, 0.04]) * 0.8,
              1: np.log([0.1, 0.4, 0.2, 0.15, 0.1, 0.05]) * 0.8,
              2: np.log(np.full(6, 1 / 6)) * 0.8,
              3: np.log([0.3, 0.2, 0.2, 0.1, 0.1, 0.1]) * 0.8}
    tree = Tree([9, 0, 2, 1], [-1, 0, 0, 1], [0, 1, 1, 2])
    kids = tree.children()
    want = target_probs(logits[0], 0.8, 0.85)
    assert np.count_nonzero(want) == 4

    def firsts(f: str | None, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        dists = {u: node_probs(row, 0.8, 0.85, None, f) for u, row in logits.items()}
        counts = np.zeros(6, dtype=np.int64)
        for _ in range(20000):
            path, bonus = accept_tree(kids, tree.tokens, lambda u: dists[u], rng, fault=f)
            counts[tree.tokens[path[1]] if len(path) > 1 else bonus] += 1
        return counts

    assert _fit_p(firsts(None, 20261205), want) > 1e-3
    assert _fit_p(firsts(fault, 20261205), want) < 1e-6
    # greedy: the faults leave the T=0 walk alone
    for f in (None, fault):
        assert accept_tree(kids, tree.tokens, lambda u: logits[u], None, fault=f) == ([0, 1, 3], 0)


@pytest.mark.parametrize("fault", [None, "no_residual", "heldout_b"])
def test_emitted_law_is_the_walks_law(fault: str | None) -> None:
    """emitted_law (the exact law of the token a walk emits at a node, used to measure a fault's strength) against
    the walk itself: 40,000 first tokens of a root with three drafted children, one of them the most likely."""
    p = target_probs(np.log([0.32, 0.22, 0.18, 0.12, 0.08, 0.05, 0.03]), 0.8, 0.95)
    kids_tokens = [0, 3, 5]
    tree = Tree([9, *kids_tokens], [-1, 0, 0, 0], [0, 1, 1, 1])
    rng = np.random.default_rng(20261205)
    counts = np.zeros(p.size, dtype=np.int64)
    for _ in range(40000):
        path, bonus = accept_tree(tree.children(), tree.tokens, lambda _u: p, rng, residual=fault != "no_residual",
                                  fault=fault)
        counts[tree.tokens[path[1]] if len(path) > 1 else bonus] += 1
    law = emitted_law(p, kids_tokens, residual=fault != "no_residual", held_last=fault == "heldout_b")
    assert abs(law.sum() - 1) < 1e-12 and _fit_p(counts, law) > 1e-3
    if fault is None:
        assert np.allclose(law, p, atol=1e-12)  # recursive rejection sampling is exact
    else:
        assert total_variation(law, p) > 0.01 and _fit_p(counts, p) < 1e-6


def test_accept_tree_is_exact_for_a_tree_of_deterministic_drafts() -> None:
    """Root children a=0, b=2 (a has child c=1): the first token must follow p_root, the token after a
    must follow p_a, whichever children were drafted."""
    rng = np.random.default_rng(7)
    p_root = np.array([0.3, 0.1, 0.25, 0.2, 0.15])
    p_a = np.array([0.1, 0.5, 0.1, 0.2, 0.1])
    p_c = np.array([0.2, 0.2, 0.2, 0.2, 0.2])
    tokens, parents = [9, 0, 2, 1], [-1, 0, 0, 1]
    tree = Tree(tokens, parents, [0, 1, 1, 2])
    dists = {0: p_root, 1: p_a, 2: np.full(5, 0.2), 3: p_c}
    first = np.zeros(5, dtype=np.int64)
    second_after_a = np.zeros(5, dtype=np.int64)
    for _ in range(20000):
        path, bonus = accept_tree(tree.children(), tokens, lambda u: dists[u], rng)
        out = [tokens[u] for u in path[1:]] + [bonus]
        first[out[0]] += 1
        if out[0] == 0:
            second_after_a[out[1]] += 1
    assert _chi2_p(first, p_root) > 1e-3
    assert _chi2_p(second_after_a, p_a) > 1e-3
    # greedy: descend while a child carries the argmax (root -> a=0 -> c=1, then 3 is c's argmax)
    lg = {0: np.log(p_root), 1: np.log(p_a), 2: np.log(np.full(5, 0.2)), 3: np.log([0.1, 0.1, 0.1, 0.6, 0.1])}
    path, bonus = accept_tree(tree.children(), tokens, lambda u: lg[u], None)
    assert (path, bonus) == ([0, 1, 3], 3)


def test_point_mass_residual_removes_the_rejected_token() -> None:
    p = np.array([0.5, 0.3, 0.2])

    rng = np.random.default_rng(0)
    while True:  # draw until the rule rejects token 0 (probability 0.5 each time)
        ok, r = speculative_accept(p, point_mass(3, 0), 0, rng)
        if not ok:
            break
    assert np.allclose(r, [0, 0.6, 0.4])


# ---------------------------------------------------------------------------- the drafter


def test_drafter_builds_a_real_tree_within_budget_depth_and_topk() -> None:
    d = Drafter(budget=11, topk=3, max_depth=DFLASH_BLOCK - 1)
    ctx = [5, 6, 7, 8, 5, 6, 9, 10, 11, 5, 6]
    d.extend(ctx)
    rng = np.random.default_rng(1)
    d.observe(ctx, rng.normal(size=(len(ctx), 50)).astype(np.float32))
    t = d.draft(6)
    assert t.width == 12
    assert all(0 <= p < i for i, p in enumerate(t.parents) if i > 0)
    assert max(t.depths) <= DFLASH_BLOCK - 1
    kids = t.children()
    assert all(len(k) <= 3 for k in kids)
    assert all(len({t.tokens[c] for c in k}) == len(k) for k in kids)  # siblings carry distinct tokens
    assert max(len(k) for k in kids) >= 2  # a tree, not a chain
    # prompt lookup: after ...5, 6 the context continued with 7 and 9: the first child is the latest (9)
    assert t.tokens[kids[0][0]] == 9
    m = t.mask()
    assert m.diagonal().all() and not np.array_equal(m, np.tril(np.ones_like(m)))
    for i, p in enumerate(t.parents):
        if p >= 0:
            assert (m[i] >= m[p]).all() and m[i, p]


# ---------------------------------------------------------------------------- the engine, in process


@pytest.fixture(scope="module")
def blas1() -> None:
    set_blas_threads(1)  # shared cores: 2 BLAS threads run these matmuls many times slower


@pytest.fixture(scope="module")
def plain(blas1: None) -> Engine:
    return Engine(EngineConfig(speculative=False))


def _ids(e: Engine, prompt: str) -> list[int]:
    return e.encode(e.render([{"role": "user", "content": prompt}]))


def _greedy(e: Engine, ids: list[int], n: int) -> list[int]:
    return [t.token for t in e.generate(Request(ids, n)).tokens]


def test_target_only_engine_is_the_reference_model(plain: Engine) -> None:
    """The KV-cached decode equals refmodel's whole-sequence forward pass, greedy token for token."""
    ids = _ids(plain, "What is the capital of France? Answer in one sentence.")
    got = _greedy(plain, ids, 12)
    seq = list(ids)
    for _ in range(len(got)):
        h = plain.lm.hidden(seq)
        seq.append(int(np.argmax(h[-1] @ plain.lm.out_t)))
    want = [t for t in seq[len(ids):]]
    assert got == want[:len(got)] and len(got) >= 6


@pytest.mark.parametrize(("budget", "topk"), [(5, 4), (11, 2)])
def test_speculative_greedy_equals_plain_greedy(plain: Engine, budget: int, topk: int) -> None:
    spec = Engine(EngineConfig(budget=budget, topk=topk))
    for prompt in (POEM, PROSE):
        ids = _ids(plain, prompt)
        gen = spec.generate(Request(ids, 48))
        assert [t.token for t in gen.tokens] == _greedy(plain, ids, 48)
        assert gen.verify_steps > 0 and gen.draft_n == gen.verify_steps * budget
        assert gen.draft_accepted > 0   # the drafter is real: some drafts are accepted


@pytest.mark.parametrize("fault", VERIFY_FAULTS)
def test_each_fault_changes_the_t0_answer(plain: Engine, fault: str) -> None:
    e = Engine(EngineConfig(fault=fault))
    assert e.cfg.verify_width != DFLASH_BLOCK
    ids = _ids(plain, PROSE)
    assert [t.token for t in e.generate(Request(ids, 32)).tokens] != _greedy(plain, ids, 32)


@pytest.mark.parametrize("fault", SAMPLER_FAULTS)
def test_sampler_faults_keep_t0_exact(plain: Engine, fault: str) -> None:
    """A sampler fault lives in the T>0 walk only: greedy decoding stays the target's, token for token (so
    `lossless_t0` cannot see it; only the T>0 verdict can)."""
    e = Engine(EngineConfig(fault=fault))
    ids = _ids(plain, PROSE)
    assert [t.token for t in e.generate(Request(ids, 32)).tokens] == _greedy(plain, ids, 32)


def test_verify_temperature_is_harmless_at_t1_and_wrong_below(blas1: None) -> None:
    """Same seed, same engine settings: at T=1 the faulted engine samples what the right one samples; at
    T=0.6 the verify pass samples at T=1 and the answers part."""
    ok, bad = Engine(EngineConfig()), Engine(EngineConfig(fault="verify_temperature"))
    ids = _ids(ok, POEM)

    def run(e: Engine, temp: float) -> list[int]:
        return [t.token for t in e.generate(Request(ids, 24, temp, None, None, 7)).tokens]

    assert run(bad, 1.0) == run(ok, 1.0)
    right, wrong = run(ok, 0.6), run(bad, 0.6)
    assert wrong != right and wrong[0] == right[0]   # the first token comes from the prefill, before any verify
    # the engine's walk takes the no_residual fault too (the rule itself: the test above); it changes a draw
    # only after a rejection whose residual moves the sampled token, here within 24 tokens at T=1
    assert run(Engine(EngineConfig(fault="no_residual")), 1.0) != run(ok, 1.0)


@pytest.mark.parametrize("fault", HELDOUT_FAULTS)
def test_heldout_fault_changes_seeded_t08_output_only(plain: Engine, fault: str) -> None:
    """heldout_a / heldout_b (docs/corruptible-engine.md). Greedy: the faulted speculative engine's tokens are the
    target's; at T=0.8, top-p 0.95 (the gate's sampling) with the same seed they part from the right engine's."""
    ok, bad = Engine(EngineConfig()), Engine(EngineConfig(fault=fault))
    ids = _ids(plain, POEM)
    assert [t.token for t in bad.generate(Request(ids, 16)).tokens] == _greedy(plain, ids, 16)

    def run(e: Engine) -> list[int]:
        return [t.token for t in e.generate(Request(ids, 16, 0.8, 0.95, None, 11)).tokens]

    right, wrong = run(ok), run(bad)
    assert wrong != right and wrong[0] == right[0]


def test_mask_width_is_harmless_at_the_dflash_block_width(plain: Engine) -> None:
    e = Engine(EngineConfig(fault="mask_width", budget=DFLASH_BLOCK - 1))
    ids = _ids(plain, PROSE)
    assert [t.token for t in e.generate(Request(ids, 32)).tokens] == _greedy(plain, ids, 32)


def test_verify_mask_is_prefix_then_tree_and_mask_width_reads_other_bits(blas1: None) -> None:
    ok = Engine(EngineConfig(budget=5))
    bad = Engine(EngineConfig(budget=5, fault="mask_width"))
    bad8 = Engine(EngineConfig(budget=DFLASH_BLOCK - 1, fault="mask_width"))
    for e, w in ((ok, 6), (bad, 6), (bad8, 8)):
        tree = Tree([1] * w, [-1] + [0] * (w - 1), [0] + [1] * (w - 1))   # a star: every node a child of the root
        want = np.concatenate([np.ones((w, 20), dtype=bool), tree.mask()], axis=1)
        got = e.verify_bias(tree, 20) == 0
        assert np.array_equal(got, want) == (e is not bad)


def test_seeded_sampling_is_reproducible(plain: Engine) -> None:
    spec = Engine(EngineConfig())
    ids = _ids(plain, POEM)

    def run(seed: int) -> list[int]:
        return [t.token for t in spec.generate(Request(ids, 24, 0.8, 0.95, None, seed)).tokens]

    a = run(11)
    assert run(11) == a
    assert run(22) != a


def _together(e: Engine, reqs: list[Request]) -> list[list[int]]:
    """The requests sent at once from threads (they share the engine's running batch); their tokens."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(reqs)) as pool:
        return [[t.token for t in g.tokens] for g in pool.map(e.generate, reqs)]


def _mixed(plain: Engine) -> list[Request]:
    """Two greedy rows and two sampling rows with different parameters (one batch's worth)."""
    poem, prose = _ids(plain, POEM), _ids(plain, PROSE)
    return [Request(poem, 20), Request(poem, 20, 0.8, 0.95, None, 11), Request(prose, 20),
            Request(prose, 20, 0.6, None, 20, 5, min_p=0.05)]


def _alone(e: Engine, reqs: list[Request]) -> list[list[int]]:
    return [[t.token for t in e.generate(r).tokens] for r in reqs]


def test_concurrent_requests_share_steps_and_a_batch_changes_no_answer(plain: Engine) -> None:
    """The correct engine batches concurrent requests (steps held 3 or 4 rows) and every answer, greedy or
    seeded, is the one the request gets alone."""
    e = Engine(EngineConfig())
    reqs = _mixed(plain)
    alone = _alone(e, reqs)
    e.batch_sizes.clear()
    assert _together(e, reqs) == alone
    assert sum(n for size, n in e.batch_sizes.items() if size >= 3) > 5, e.batch_sizes


@pytest.mark.parametrize("fault", BATCH_FAULTS)
def test_batch_faults_keep_t0_exact_and_change_batched_draws(plain: Engine, fault: str) -> None:
    """Each batch fault leaves greedy rows exact in a mixed batch. row_params and shared_rng draw right for a
    request alone and wrongly beside another sampling row; step_rng_replay draws wrongly even alone, the same
    way for the same seed."""
    ok, bad = Engine(EngineConfig()), Engine(EngineConfig(fault=fault))
    reqs = _mixed(plain)
    want = _alone(ok, reqs)
    got = _together(bad, reqs)
    assert got[0] == want[0] and got[2] == want[2]          # the greedy rows
    assert got[1] != want[1] or got[3] != want[3]           # the sampling rows
    alone = _alone(bad, [reqs[1], reqs[3]])
    if fault == "step_rng_replay":
        assert alone != [want[1], want[3]] and _alone(bad, [reqs[1], reqs[3]]) == alone
    else:
        assert alone == [want[1], want[3]]


# ---------------------------------------------------------------------------- faults written blind to the gate


def _sampled(e: Engine, ids: list[int], seed: int, top_p: float | None = 0.95, n: int = 40) -> list[int]:
    return [t.token for t in e.generate(Request(ids, n, 0.8, top_p, None, seed)).tokens]


def test_blind_heldout_faults_are_the_engines() -> None:
    assert BLIND_HELDOUT_FAULTS == ("heldout_c", "heldout_d", "heldout_e")
    assert set(BLIND_HELDOUT_FAULTS) <= set(FAULTS)


def test_heldout_c_rows_by_depth_keeps_t0_and_changes_tree_draws(plain: Engine) -> None:
    """heldout_c: the T>0 walk reads node u's row at h[depth(u)]. Greedy answers are the target's; at T=0.8, top-p
    0.95 the same seeds give other answers (a later sibling gets accepted now and then); with top-k 1 every tree
    is a chain (node d at depth d), where the fault is harmless."""
    ok, bad = Engine(EngineConfig()), Engine(EngineConfig(fault="heldout_c"))
    ids = _ids(plain, POEM)
    assert [t.token for t in bad.generate(Request(ids, 32)).tokens] == _greedy(plain, ids, 32)
    assert [_sampled(bad, ids, s) for s in (11, 12)] != [_sampled(ok, ids, s) for s in (11, 12)]
    chain_ok, chain_bad = Engine(EngineConfig(topk=1)), Engine(EngineConfig(topk=1, fault="heldout_c"))
    assert _sampled(chain_bad, ids, 11, n=24) == _sampled(chain_ok, ids, 11, n=24)


def test_heldout_d_top_p_cut_drops_the_crossing_token(plain: Engine) -> None:
    """heldout_d: the top-p cut keeps only the tokens whose cumulative mass is below top_p. On a row whose nucleus
    at 0.85 holds 4 tokens the fault keeps 3; at least one token is kept; top-p 1 is untouched. In the engine:
    greedy answers are the target's, T=0.8 top-p 0.95 answers part with the same seeds, and without top-p the
    faulted engine samples what the right one samples."""
    row = np.log([0.35, 0.25, 0.2, 0.1, 0.06, 0.04]) * 0.8
    assert np.count_nonzero(node_probs(row, 0.8, 0.85)) == 4
    assert np.count_nonzero(node_probs(row, 0.8, 0.85, None, "heldout_d")) == 3
    assert np.count_nonzero(node_probs(row, 0.8, 0.05, None, "heldout_d")) == 1
    assert np.array_equal(node_probs(row, 0.8, None, None, "heldout_d"), node_probs(row, 0.8))
    ok, bad = Engine(EngineConfig()), Engine(EngineConfig(fault="heldout_d"))
    ids = _ids(plain, PROSE)
    assert [t.token for t in bad.generate(Request(ids, 32)).tokens] == _greedy(plain, ids, 32)
    assert [_sampled(bad, ids, s) for s in (11, 12)] != [_sampled(ok, ids, s) for s in (11, 12)]
    assert _sampled(bad, ids, 11, None, 24) == _sampled(ok, ids, 11, None, 24)


def test_heldout_e_any_greedy_row_makes_the_step_greedy(plain: Engine) -> None:
    """heldout_e: the step's all-greedy flag is any(). In a batch of two greedy and two seeded sampling requests the
    greedy answers are exact and the sampling rows are decoded greedily while they share steps with greedy rows
    (their answers change); alone, or batched with sampling rows only, they are the right engine's."""
    ok, bad = Engine(EngineConfig()), Engine(EngineConfig(fault="heldout_e"))
    reqs = _mixed(plain)
    want = _alone(ok, reqs)
    got = _together(bad, reqs)
    assert got[0] == want[0] and got[2] == want[2]          # the greedy rows
    assert got[1] != want[1] or got[3] != want[3]           # the sampling rows
    assert _alone(bad, [reqs[1], reqs[3]]) == [want[1], want[3]]
    assert _together(bad, [reqs[1], reqs[3]]) == [want[1], want[3]]


def test_acceptance_on_a_real_verify_step_follows_the_target(blas1: None) -> None:
    """One real verify pass (prompt, root = the target's greedy next token): the acceptance walk, drawn
    many times, emits its first token as the target's distribution at T=0.8, top-p 0.95 says, and the token
    after the most accepted child as the target's distribution at that child."""
    e = Engine(EngineConfig(budget=7, topk=4))
    ids = _ids(e, POEM)
    root = int(np.argmax(e.lm.hidden(ids)[-1] @ e.lm.out_t))
    tree, logits = e.verify_rows(ids, root)
    dists = {u: target_probs(logits[u], 0.8, 0.95) for u in range(tree.width)}
    kids = tree.children()
    rng = np.random.default_rng(3)
    firsts: list[int] = []
    pairs: list[tuple[int, int]] = []
    for _ in range(6000):
        path, bonus = accept_tree(kids, tree.tokens, lambda u: dists[u], rng)
        out = [tree.tokens[u] for u in path[1:]] + [bonus]
        firsts.append(out[0])
        if len(path) > 1:
            pairs.append((path[1], out[1]))
    support = np.flatnonzero(dists[0])
    counts = np.array([firsts.count(int(t)) for t in support])
    assert _chi2_p(counts, dists[0][support]) > 1e-3
    assert pairs, "no drafted child accepted in 6000 walks: the drafter proposed nothing the target samples"
    child = max({c for c, _ in pairs}, key=lambda c: sum(1 for x, _ in pairs if x == c))
    after = [t for c, t in pairs if c == child]
    sup = np.flatnonzero(dists[child])
    assert _chi2_p(np.array([after.count(int(t)) for t in sup]), dists[child][sup]) > 1e-3


def test_config_refuses_trees_outside_the_ddtree_rules() -> None:
    from sglfleet.pipeline.config import build_model
    from sglfleet.pipeline.errors import UsageError

    with pytest.raises(UsageError, match="budget"):
        build_model(EngineConfig, {"budget": 40, "topk": 1})          # a chain of depth <= 7 holds 7 nodes
    with pytest.raises(UsageError, match="budget"):
        build_model(EngineConfig, {"budget": 0})
    with pytest.raises(UsageError, match="fault"):
        build_model(EngineConfig, {"fault": "nope"})
    with pytest.raises(UsageError, match="speculative"):
        build_model(EngineConfig, {"fault": "stale_kv", "speculative": False})


def test_cli_fault_names_are_the_engines() -> None:
    from testbed.corruptible.__main__ import FAULT_NAMES

    assert tuple(FAULT_NAMES) == FAULTS


@pytest.mark.parametrize("argv", [["--budget", "300"], ["--fault", "nope"], ["--port", "0"], ["--topk", "0"]])
def test_cli_bad_arguments_exit_2_with_one_error_line(argv: list[str]) -> None:
    args = ["--port", "1", *argv] if "--port" not in argv else argv
    p = subprocess.run([sys.executable, "-m", "testbed.corruptible", "serve", *args], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")


# ---------------------------------------------------------------------------- the server (child process)


@pytest.fixture(scope="module")
def served() -> str:
    from testbed.corruptible.server import CorruptibleServer

    with CorruptibleServer(budget=5) as url:
        yield url


def _sse(url: str, body: dict) -> list[dict | str]:
    out: list[dict | str] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300,
                      headers={"Connection": "close"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                p = line[6:]
                out.append(p if p == "[DONE]" else json.loads(p))
    return out


@pytest.mark.integration
def test_server_routes_and_a_gate_style_stream(served: str) -> None:
    from sglfleet.pipeline.client import OpenAIClient

    assert httpx.get(served + "/health").status_code == 200
    models = httpx.get(served + "/v1/models").json()
    assert models["data"][0]["id"] == "smollm2-135m-instruct"
    assert httpx.get(served + "/props").json()["verify_width"] == 6
    c = OpenAIClient(served)
    r = c.chat(PROSE, max_tokens=12, temperature=0, top_logprobs=3)
    assert r.finish_reason == "length" and r.completion_tokens == 12 and r.prompt_tokens
    assert r.logprobs is not None and len(r.logprobs) == 12
    tok, lp, top = r.logprobs[0]
    assert len(top) == 3 and top[0][0] == tok and abs(top[0][1] - lp) < 1e-9
    assert b"".join(t for t, _, _ in r.logprobs).decode() == r.text
    # the entries name the sampled ids, as llama.cpp's do: the gate scores a T>0 answer on what was drawn
    # (the client keeps them only when there is one per token and their bytes join to exactly the text)
    hot = c.chat(POEM, max_tokens=16, temperature=0.8, seed=5, top_logprobs=1)
    assert hot.output_ids is not None and len(hot.output_ids) == hot.completion_tokens == 16
    timings = r.raw["last_chunk"]["timings"]
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] <= 12 and timings["predicted_n"] == 12
    whole = c.chat(PROSE, max_tokens=12, temperature=0, stream=False)
    assert whole.text == r.text and whole.raw["timings"]["draft_n"] == timings["draft_n"]
    short = c.chat("What is the capital of France? Answer in one sentence.", max_tokens=40, temperature=0)
    assert short.finish_reason == "stop" and short.completion_tokens < 40 and "Paris" in short.text


@pytest.mark.integration
def test_server_stream_chunks_usage_and_done(served: str) -> None:
    ev = _sse(served, {"messages": [{"role": "user", "content": POEM}], "max_tokens": 6, "temperature": 0.8,
                       "seed": 5, "stream": True, "stream_options": {"include_usage": True}})
    assert ev[-1] == "[DONE]"
    usage = ev[-2]
    assert isinstance(usage, dict) and usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert "draft_n" in usage["timings"]
    finish = [e for e in ev if isinstance(e, dict) and e["choices"] and e["choices"][0]["finish_reason"]]
    assert [f["choices"][0]["finish_reason"] for f in finish] == ["length"]
    again = _sse(served, {"messages": [{"role": "user", "content": POEM}], "max_tokens": 6, "temperature": 0.8,
                          "seed": 5, "stream": True})

    def text(events: list) -> str:
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                       if isinstance(e, dict) and e.get("choices"))

    assert text(again) == text(ev) and text(ev)
    assert not any(isinstance(e, dict) and "usage" in e for e in again)


@pytest.mark.integration
def test_server_continues_a_final_assistant_message(served: str) -> None:
    from sglfleet.pipeline.client import OpenAIClient

    c = OpenAIClient(served)
    full = c.chat(POEM, max_tokens=10, temperature=0).text
    head = " ".join(full.split(" ")[:3])   # cut before a space: a token boundary of this tokenizer
    rest = c.chat([{"role": "user", "content": POEM}, {"role": "assistant", "content": head}], max_tokens=4,
                  temperature=0, extra={"continue_final_message": True}).text
    assert len(rest) >= 4 and full.startswith(head + rest)


@pytest.mark.integration
@pytest.mark.parametrize(("body", "why"), [
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n=1"),
    ({"messages": [{"role": "user", "content": "hi"}], "continue_final_message": True}, "assistant"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10 ** 6}, "max_tokens"),
])
def test_server_refuses_bad_requests_with_400(served: str, body: dict, why: str) -> None:
    r = httpx.post(served + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and why in r.json()["error"]["message"]


def test_text_stream_holds_back_a_partial_character(plain: Engine) -> None:
    from testbed.corruptible.server import TextStream

    ids = plain.encode("Waves 🌊 and ñ, 海")

    def whole(b: bytes) -> bool:
        try:
            b.decode()
            return True
        except UnicodeDecodeError:
            return False

    assert not all(whole(plain.token_bytes(i)) for i in ids)   # some character spans several byte tokens
    ts = TextStream(plain)
    deltas = [ts.push([i]) for i in ids]
    deltas.append(ts.push([], final=True))
    assert "".join(deltas) == "Waves 🌊 and ñ, 海"
    assert not any("\ufffd" in d for d in deltas)
    assert b"".join(plain.token_bytes(i) for i in ids).decode() == "Waves 🌊 and ñ, 海"


def test_text_stream_never_sends_a_stop_string_and_cuts_where_it_begins(plain: Engine) -> None:
    from testbed.corruptible.server import TextStream

    text = "One line.\n\nTwo lines."
    ids = plain.encode(text)
    ts = TextStream(plain, ("\n\n",))
    deltas = [ts.push([i]) for i in ids]   # the engine goes on past the stop string (a fault): nothing past it
    sent = "".join(deltas)                 # is sent before the end
    assert sent == "One line."
    assert sent + ts.push([], final=True, cut=text.index("\n\n")) == "One line."   # the engine stopped there
    missed = TextStream(plain, ("\n\n",))
    assert "".join(missed.push([i]) for i in ids) + missed.push([], final=True) == text   # it did not: all of it


def test_stop_strings_end_the_answer_and_the_step_end_fault_runs_past_them(plain: Engine) -> None:
    """The correct engine stops at the token that completes a stop string (checked token by token), its text cut
    where the stop string begins; `stop_step_end` checks once per verify step, so a stop string completed inside
    a step of several committed tokens is missed and the answer goes on holding it."""
    ids = _ids(plain, PROSE)
    greedy = plain.decode(_greedy(plain, ids, 40))
    words = [w for w in dict.fromkeys(greedy.split()) if len(w) > 3][:6]
    assert len(words) >= 4
    ok, bad = Engine(EngineConfig()), Engine(EngineConfig(fault="stop_step_end"))
    missed = 0
    for w in words:
        g = ok.generate(Request(ids, 40, stop=(w,)))
        text = plain.decode([t.token for t in g.tokens])
        assert g.finish_reason == "stop" and g.stop_at == text.find(w) == greedy.find(w)
        assert text[:g.stop_at] == greedy[:greedy.find(w)]
        f = bad.generate(Request(ids, 40, stop=(w,)))
        cut = plain.decode([t.token for t in f.tokens])[:f.stop_at]
        missed += w in cut
    assert missed > 0   # the fault is reachable: at least one stop string completes inside a step
