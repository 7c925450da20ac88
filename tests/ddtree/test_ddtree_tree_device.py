"""The device tree code (patches/ddtree/sglang_ddtree/tree_device.py) run on CPU torch against the
numpy reference (tree.py) and the references of test_ddtree_tree.py: the same nodes in the same
order, the same mask, the same acceptance, permutation and emitted tokens, and the exactness
chi-square through the tensor walk."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sglang_ddtree import tree as T
from sglang_ddtree import tree_device as TD
from test_ddtree_tree import _draft, _reference_nodes, _reference_walk


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def _build_both(logp, ids, roots, budget, topk=None):
    ref = T.build_batch(roots, logp, ids, budget, topk=topk)
    dev = TD.build(_t(roots), _t(logp).float(), _t(ids), budget, topk=topk)
    return ref, dev


@pytest.mark.parametrize("budget,depth,k", [(1, 7, 4), (3, 7, 1), (7, 7, 1), (8, 7, 2), (16, 7, 4), (31, 5, 3),
                                            (63, 7, 8), (20, 3, 3), (31, 7, 8), (8, 7, 8), (16, 7, 8)])
def test_device_tree_equals_the_heap_tree(budget: int, depth: int, k: int) -> None:
    rng = np.random.default_rng(budget * 100 + depth * 10 + k)
    logp, ids = _draft(rng, 3, depth, k)
    logp = logp.astype(np.float32)  # the worker's dtype: both sides see the same numbers
    roots = np.array([11, 12, 13])
    ref, dev = _build_both(logp, ids, roots, budget)
    assert dev.n_nodes == int(ref.n_nodes.max()) == int(ref.n_nodes.min())
    np.testing.assert_array_equal(dev.tokens.numpy(), ref.tokens)
    np.testing.assert_array_equal(dev.parents.numpy(), ref.parents)
    np.testing.assert_array_equal(dev.depths.numpy(), ref.depths)
    np.testing.assert_array_equal(dev.valid.numpy(), ref.valid)
    np.testing.assert_array_equal(dev.ancestors.numpy(), ref.ancestor_mask())
    if k**depth > 5000:  # the exhaustive reference below is for small trees (the heap's test covers 63/7/8)
        return
    for b in range(3):  # and both are the best `budget` rank paths
        paths = set()
        for j in range(1, dev.n_nodes + 1):
            node, p = j, []
            while node != 0:
                d = int(dev.depths[b, node])
                p.append(int(np.where(ids[b, d - 1] == int(dev.tokens[b, node]))[0][0]))
                node = int(dev.parents[b, node])
            paths.add(tuple(reversed(p)))
        assert paths == _reference_nodes(logp[b].astype(np.float64), budget)


@pytest.mark.parametrize("topk", [1, 2, 4])
def test_narrowed_topk_matches(topk: int) -> None:
    rng = np.random.default_rng(5 + topk)
    logp, ids = _draft(rng, 2, 7, 8)
    logp = logp.astype(np.float32)
    ref, dev = _build_both(logp, ids, np.array([3, 4]), 16, topk=topk)
    np.testing.assert_array_equal(dev.tokens.numpy(), ref.tokens)
    np.testing.assert_array_equal(dev.parents.numpy(), ref.parents)
    np.testing.assert_array_equal(dev.valid.numpy(), ref.valid)


def test_exact_ties_still_give_a_valid_best_tree() -> None:
    """Equal log-probs (and zeros: a child scoring as its parent): the order among equals may
    differ from the heap's, but parents come first, depths are consistent, and with equal
    negative log-probs the tree is the shallowest one (the best `budget` by score)."""
    bs, depth, k, budget = 2, 7, 4, 31
    ids = np.tile(np.arange(k), (bs, depth, 1))
    for fill in (0.0, -1.0):
        logp = np.full((bs, depth, k), fill, dtype=np.float32)
        dev = TD.build(torch.tensor([1, 2]), _t(logp), _t(ids), budget)
        for b in range(bs):
            for j in range(1, budget + 1):
                p = int(dev.parents[b, j])
                assert 0 <= p < j
                assert int(dev.depths[b, j]) == int(dev.depths[b, p]) + 1
            if fill < 0:
                assert sorted(dev.depths[b, 1:].tolist()) == [1] * 4 + [2] * 16 + [3] * 11


def test_flat_mask_matches_the_reference_layout() -> None:
    rng = np.random.default_rng(7)
    logp, ids = _draft(rng, 3, 7, 4)
    roots = np.array([5, 6, 7])
    ref, dev = _build_both(logp.astype(np.float32), ids, roots, 16)
    prefix = np.array([3, 0, 41])
    w = ref.width
    total = int(sum(w * (p + w) for p in prefix))
    for pad in (0, total + 123):
        want = T.flat_mask(ref, prefix, pad_to=pad)
        got = TD.flat_mask(dev.ancestors, _t(prefix), total, pad_to=pad).numpy()
        np.testing.assert_array_equal(got, want)


def test_device_walk_matches_the_reference_walk() -> None:
    rng = np.random.default_rng(3)
    bs, block = 4, 8
    hits = 0
    for k, budget in ((3, 24), (1, 7), (4, 16), (8, 31)):
        logp, ids = _draft(rng, bs, block - 1, k, vocab=max(6, k + 1))  # tiny vocab: the target often hits
        ref, dev = _build_both(logp.astype(np.float32), ids, np.array([1, 2, 3, 4]), budget)
        for _ in range(40):
            target = rng.integers(0, max(6, k + 1), size=(bs, ref.width))
            acc = T.accept(ref, target, block)
            perm = T.window_permutation(acc, ref.width)
            dacc = TD.accept(dev, _t(target), block)
            np.testing.assert_array_equal(dacc.accept_lens.numpy(), acc.accept_lens)
            np.testing.assert_array_equal(dacc.bonus.numpy(), acc.bonus)
            np.testing.assert_array_equal(dacc.paths.numpy(), acc.paths)
            np.testing.assert_array_equal(dacc.out_tokens.numpy(), acc.out_tokens)
            np.testing.assert_array_equal(dacc.commit_lens.numpy(), acc.commit_lens)
            np.testing.assert_array_equal(dacc.permutation.numpy(), perm)
            for b in range(bs):
                path, bonus = _reference_walk(ref.tokens[b], ref.parents[b], ref.valid[b], target[b], block)
                assert list(dacc.paths[b, : len(path)].numpy()) == path and int(dacc.bonus[b]) == bonus
                hits += len(path) - 1
    assert hits > 0


def test_walk_takes_the_first_of_equal_siblings_and_stops_at_the_block() -> None:
    # root 9; slots 1 and 2 are siblings with the same token 5; slot 3 is slot 2's child
    tree = TD.DeviceTree(
        tokens=torch.tensor([[9, 5, 5, 6]]), parents=torch.tensor([[-1, 0, 0, 2]]),
        depths=torch.tensor([[0, 1, 1, 2]]), valid=torch.tensor([[True] * 4]), n_nodes=3,
        ancestors=TD.ancestor_mask(torch.tensor([[-1, 0, 0, 2]]), 2))
    ref = T.TreeBatch(tokens=tree.tokens.numpy(), parents=tree.parents.numpy(), depths=tree.depths.numpy(),
                      valid=tree.valid.numpy(), n_nodes=np.array([3]))
    target = np.array([[5, 6, 6, 7]])
    for block in (2, 3, 8):
        acc = T.accept(ref, target, block)
        dacc = TD.accept(tree, _t(target), block)
        np.testing.assert_array_equal(dacc.paths.numpy(), acc.paths)
        np.testing.assert_array_equal(dacc.out_tokens.numpy(), acc.out_tokens)
        assert int(dacc.accept_lens[0]) == int(acc.accept_lens[0])


def test_device_walk_samples_exactly_the_target_distribution() -> None:
    """test_ddtree_tree's chi-square on the first two emitted tokens, the 6000 trees walked in one batch."""
    from test_ddtree_tree import VOCAB, _node_prefix, _target_dist, _tree_for

    rng = np.random.default_rng(11)
    root, trials = 2, 6000
    trees = [_tree_for(root, rng, depth=3, k=2, budget=6) for _ in range(trials)]
    targets = np.array([[rng.choice(VOCAB, p=_target_dist(_node_prefix(tb, j))) for j in range(tb.width)]
                        for tb in trees])
    cat = lambda name: _t(np.concatenate([getattr(tb, name) for tb in trees]))  # noqa: E731
    dev = TD.DeviceTree(tokens=cat("tokens"), parents=cat("parents"), depths=cat("depths"), valid=cat("valid"),
                        n_nodes=6, ancestors=_t(np.concatenate([tb.ancestor_mask() for tb in trees])))
    acc = TD.accept(dev, _t(targets), 4)
    counts = np.zeros((VOCAB, VOCAB))
    for i in range(trials):
        n = int(acc.accept_lens[i])
        seq = [int(x) for x in acc.out_tokens[i, : n + 1]]
        if len(seq) < 2:
            seq.append(int(rng.choice(VOCAB, p=_target_dist((root, seq[0])))))
        counts[seq[0], seq[1]] += 1
    p1 = _target_dist((root,))
    expected = np.array([[p1[a] * _target_dist((root, a))[b] for b in range(VOCAB)] for a in range(VOCAB)]) * trials
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 51.2, f"chi2={chi2:.1f}: the device walk is not distributed as the target"


