"""CPU tests of the DDTree tree builder, mask, acceptance walk and commit permutation
(patches/ddtree/sglang_ddtree/tree.py) against small reference implementations written here,
and of sampling exactness: the tokens the walk emits are distributed exactly as the target's."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from sglang_ddtree import tree as T


def _draft(rng: np.random.Generator, bs: int, depth: int, k: int, vocab: int = 1000):
    """Sorted top-k log-probs per depth, distinct ids per depth."""
    logp = np.sort(np.log(rng.dirichlet(np.ones(40), size=(bs, depth)))[:, :, :k], axis=-1)[:, :, ::-1].copy()
    ids = np.stack([np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(depth)]) for _ in range(bs)])
    return logp, ids


def _reference_nodes(logp: np.ndarray, budget: int) -> set[tuple[int, ...]]:
    """All rank paths (r1..rd) scored by summed log-prob; the best `budget` of them. With
    log-probs <= 0 a prefix scores at least as well as its extensions, so the set is a tree."""
    depth, k = logp.shape
    scored = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(k), repeat=d):
            scored.append((sum(logp[i, r] for i, r in enumerate(ranks)), ranks))
    scored.sort(key=lambda x: -x[0])
    return {r for _, r in scored[:budget]}


def _rank_paths(tb: T.TreeBatch, b: int, ids: np.ndarray) -> set[tuple[int, ...]]:
    out = set()
    for j in range(1, tb.width):
        if not tb.valid[b, j]:
            continue
        path, node = [], j
        while node != 0:
            d = tb.depths[b, node]
            path.append(int(np.where(ids[b, d - 1] == tb.tokens[b, node])[0][0]))
            node = tb.parents[b, node]
        out.add(tuple(reversed(path)))
    return out


@pytest.mark.parametrize("budget,depth,k", [(1, 7, 4), (3, 7, 1), (7, 7, 1), (8, 7, 2), (16, 7, 4), (31, 5, 3),
                                            (63, 7, 8), (20, 3, 3)])
def test_tree_is_the_best_budget_paths(budget: int, depth: int, k: int) -> None:
    rng = np.random.default_rng(budget * 100 + depth * 10 + k)
    logp, ids = _draft(rng, 3, depth, k)
    tb = T.build_batch(np.array([11, 12, 13]), logp, ids, budget)
    cap = sum(k**d for d in range(1, depth + 1))
    assert tb.width == budget + 1
    for b in range(3):
        n = int(tb.n_nodes[b])
        assert n == min(budget, cap)
        assert tb.tokens[b, 0] == [11, 12, 13][b] and tb.depths[b, 0] == 0
        assert tb.valid[b, : n + 1].all() and not tb.valid[b, n + 1 :].any()
        for j in range(1, n + 1):
            p = tb.parents[b, j]
            assert 0 <= p < j, "a parent is placed before its child"
            assert tb.depths[b, j] == tb.depths[b, p] + 1 <= depth
        assert _rank_paths(tb, b, ids) == _reference_nodes(logp[b], budget)


def test_ancestor_mask_and_flat_layout_match_a_reference() -> None:
    rng = np.random.default_rng(7)
    logp, ids = _draft(rng, 2, 7, 4)
    tb = T.build_batch(np.array([5, 6]), logp, ids, 16)
    anc = tb.ancestor_mask()
    for b in range(2):
        for j in range(tb.width):
            want = {j}
            node = j
            while tb.valid[b, node] and tb.parents[b, node] >= 0:
                node = int(tb.parents[b, node])
                want.add(node)
            if not tb.valid[b, j]:
                want = {0, j}
            assert set(np.nonzero(anc[b, j])[0]) == want
    prefix = np.array([3, 0])
    flat = T.flat_mask(tb, prefix, pad_to=10_000)
    w = tb.width
    blk0 = flat[: w * (3 + w)].reshape(w, 3 + w)
    assert blk0[:, :3].all() and (blk0[:, 3:] == anc[0]).all()
    blk1 = flat[w * (3 + w) : w * (3 + w) + w * w].reshape(w, w)
    assert (blk1 == anc[1]).all()
    assert flat.size == 10_000 and flat[w * (3 + w) + w * w :].all()


def _reference_walk(tokens, parents, valid, target, block):
    path = [0]
    while True:
        t = target[path[-1]]
        kids = [j for j in range(1, len(tokens)) if valid[j] and parents[j] == path[-1] and tokens[j] == t]
        if not kids or len(path) >= block:
            return path, t
        path.append(kids[0])


def test_accept_walk_matches_reference_and_permutation_commits_the_path() -> None:
    rng = np.random.default_rng(3)
    bs, block = 4, 8
    logp, ids = _draft(rng, bs, block - 1, 3, vocab=6)  # tiny vocab: the target often hits a child
    tb = T.build_batch(np.array([1, 2, 3, 4]), logp, ids, 24)
    hits = 0
    for _ in range(50):
        target = rng.integers(0, 6, size=(bs, tb.width))
        acc = T.accept(tb, target, block)
        perm = T.window_permutation(acc, tb.width)
        for b in range(bs):
            path, bonus = _reference_walk(tb.tokens[b], tb.parents[b], tb.valid[b], target[b], block)
            n = len(path) - 1
            hits += n
            assert acc.accept_lens[b] == n and acc.bonus[b] == bonus
            assert list(acc.paths[b, : n + 1]) == path
            assert list(acc.out_tokens[b, :n]) == [int(tb.tokens[b, j]) for j in path[1:]]
            assert acc.out_tokens[b, n] == bonus and acc.commit_lens[b] == n + 1
            assert sorted(perm[b]) == list(range(tb.width)), "the window is permuted, nothing lost"
            assert list(perm[b, : n + 1]) == path, "the accepted path moves to the front"
            # positions of the committed nodes are prefix + depth: depth of path[i] is i
            assert [int(tb.depths[b, j]) for j in path] == list(range(n + 1))
    assert hits > 0


# ----------------------------------------------------------------------------- exactness

VOCAB = 5


def _target_dist(prefix: tuple[int, ...]) -> np.ndarray:
    """A made-up target LM over 5 tokens: the next-token distribution depends on the path."""
    h = (hash(prefix) % 997) / 997.0
    logits = np.array([math.sin(3.1 * (i + 1) * (h + 0.3) + len(prefix)) for i in range(VOCAB)]) * 2.0
    p = np.exp(logits - logits.max())
    return p / p.sum()


def _tree_for(root: int, rng: np.random.Generator, depth: int, k: int, budget: int) -> T.TreeBatch:
    # a drafter that disagrees with the target: random top-k per depth
    logp = np.sort(np.log(rng.dirichlet(np.ones(VOCAB), size=(1, depth)))[:, :, :k], axis=-1)[:, :, ::-1].copy()
    ids = np.stack([np.stack([rng.choice(VOCAB, size=k, replace=False) for _ in range(depth)])])
    return T.build_batch(np.array([root]), logp, ids, budget)


def _node_prefix(tb: T.TreeBatch, j: int) -> tuple[int, ...]:
    seq = []
    while j != 0:
        seq.append(int(tb.tokens[0, j]))
        j = int(tb.parents[0, j])
    return (int(tb.tokens[0, 0]), *reversed(seq))


def _emit_exact(tb: T.TreeBatch, rng: np.random.Generator, block: int) -> tuple[int, ...]:
    """DDTree's rule: a draw from the target at every node, then the walk."""
    target = np.array([[rng.choice(VOCAB, p=_target_dist(_node_prefix(tb, j))) for j in range(tb.width)]])
    acc = T.accept(tb, target, block)
    n = int(acc.accept_lens[0])
    return tuple(int(x) for x in acc.out_tokens[0, : n + 1])


