"""The draft tree built by one Triton kernel launch per step: ``tree.build_tree``'s heap, one
program per request.

``tree_device.build`` selects the tree level by level in about a hundred small tensor ops;
replayed as a CUDA graph (``tree_device.GraphedTree``) they still cost about 0.5 ms of GPU time a
step at budget 16, most of it the launch latency of kernels that each touch a few hundred bytes
(docs/ddtree-step.md, run 2). Here one program per request runs the reference's best-first
rule itself: a frontier of candidates in registers, ``budget`` pops, each adding a node and
pushing its next sibling and its first child. Frontier slots are filled in push order and a pop
takes the lowest slot among the best scores, which is the reference heap's tie rule (its
``tie`` counter), so the nodes and their order are the reference's, up to the reference summing
scores in float64 where this sums in float32 (as ``tree_device.build`` does). Each node's
ancestor set is a bit mask (its parent's plus itself), so the kernel also writes the
``[W, W]`` ancestor mask; widths up to 64 (budget 63) fit one int64.

``KernelTree`` owns the output buffers per shape and captures ``tree_device.accept`` over them as a
CUDA graph, so the step is one kernel launch for the tree and one replay for the walk.
"""

from __future__ import annotations

import torch

from .tree_device import PAD_PARENT, DeviceAcceptance, DeviceTree, accept, flat_mask, outliving, warm_up
from .tree_device import build as tree_device_build

try:  # the GPU image has triton (torch's own dependency); CPU tests run the kernel in its interpreter
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None

MAX_WIDTH = 64  # ancestor sets are int64 bit masks


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def node_count(depth_count: int, k: int, budget: int) -> int:
    """Nodes the heap adds: ``budget``, or the whole ``k``-ary tree of ``depth_count`` levels
    when that is smaller (Python ints: the shapes of a step)."""
    total, level = 0, 1
    for _ in range(depth_count):
        level *= k
        total += level
        if total >= budget:
            return budget
    return total