@pytest.mark.parametrize("rows,n,k,chunks", [(7, 128256, 8, 64), (28, 49152, 4, 64), (3, 1000, 8, 64),
                                             (2, 50, 8, 64), (5, 4097, 1, 32)])
def test_chunked_topk_equals_topk(rows: int, n: int, k: int, chunks: int) -> None:
    g = torch.Generator().manual_seed(rows * n + k)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, n, generator=g).to(dtype)
        v, i = TD.topk_chunked(x, k, chunks=chunks)
        rv, _ = torch.topk(x, k, dim=-1)
        assert torch.equal(v, rv)
        assert torch.equal(x.gather(1, i), v), "each index points at its value"
        assert all(len(set(r.tolist())) == k for r in i), "distinct indices"


def test_graphed_tree_runs_the_eager_ops_off_cuda() -> None:
    rng = np.random.default_rng(21)
    logp, ids = _draft(rng, 2, 7, 4)
    logp = logp.astype(np.float32)
    g = TD.GraphedTree(16, 8)
    dev = g.build(torch.tensor([1, 2]), _t(logp), _t(ids), 4)
    ref = T.build_batch(np.array([1, 2]), logp, ids, 16, topk=4)
    np.testing.assert_array_equal(dev.tokens.numpy(), ref.tokens)
    target = rng.integers(0, 1000, size=(2, 17))
    target[:, 0] = ref.tokens[:, 1]  # the root's target hits the first node
    acc = g.accept(dev, _t(target))
    np.testing.assert_array_equal(acc.out_tokens.numpy(), T.accept(ref, target, 8).out_tokens)