def _emit_biased(tb: T.TreeBatch, rng: np.random.Generator, block: int) -> tuple[int, ...]:
    """A rule that looks plausible and is wrong: accept the most probable child under the draft
    whenever the target gives it at least 0.2, else sample the target."""
    out, node = [], 0
    while len(out) < block - 1:
        p = _target_dist(_node_prefix(tb, node))
        kids = [j for j in range(1, tb.width) if tb.valid[0, j] and tb.parents[0, j] == node]
        if kids and p[int(tb.tokens[0, kids[0]])] >= 0.2:
            node = kids[0]
            out.append(int(tb.tokens[0, node]))
            continue
        out.append(int(rng.choice(VOCAB, p=p)))
        return tuple(out)
    out.append(int(rng.choice(VOCAB, p=_target_dist(_node_prefix(tb, node)))))
    return tuple(out)


def _chi2_two_tokens(emit, trials: int, seed: int) -> tuple[float, int]:
    """Chi-square of the first two emitted tokens against the target's exact joint distribution
    (trials where fewer than two tokens came out are completed by sampling the target)."""
    rng = np.random.default_rng(seed)
    root = 2
    counts = np.zeros((VOCAB, VOCAB))
    for _ in range(trials):
        tb = _tree_for(root, rng, depth=3, k=2, budget=6)
        seq = list(emit(tb, rng, 4))
        if len(seq) < 2:
            seq.append(int(rng.choice(VOCAB, p=_target_dist((root, seq[0])))))
        counts[seq[0], seq[1]] += 1
    p1 = _target_dist((root,))
    expected = np.array([[p1[a] * _target_dist((root, a))[b] for b in range(VOCAB)] for a in range(VOCAB)]) * trials
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    return chi2, VOCAB * VOCAB - 1


def test_tree_sampling_is_exactly_the_target_distribution() -> None:
    chi2, dof = _chi2_two_tokens(_emit_exact, trials=6000, seed=11)
    # 24 degrees of freedom: the 0.999 quantile is about 51.2
    assert chi2 < 51.2, f"chi2={chi2:.1f} (dof {dof}): DDTree acceptance is not distributed as the target"


def test_the_statistical_check_catches_a_biased_rule() -> None:
    chi2, _dof = _chi2_two_tokens(_emit_biased, trials=6000, seed=11)
    assert chi2 > 51.2, f"chi2={chi2:.1f}: the exactness test cannot tell a biased acceptance rule"
