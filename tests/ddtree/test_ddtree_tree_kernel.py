"""The one-launch tree kernel (patches/ddtree/sglang_ddtree/tree_kernel.py) against the numpy heap
(tree.py) and the level-by-level tensor build (tree_device.py): the same nodes in the same order,
the same ancestor mask, the same walk; and the top-k head (head.py) against a full log-softmax.
Without a GPU the kernel runs in Triton's interpreter on CPU tensors; on the GPU machine the same
tests run the compiled kernel and the walk's CUDA graph on CUDA tensors
(`python3 -m pytest tests/ddtree/test_ddtree_tree_kernel.py`, docs/gpu-runs.md)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

# Triton picks its interpreter when a kernel is defined and reads the setting again at launch: set
# for this import and, by the fixture below, for this module's tests only, so that no other test's
# kernels (the GPU tests of this folder) are interpreted
CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
_before = os.environ.get("TRITON_INTERPRET")
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
try:
    from sglang_ddtree import tree_kernel as TK
finally:
    if _before is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _before
from sglang_ddtree import head as H  # noqa: E402
from sglang_ddtree import tree as T  # noqa: E402
from sglang_ddtree import tree_device as TD  # noqa: E402
from test_ddtree_tree import _draft, _reference_walk  # noqa: E402

pytestmark = pytest.mark.skipif(not TK.available(), reason="triton is not installed")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(DEV)


def _n(x: torch.Tensor) -> np.ndarray:
    return x.cpu().numpy()


@pytest.mark.parametrize("budget,depth,k", [(1, 7, 4), (3, 7, 1), (7, 7, 1), (8, 7, 2), (15, 7, 4), (16, 7, 4),
                                            (31, 7, 8), (63, 7, 8), (20, 3, 3), (16, 7, 8), (40, 2, 3), (5, 1, 8)])
def test_kernel_tree_equals_the_heap_tree(budget: int, depth: int, k: int) -> None:
    rng = np.random.default_rng(budget * 100 + depth * 10 + k)
    logp, ids = _draft(rng, 3, depth, k)
    logp = logp.astype(np.float32)
    roots = np.array([11, 12, 13])
    ref = T.build_batch(roots, logp, ids, budget)
    got = TK.build(_t(roots), _t(logp), _t(ids), budget)
    assert got.n_nodes == int(ref.n_nodes.max()) == int(ref.n_nodes.min())
    np.testing.assert_array_equal(_n(got.tokens), ref.tokens)
    np.testing.assert_array_equal(_n(got.parents), ref.parents)
    np.testing.assert_array_equal(_n(got.depths), ref.depths)
    np.testing.assert_array_equal(_n(got.valid), ref.valid)
    np.testing.assert_array_equal(_n(got.ancestors), ref.ancestor_mask())
    dev = TD.build(_t(roots), _t(logp), _t(ids), budget)  # and the tensor build agrees with both
    np.testing.assert_array_equal(_n(got.tokens), _n(dev.tokens))


@pytest.mark.parametrize("topk", [1, 2, 4, 8])
def test_narrowed_topk_and_strided_inputs(topk: int) -> None:
    """A request's top-k narrows the server's K in place: the kernel reads the first ranks of
    each depth through the inputs' strides (no copy), as from the draft head's buffers."""
    rng = np.random.default_rng(50 + topk)
    logp, ids = _draft(rng, 2, 7, 8)
    logp = logp.astype(np.float32)
    wide_lp = torch.zeros(2, 7, 12, device=DEV)
    wide_lp[:, :, :8] = _t(logp)
    wide_ids = torch.zeros(2, 7, 12, dtype=torch.int64, device=DEV)
    wide_ids[:, :, :8] = _t(ids)
    ref = T.build_batch(np.array([3, 4]), logp, ids, 16, topk=topk)
    got = TK.build(torch.tensor([3, 4], device=DEV), wide_lp[:, :, :8], wide_ids[:, :, :8], 16, topk=topk)
    np.testing.assert_array_equal(_n(got.tokens), ref.tokens)
    np.testing.assert_array_equal(_n(got.parents), ref.parents)
    np.testing.assert_array_equal(_n(got.valid), ref.valid)
    np.testing.assert_array_equal(_n(got.ancestors), ref.ancestor_mask())


def test_ties_follow_the_heap_push_order() -> None:
    """Equal scores pop in the order they were pushed, as the heap's tie counter: the same tree
    as the reference, not only an equally good one."""
    bs, depth, k, budget = 2, 7, 4, 31
    ids = np.tile(np.arange(k), (bs, depth, 1))
    for fill in (0.0, -1.0, -0.125):
        logp = np.full((bs, depth, k), fill, dtype=np.float32)
        ref = T.build_batch(np.array([1, 2]), logp, ids, budget)
        got = TK.build(torch.tensor([1, 2], device=DEV), _t(logp), _t(ids), budget)
        np.testing.assert_array_equal(_n(got.parents), ref.parents)
        np.testing.assert_array_equal(_n(got.depths), ref.depths)


def test_minus_infinity_candidates_are_still_nodes() -> None:
    """A -inf log-prob (a masked token) is a candidate like any other: the heap pops it last."""
    rng = np.random.default_rng(9)
    logp, ids = _draft(rng, 1, 4, 3)
    logp = logp.astype(np.float32)
    logp[0, 1, 2] = -np.inf
    logp[0, 3, 1:] = -np.inf
    ref = T.build_batch(np.array([7]), logp, ids, 39)  # the whole 3-ary tree (3 + 9 + 27 = 39)
    got = TK.build(torch.tensor([7], device=DEV), _t(logp), _t(ids), 39)
    assert sorted(got.tokens[0, 1:].tolist()) == sorted(ref.tokens[0, 1:].tolist())
    np.testing.assert_array_equal(_n(got.valid), ref.valid)


@pytest.mark.parametrize("budget,k,prefix", [(16, 4, (3, 0, 41)), (7, 1, (5, 9, 2)), (63, 8, (100, 1, 0)),
                                              (31, 4, (0, 0, 0))])
def test_kernel_writes_the_flat_verify_mask(budget: int, k: int, prefix: tuple[int, ...]) -> None:
    """The same launch writes each request's ancestor block into the flat verify mask where
    tree.flat_mask (the numpy reference) and tree_device.flat_mask put it; every other cell stays True,
    the padding past the last request included."""
    rng = np.random.default_rng(budget + k)
    logp, ids = _draft(rng, 3, 7, k)
    logp = logp.astype(np.float32)
    roots = np.array([5, 6, 7])
    w = budget + 1
    total = int(sum(w * (p + w) for p in prefix))
    flat = torch.ones(total + 37, dtype=torch.bool, device=DEV)
    got = TK.build(_t(roots), _t(logp), _t(ids), budget, prefix_lens=_t(np.array(prefix)), flat=flat)
    ref = T.build_batch(roots, logp, ids, budget)
    np.testing.assert_array_equal(_n(flat), T.flat_mask(ref, np.array(prefix), pad_to=total + 37))
    np.testing.assert_array_equal(_n(flat), _n(TD.flat_mask(got.ancestors, _t(np.array(prefix)), total + 37)))
    assert not bool(flat.all()), "the tree's cells are written"
    with pytest.raises(ValueError, match="go together"):
        TK.build(_t(roots), _t(logp), _t(ids), budget, flat=flat)
    with pytest.raises(ValueError, match="contiguous bool"):
        TK.build(_t(roots), _t(logp), _t(ids), budget, prefix_lens=_t(np.array(prefix)), flat=flat.to(torch.uint8))


def test_kernel_tree_walk_and_reused_buffers() -> None:
    """KernelTree writes every step into its shape's buffers and walks them (eagerly off CUDA):
    each step's acceptance equals the reference walk of that step's tree."""
    g = TK.KernelTree(16, 8)
    rng = np.random.default_rng(4)
    for step in range(3):
        logp, ids = _draft(rng, 3, 7, 4)
        logp = logp.astype(np.float32)
        roots = np.array([1, 2, 3]) + step
        tree = g.build(_t(roots), _t(logp), _t(ids), None)
        ref = T.build_batch(roots, logp, ids, 16)
        target = rng.integers(0, 1000, size=(3, 17))
        for b in range(3):  # make each request accept a few nodes
            node = 0
            for _ in range(step + 1):
                kids = [j for j in range(1, 17) if ref.parents[b, j] == node]
                if not kids:
                    break
                target[b, node] = ref.tokens[b, kids[-1]]
                node = kids[-1]
        acc = g.accept(tree, _t(target))
        want = T.accept(ref, target, 8)
        np.testing.assert_array_equal(_n(acc.out_tokens), want.out_tokens)
        np.testing.assert_array_equal(_n(acc.accept_lens), want.accept_lens)
        np.testing.assert_array_equal(_n(acc.permutation), T.window_permutation(want, 17))
        for b in range(3):
            path, bonus = _reference_walk(ref.tokens[b], ref.parents[b], ref.valid[b], target[b], 8)
            assert len(path) - 1 == int(acc.accept_lens[b]) and bonus == int(acc.bonus[b])
        assert int(acc.accept_lens.max()) >= min(step + 1, 2), "the walk commits several tokens"
    assert len(g._shapes) == 1


def test_kernel_tree_refuses_what_it_cannot_hold() -> None:
    assert TK.KernelTree.supports(63) and not TK.KernelTree.supports(64)
    root = torch.tensor([1], device=DEV)
    lp, ids = torch.zeros(1, 7, 4, device=DEV), torch.zeros(1, 7, 4, dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match="over 64"):
        TK.build(root, lp, ids, 64)
    with pytest.raises(ValueError, match="a tree needs one of each"):
        TK.build(root, lp, ids, 8, topk=0)
    g = TK.KernelTree(8, 8)
    with pytest.raises(RuntimeError, match="last build"):
        g.accept(TD.build(root, lp, ids, 8), torch.zeros(1, 9, dtype=torch.int64, device=DEV))


def test_self_check_passes_here_and_names_a_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's start check: the kernel agrees with the tensor ops at the served shapes; a kernel
    that writes another tree, or fails to launch, is reported (and the worker falls back)."""
    for budget, topk in ((16, 4), (8, 8), (31, 4), (63, 8), (7, 1)):
        assert TK.self_check(budget, 8, topk, DEV) is None
    real = TK.build

    def shifted(*a, **k):
        t = real(*a, **k)
        t.parents[:, 2] += 1
        return t

    monkeypatch.setattr(TK, "build", shifted)
    assert "parents" in TK.self_check(16, 8, 4, DEV)

    def flat_untouched(*a, **k):
        k.pop("flat", None)
        k.pop("prefix_lens", None)
        return real(*a, **k)

    monkeypatch.setattr(TK, "build", flat_untouched)
    assert TK.self_check(16, 8, 4, DEV) == "differs from the tensor ops in flat mask"

    def broken(*a, **k):
        raise RuntimeError("no kernel image for this device")

    monkeypatch.setattr(TK, "build", broken)
    assert "no kernel image" in TK.self_check(16, 8, 4, DEV)