if triton is not None:

    @triton.jit
    def _tree_kernel(lp_ptr, ids_ptr, roots_ptr, tok_ptr, par_ptr, dep_ptr, anc_ptr, pre_ptr, flat_ptr,
                     s_lb, s_ld, s_lr, s_ib, s_id, s_ir, depth_count, k,
                     BUDGET: tl.constexpr, W: tl.constexpr, WP: tl.constexpr, FR: tl.constexpr,
                     FLAT: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        lp_b = lp_ptr + b * s_lb
        id_b = ids_ptr + b * s_ib
        fo = tl.arange(0, FR)
        wo = tl.arange(0, WP)
        neg = float("-inf")
        # the frontier: candidates in push order (slot = the reference heap's tie counter)
        f_score = tl.where(fo == 0, tl.load(lp_b).to(tl.float32), neg)
        f_alive = fo == 0
        f_d = tl.zeros([FR], dtype=tl.int32)  # depth index of the candidate (0 = depth 1)
        f_r = tl.zeros([FR], dtype=tl.int32)  # its rank
        f_p = tl.zeros([FR], dtype=tl.int32)  # its parent's block slot
        n_push = tl.zeros([], dtype=tl.int32) + 1
        root = tl.load(roots_ptr + b).to(tl.int64)
        n_tok = tl.zeros([WP], dtype=tl.int64) + root  # padding keeps the root token, as tree.build_batch
        n_par = tl.full([WP], -1, dtype=tl.int64)
        n_dep = tl.where(wo == 0, 0, 1).to(tl.int64)
        n_score = tl.zeros([WP], dtype=tl.float32)
        n_bits = (tl.full([WP], 1, dtype=tl.int64) << wo.to(tl.int64)) | 1  # itself and the root
        for i in range(BUDGET):
            key = tl.where(f_alive, f_score, neg)
            best = tl.max(key, axis=0)
            sel = tl.min(tl.where(f_alive & (key == best), fo, FR), axis=0)
            ok = sel < FR
            hit = fo == sel
            d = tl.sum(tl.where(hit, f_d, 0), axis=0)
            r = tl.sum(tl.where(hit, f_r, 0), axis=0)
            p = tl.sum(tl.where(hit, f_p, 0), axis=0)
            f_alive = f_alive & (fo != sel)
            slot = i + 1
            at = (wo == slot) & ok
            tok = tl.load(id_b + d * s_id + r * s_ir, mask=ok, other=0).to(tl.int64)
            n_tok = tl.where(at, tok, n_tok)
            n_par = tl.where(at, p.to(tl.int64), n_par)
            n_dep = tl.where(at, (d + 1).to(tl.int64), n_dep)
            n_score = tl.where(at, best, n_score)
            n_bits = tl.where(at, n_bits | tl.sum(tl.where(wo == p, n_bits, 0), axis=0), n_bits)
            # the next sibling: same parent, next rank
            sib = ok & (r + 1 < k)
            parent_score = tl.sum(tl.where(wo == p, n_score, 0.0), axis=0)
            l_sib = tl.load(lp_b + d * s_ld + (r + 1) * s_lr, mask=sib, other=0.0).to(tl.float32)
            put = (fo == n_push) & sib
            f_score = tl.where(put, parent_score + l_sib, f_score)
            f_d = tl.where(put, d, f_d)
            f_r = tl.where(put, r + 1, f_r)
            f_p = tl.where(put, p, f_p)
            f_alive = f_alive | put
            n_push += sib.to(tl.int32)
            # the first child: next depth, rank 0, under the node just added
            child = ok & (d + 1 < depth_count)
            l_child = tl.load(lp_b + (d + 1) * s_ld, mask=child, other=0.0).to(tl.float32)
            put = (fo == n_push) & child
            f_score = tl.where(put, best + l_child, f_score)
            f_d = tl.where(put, d + 1, f_d)
            f_r = tl.where(put, 0, f_r)
            f_p = tl.where(put, slot, f_p)
            f_alive = f_alive | put
            n_push += child.to(tl.int32)
        keep = wo < W
        tl.store(tok_ptr + b * W + wo, n_tok, mask=keep)
        tl.store(par_ptr + b * W + wo, n_par, mask=keep)
        tl.store(dep_ptr + b * W + wo, n_dep, mask=keep)
        rows = wo[:, None]
        cols = wo[None, :]
        bits = (n_bits[:, None] >> cols.to(tl.int64)) & 1
        tl.store(anc_ptr + b * W * W + rows * W + cols, bits.to(tl.int8), mask=(rows < W) & (cols < W))
        if FLAT:  # the tree's cells of the flat verify mask (tree_device.flat_mask's layout; the rest is True)
            start = tl.zeros([], dtype=tl.int64)
            for j in range(0, b):
                start += W * (tl.load(pre_ptr + j).to(tl.int64) + W)
            p = tl.load(pre_ptr + b).to(tl.int64)
            at = start + rows.to(tl.int64) * (p + W) + p + cols.to(tl.int64)
            tl.store(flat_ptr + at, bits.to(tl.int8), mask=(rows < W) & (cols < W))


def available() -> bool:
    return triton is not None


def build(root_tokens: torch.Tensor, topk_logp: torch.Tensor, topk_ids: torch.Tensor, budget: int,
          topk: int | None = None, out: DeviceTree | None = None, prefix_lens: torch.Tensor | None = None,
          flat: torch.Tensor | None = None) -> DeviceTree:
    """``tree_device.build``'s contract in one kernel launch (``budget + 1 <= MAX_WIDTH``);
    ``out`` (a tree of the same shape) is written in place instead of allocating one. With
    ``prefix_lens`` (``[bs]`` on the device) and ``flat`` (a bool buffer of at least
    ``sum(W * (prefix + W))`` cells, all True), the same launch writes each request's ancestor block
    into ``flat`` where ``tree_device.flat_mask`` puts it, so the verify mask needs no op of its own."""
    if triton is None:
        raise RuntimeError("tree_kernel needs triton")
    bs, depth_count, kk = (int(x) for x in topk_logp.shape)
    k = kk if topk is None else min(int(topk), kk)
    w = budget + 1
    if w > MAX_WIDTH:
        raise ValueError(f"tree_kernel: verify width {w} over {MAX_WIDTH}")
    dev = topk_logp.device
    if out is None:
        out = empty_tree(bs, w, node_count(depth_count, k, budget), dev)
    if (prefix_lens is None) != (flat is None):
        raise ValueError("tree_kernel.build: prefix_lens and flat go together")
    if flat is not None and (flat.dtype != torch.bool or not flat.is_contiguous()):
        raise ValueError("tree_kernel.build: flat must be a contiguous bool buffer")
    if prefix_lens is not None:
        prefix_lens = prefix_lens.contiguous()  # the kernel reads it with stride 1
    if budget < 1 or depth_count < 1 or k < 1:
        raise ValueError(f"tree_kernel: budget {budget}, depths {depth_count}, top-k {k}: a tree needs one of each")
    if bs:
        anc = out.ancestors.view(torch.int8)
        write_flat = flat is not None
        _tree_kernel[(bs,)](
            topk_logp, topk_ids, root_tokens, out.tokens, out.parents, out.depths, anc,
            prefix_lens if write_flat else anc, flat.view(torch.int8) if write_flat else anc,
            topk_logp.stride(0), topk_logp.stride(1), topk_logp.stride(2),
            topk_ids.stride(0), topk_ids.stride(1), topk_ids.stride(2), depth_count, k,
            BUDGET=budget, W=w, WP=_pow2(w), FR=_pow2(2 * budget + 2), FLAT=write_flat, num_warps=1)
    return out


def empty_tree(bs: int, w: int, n: int, device: torch.device) -> DeviceTree:
    valid = torch.zeros((bs, w), dtype=torch.bool, device=device)
    valid[:, : n + 1] = True
    anc = torch.eye(w, dtype=torch.bool, device=device).expand(bs, w, w).clone()
    anc[:, :, 0] = True
    return DeviceTree(tokens=torch.zeros((bs, w), dtype=torch.int64, device=device),
                      parents=torch.full((bs, w), PAD_PARENT, dtype=torch.int64, device=device),
                      depths=torch.ones((bs, w), dtype=torch.int64, device=device), valid=valid, n_nodes=n,
                      ancestors=anc)


def self_check(budget: int, block_size: int, topk: int, device: torch.device | str) -> str | None:
    """Builds one random batch's tree with the kernel and with ``tree_device.build`` on ``device``
    (the worker runs it once at start): ``None`` when they agree, else what went wrong, so that a
    device or Triton build where the kernel fails or differs is caught before the first step."""
    try:
        g = torch.Generator().manual_seed(budget * 131 + topk)
        ranked = torch.sort(torch.log_softmax(torch.randn(2, block_size - 1, 64, generator=g), -1), -1,
                            descending=True)
        lp = ranked.values[:, :, :topk].contiguous().to(device)
        ids = ranked.indices[:, :, :topk].contiguous().to(device)
        roots = torch.tensor([5, 6], device=device)
        prefix = torch.tensor([3, 40], device=device)
        w = budget + 1
        flat = torch.ones(w * (43 + 2 * w) + 5, dtype=torch.bool, device=device)
        got = build(roots, lp, ids, budget, prefix_lens=prefix, flat=flat)
        want = tree_device_build(roots, lp, ids, budget)
        bad = [f for f in ("tokens", "parents", "depths", "valid", "ancestors")
               if not torch.equal(getattr(got, f), getattr(want, f))]
        if not torch.equal(flat, flat_mask(want.ancestors, prefix, flat.numel())):
            bad.append("flat mask")
    except Exception as e:  # the kernel did not compile or launch here
        return f"{type(e).__name__}: {e}"[:300]
    return f"differs from the tensor ops in {', '.join(bad)}" if bad else None


class KernelTree:
    """``build`` (one kernel launch into this shape's buffers) then ``accept`` (``tree_device.accept``
    replayed as a CUDA graph over those buffers), per (batch size, depths, K, top-k). The returned
    tensors stay valid until the next step of the same shape, except ``out_tokens`` and ``bonus``,
    which are cloned because they outlive the step. Off CUDA, ``accept`` runs eagerly."""

    def __init__(self, budget: int, block_size: int) -> None:
        self.budget, self.block_size = budget, block_size
        self._shapes: dict[tuple, _Shape] = {}
        self._current: _Shape | None = None

    @staticmethod
    def supports(budget: int) -> bool:
        return triton is not None and budget + 1 <= MAX_WIDTH

    def build(self, root_tokens: torch.Tensor, topk_logp: torch.Tensor, topk_ids: torch.Tensor,
              topk: int | None, prefix_lens: torch.Tensor | None = None,
              flat: torch.Tensor | None = None) -> DeviceTree:
        key = (tuple(topk_logp.shape), topk, topk_logp.device)
        s = self._shapes.get(key)
        if s is None:
            bs, depth_count, kk = (int(x) for x in topk_logp.shape)
            k = kk if topk is None else min(int(topk), kk)
            tree = empty_tree(bs, self.budget + 1, node_count(depth_count, k, self.budget), topk_logp.device)
            s = self._shapes[key] = _Shape(tree, self.block_size)
        self._current = s
        return build(root_tokens, topk_logp, topk_ids, self.budget, topk, out=s.tree, prefix_lens=prefix_lens,
                     flat=flat)

    def accept(self, tree: DeviceTree, target: torch.Tensor) -> DeviceAcceptance:
        s = self._current
        if s is None or tree is not s.tree:
            raise RuntimeError("KernelTree.accept: the tree of the last build is expected")
        return s.accept(target)


class _Shape:
    def __init__(self, tree: DeviceTree, block_size: int) -> None:
        self.tree, self.block_size = tree, block_size
        self.graph: torch.cuda.CUDAGraph | None = None
        self.target = torch.zeros(tree.tokens.shape, dtype=torch.int64, device=tree.tokens.device)
        self.acc: DeviceAcceptance | None = None

    def _capture(self) -> None:
        with torch.inference_mode():
            warm_up(lambda: accept(self.tree, self.target, self.block_size))
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.acc = accept(self.tree, self.target, self.block_size)

    def accept(self, target: torch.Tensor) -> DeviceAcceptance:
        if self.target.device.type != "cuda":
            return accept(self.tree, target.view(self.target.shape), self.block_size)
        with torch.inference_mode():
            self.target.copy_(target.view(self.target.shape))
            if self.graph is None:
                self._capture()
            self.graph.replay()
            return outliving(self.acc)