@pytest.mark.parametrize("vocab,rows_pad", [(1000, 0), (4099, 5)])
def test_draft_head_equals_a_full_log_softmax(vocab: int, rows_pad: int) -> None:
    """The head's top-k of depths 1..B-1 (the root row dropped) are the full log-softmax's, for
    a head with padded vocabulary rows past ``vocab``; the static-buffer head gives the same."""
    g = torch.Generator().manual_seed(vocab)
    bs, block, hdim, k = 3, 8, 32, 4
    weight = torch.randn(vocab + rows_pad, hdim, generator=g)
    hidden = torch.randn(bs * block, hdim, generator=g)
    logp, ids = H.draft_topk(hidden, weight, vocab, block, k)
    full = torch.log_softmax(hidden.view(bs, block, hdim)[:, 1:, :] @ weight[:vocab].t(), dim=-1)
    want_v, want_i = torch.topk(full.reshape(-1, vocab), k)
    torch.testing.assert_close(logp, want_v, atol=1e-5, rtol=0)
    assert torch.equal(ids, want_i)
    head = H.DraftTopKHead(weight=weight, vocab=vocab, block_size=block, k=k, max_bs=5)
    head(hidden)
    lp2, ids2 = head.read(bs)
    assert lp2.shape == (bs, block - 1, k)
    assert torch.equal(lp2.reshape(-1, k), logp) and torch.equal(ids2.reshape(-1, k), ids)
    lp16, ids16 = H.draft_topk(hidden.bfloat16(), weight.bfloat16(), vocab, block, k)  # the served dtype
    full16 = torch.log_softmax((hidden.bfloat16().view(bs, block, hdim)[:, 1:, :] @ weight[:vocab].bfloat16().t())
                               .float(), dim=-1).reshape(-1, vocab)
    torch.testing.assert_close(lp16, full16.gather(1, ids16), atol=3e-3, rtol=0)
    assert torch.equal(full16.gather(1, ids16), torch.topk(full16, k).values)
