"""The draft tree, its verify mask and its acceptance walk as batched tensor ops (torch only).

The same rules as ``tree`` (read its docstring first), computed where the tensors already are:
on the GPU in the server, on CPU torch in the tests (tests/ddtree/test_ddtree_tree_device.py
checks every function here against ``tree``'s numpy reference). No function here copies to the
host or reads a tensor's value on the host: every shape is a Python int known before the step
(batch size, budget, top-k, block size), so a step has no host sync of its own and the ops can
be captured in a CUDA graph.

Tree without a heap. Each depth ``d`` has one distribution, shared by every parent at that
depth, so a node ``(parent, rank r)`` scores ``score(parent) + lp[d][r]``. Two facts make a
level-by-level selection exact: (1) a node's score is at most its parent's and at most its
elder sibling's (log-probs <= 0, ranks sorted), so the heap of ``tree.build_tree`` pops nodes
in non-increasing score order and the ``budget`` nodes it adds are the ``budget`` best nodes of
the whole (top-k)-ary tree; (2) if a depth-``d`` node is among the best ``budget`` of its depth,
its parent is among the best ``budget`` of depth ``d - 1`` (otherwise ``budget`` better parents
each give a child of the same rank that beats it). So depth by depth: expand the kept nodes of
the previous depth by the ``k`` ranks, keep the best ``min(budget, count)`` (a stable sort, ties
to the earlier parent and lower rank), then take the best ``budget`` over all depths (stable:
ties to the shallower node, so a parent always precedes its child). The order is the heap's pop
order except among exactly equal scores, where both are valid trees and acceptance is exact for
any tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD_PARENT = -1


@dataclass
class DeviceTree:
    """Verify blocks for ``bs`` requests, each ``W`` wide (``tree.TreeBatch``'s layout)."""

    tokens: torch.Tensor  # [bs, W] int64; column 0 is the root
    parents: torch.Tensor  # [bs, W] int64; PAD_PARENT for root and padding
    depths: torch.Tensor  # [bs, W] int64; root 0, padding 1
    valid: torch.Tensor  # [bs, W] bool
    n_nodes: int  # real drafted nodes per request (the same for every request)
    ancestors: torch.Tensor  # [bs, W, W] bool: row j allows column i (i is j or an ancestor)

    @property
    def width(self) -> int:
        return int(self.tokens.shape[1])


def level_sizes(depth_count: int, k: int, budget: int) -> list[int]:
    """Nodes kept per depth: ``min(budget, k ** d)`` (Python ints: the shapes of the step)."""
    sizes, m = [], 1
    for _ in range(depth_count):
        m = min(budget, m * k)
        sizes.append(m)
    return sizes


def build(
    root_tokens: torch.Tensor, topk_logp: torch.Tensor, topk_ids: torch.Tensor, budget: int, topk: int | None = None
) -> DeviceTree:
    """Trees for a batch: ``topk_logp`` / ``topk_ids`` ``[bs, D, K]`` sorted best first per
    depth, ``root_tokens`` ``[bs]``; ``topk`` (<= K) narrows the candidates per depth."""
    bs, depth_count, kk = (int(x) for x in topk_logp.shape)
    k = kk if topk is None else min(int(topk), kk)
    dev = topk_logp.device
    w = budget + 1
    lp = topk_logp[:, :, :k].float()
    ids = topk_ids[:, :, :k].to(torch.int64)
    sizes = level_sizes(depth_count, k, budget) if k > 0 and budget > 0 else []
    scores, parents_c, tokens_c, depths_c = [], [], [], []
    offset = 0  # start of the previous level in the concatenated candidate list
    prev = None
    for d, m in enumerate(sizes):
        if d == 0:
            cand = lp[:, 0, :]  # [bs, k]
            parent_idx = torch.full((bs, k), -1, dtype=torch.int64, device=dev)
            rank = torch.arange(k, device=dev).expand(bs, k)
        else:
            mp = prev.shape[1]
            cand = (prev.unsqueeze(2) + lp[:, d, :].unsqueeze(1)).reshape(bs, mp * k)
            parent_idx = (offset + torch.arange(mp, device=dev)).repeat_interleave(k).expand(bs, mp * k)
            rank = torch.arange(k, device=dev).repeat(mp).expand(bs, mp * k)
            offset += mp
        order = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, :m]
        prev = cand.gather(1, order)
        scores.append(prev)
        parents_c.append(parent_idx.gather(1, order))
        tokens_c.append(ids[:, d, :].gather(1, rank.gather(1, order)))
        depths_c.append(torch.full((bs, m), d + 1, dtype=torch.int64, device=dev))
    n = min(budget, sum(sizes))
    tokens = root_tokens.view(bs, 1).to(torch.int64).expand(bs, w).clone()
    parents = torch.full((bs, w), PAD_PARENT, dtype=torch.int64, device=dev)
    depths = torch.ones((bs, w), dtype=torch.int64, device=dev)
    depths[:, 0] = 0
    valid = torch.zeros((bs, w), dtype=torch.bool, device=dev)
    valid[:, : n + 1] = True
    if n > 0:
        score = torch.cat(scores, dim=1)
        order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :n]
        slot_of = torch.zeros_like(score, dtype=torch.int64)
        slot_of.scatter_(1, order, torch.arange(1, n + 1, device=dev).expand(bs, n))
        pc = torch.cat(parents_c, dim=1).gather(1, order)
        parent_slot = torch.where(pc < 0, torch.zeros_like(pc), slot_of.gather(1, pc.clamp_min(0)))
        tokens[:, 1 : n + 1] = torch.cat(tokens_c, dim=1).gather(1, order)
        parents[:, 1 : n + 1] = parent_slot
        depths[:, 1 : n + 1] = torch.cat(depths_c, dim=1).gather(1, order)
    anc = ancestor_mask(parents, depth_count)
    return DeviceTree(tokens=tokens, parents=parents, depths=depths, valid=valid, n_nodes=n, ancestors=anc)


def _climb(parents: torch.Tensor) -> torch.Tensor:
    """Parent pointers with the root and padding pointing at the root (slot 0)."""
    return parents.clamp_min(0)


def ancestor_mask(parents: torch.Tensor, depth_count: int) -> torch.Tensor:
    """``[bs, W, W]`` bool: row j allows i when i is j or an ancestor of j; padding rows (parent
    PAD_PARENT past the root) allow the root and themselves, as ``TreeBatch.ancestor_mask``."""
    bs, w = parents.shape
    up = _climb(parents)
    anc = torch.zeros((bs, w, w), dtype=torch.bool, device=parents.device)
    cur = torch.arange(w, device=parents.device).expand(bs, w).contiguous()
    ones = torch.ones((bs, w, 1), dtype=torch.bool, device=parents.device)
    for _ in range(depth_count + 1):  # a node is at most depth_count steps below the root
        anc.scatter_(2, cur.unsqueeze(2), ones)
        cur = up.gather(1, cur)
    return anc


def flat_mask(
    anc: torch.Tensor, prefix_lens: torch.Tensor, total: int, pad_to: int = 0
) -> torch.Tensor:
    """``tree.flat_mask`` on the device: per request a row-major ``W x (prefix + W)`` block
    (prefix columns allowed, then the ancestor mask), blocks in request order, True-padded to
    ``pad_to`` cells. ``total`` = ``sum(W * (prefix + W))``, from the host copy of the prefix
    lengths the step already has (the mask's size must be known to allocate it)."""
    bs, w, _ = anc.shape
    dev = anc.device
    size = max(int(total), int(pad_to))
    flat = torch.ones(size, dtype=torch.bool, device=dev)
    if bs == 0:
        return flat
    p = prefix_lens.to(device=dev, dtype=torch.int64)
    row_len = p + w  # [bs]
    block = w * row_len
    start = torch.cumsum(block, 0) - block  # exclusive prefix sum
    r = torch.arange(w, device=dev)
    idx = start.view(bs, 1, 1) + r.view(1, w, 1) * row_len.view(bs, 1, 1) + p.view(bs, 1, 1) + r.view(1, 1, w)
    flat[idx.reshape(-1)] = anc.reshape(-1)
    return flat


@dataclass
class DeviceAcceptance:
    paths: torch.Tensor  # [bs, B] block slots of the accepted path (root first), padded with 0
    accept_lens: torch.Tensor  # [bs] int64
    bonus: torch.Tensor  # [bs] int64
    out_tokens: torch.Tensor  # [bs, B] accepted tokens then the bonus, padded with 0
    permutation: torch.Tensor  # [bs, W]: new window slot j takes old slot perm[j]

    @property
    def commit_lens(self) -> torch.Tensor:
        return self.accept_lens + 1


def accept(tree: DeviceTree, target: torch.Tensor, block_size: int) -> DeviceAcceptance:
    """``tree.accept`` + ``tree.window_permutation`` as tensor ops. ``target`` ``[bs, W]``: the
    target's token at every node. A node is reached when every node on its root path holds the
    target's token at its parent (the first of equal siblings only, as the host walk); the
    accepted path is the deepest reached node's root path, cut at ``block_size - 1`` nodes."""
    tokens, depths, valid, anc = tree.tokens, tree.depths, tree.valid, tree.ancestors
    bs, w = tokens.shape
    dev = tokens.device
    target = target.view(bs, w).to(torch.int64)
    up = _climb(tree.parents)
    hit = valid & (tokens == target.gather(1, up))
    # an earlier sibling with the same token shadows a later one (cannot happen with top-k ids)
    same = (tree.parents.unsqueeze(2) == tree.parents.unsqueeze(1)) & (tokens.unsqueeze(2) == tokens.unsqueeze(1))
    earlier = torch.ones((w, w), dtype=torch.bool, device=dev).tril(-1)  # [j, i]: i < j
    hit &= ~(same & earlier & valid.unsqueeze(1)).any(2)
    hit &= depths <= block_size - 1
    hit[:, 0] = True  # the root is committed already
    reached = ~(anc & ~hit.unsqueeze(1)).any(2)  # every node on the root path hit
    slot = torch.arange(w, device=dev)
    key = torch.where(reached, depths * w + (w - 1 - slot), torch.full_like(depths, -1))
    deepest = key.argmax(1)  # [bs]; reached nodes form one chain, this is its end
    accept_lens = depths.gather(1, deepest.view(bs, 1)).view(bs)
    accept_lens = torch.where(deepest == 0, torch.zeros_like(accept_lens), accept_lens)
    on_path = anc.gather(1, deepest.view(bs, 1, 1).expand(bs, 1, w)).view(bs, w)
    path_depth = torch.where(slot.view(1, w) == 0, torch.zeros_like(depths), depths)
    col = torch.where(on_path, path_depth, torch.full_like(depths, block_size))
    paths = torch.zeros((bs, block_size + 1), dtype=torch.int64, device=dev)
    paths.scatter_(1, col, torch.where(on_path, slot.expand(bs, w), torch.zeros_like(depths)))
    paths = paths[:, :block_size].contiguous()
    steps = torch.arange(block_size, device=dev).view(1, block_size)
    out_tokens = torch.where(steps <= accept_lens.view(bs, 1), target.gather(1, paths), torch.zeros_like(paths))
    bonus = target.gather(1, deepest.view(bs, 1)).view(bs)
    perm_key = torch.where(on_path, path_depth, w + slot.expand(bs, w))
    permutation = torch.argsort(perm_key, dim=1)
    return DeviceAcceptance(paths=paths, accept_lens=accept_lens, bonus=bonus, out_tokens=out_tokens,
                            permutation=permutation)


def topk_chunked(x: torch.Tensor, k: int, chunks: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(x, k, dim=-1)`` (sorted, largest) for a few rows over a long last axis: top-k
    inside ``chunks`` slices of the row first (many independent selections instead of one per
    row), then top-k of the survivors. Exact: the row's top-k lies in the union of the slices'
    top-k. Ties may pick a different index than ``torch.topk``; the values are the same."""
    rows, n = x.shape
    per = -(-n // chunks)
    if per < k or chunks <= 1:
        return torch.topk(x, k, dim=-1)
    pad = per * chunks - n
    if pad:
        x = torch.nn.functional.pad(x, (0, pad), value=float("-inf"))
    v, i = torch.topk(x.view(rows, chunks, per), k, dim=-1)
    i = i + (torch.arange(chunks, device=x.device) * per).view(1, chunks, 1)
    v2, j = torch.topk(v.reshape(rows, chunks * k), k, dim=-1)
    return v2, i.reshape(rows, chunks * k).gather(1, j)


class GraphedTree:
    """``build`` then ``accept`` replayed as two CUDA graphs per (batch size, top-k, K): the ~100 small
    launches of the tree ops cost the host about 4 ms a step when issued one by one (measured on the
    H200, docs/ddtree-step.md); a replay costs one launch. Inputs are copied into the graphs' static
    buffers; the returned tensors are the graphs' static outputs, valid until the next replay of the
    same shape (the next step), except ``out_tokens`` and ``bonus``, which are cloned because they
    outlive the step. On a device without CUDA graphs (CPU) it runs the eager functions."""

    def __init__(self, budget: int, block_size: int) -> None:
        self.budget, self.block_size = budget, block_size
        self._graphs: dict[tuple, _TreeGraphs] = {}

    def build(self, root_tokens: torch.Tensor, topk_logp: torch.Tensor, topk_ids: torch.Tensor,
              topk: int | None) -> DeviceTree:
        if topk_logp.device.type != "cuda":
            self._eager = True
            return build(root_tokens, topk_logp, topk_ids, self.budget, topk)
        self._eager = False
        key = (tuple(topk_logp.shape), topk_logp.dtype, topk_ids.dtype, root_tokens.dtype, topk)
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = _TreeGraphs(root_tokens, topk_logp, topk_ids, topk, self.budget,
                                                self.block_size)
        self._current = g
        return g.run_build(root_tokens, topk_logp, topk_ids)

    def accept(self, tree: DeviceTree, target: torch.Tensor) -> DeviceAcceptance:
        if self._eager:
            return accept(tree, target, self.block_size)
        return self._current.run_accept(target)


def warm_up(step) -> None:
    """Run ``step`` twice on a side stream before a CUDA-graph capture (the allocator's and the kernels'
    first launches stay out of the graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)


def outliving(a: DeviceAcceptance) -> DeviceAcceptance:
    """A graph's static acceptance with the fields that outlive the step (the emitted tokens, the bonus)
    cloned: the next replay overwrites the rest, which the step has used by then."""
    return DeviceAcceptance(paths=a.paths, accept_lens=a.accept_lens, bonus=a.bonus.clone(),
                            out_tokens=a.out_tokens.clone(), permutation=a.permutation)


class _TreeGraphs:
    def __init__(self, roots: torch.Tensor, logp: torch.Tensor, ids: torch.Tensor, topk: int | None, budget: int,
                 block_size: int) -> None:
        bs, w = int(roots.shape[0]), budget + 1
        with torch.inference_mode():
            self.inputs = (roots.clone(), logp.clone(), ids.clone())
            self.target = torch.zeros((bs, w), dtype=torch.int64, device=roots.device)

            def step() -> tuple[DeviceTree, DeviceAcceptance]:
                tree = build(*self.inputs, budget, topk)
                return tree, accept(tree, self.target, block_size)

            warm_up(step)
            self.g_build, self.g_accept = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(self.g_build, pool=pool):
                self.tree = build(*self.inputs, budget, topk)
            with torch.cuda.graph(self.g_accept, pool=pool):
                self.acc = accept(self.tree, self.target, block_size)

    def run_build(self, roots: torch.Tensor, logp: torch.Tensor, ids: torch.Tensor) -> DeviceTree:
        with torch.inference_mode():
            for dst, src in zip(self.inputs, (roots, logp, ids), strict=True):
                dst.copy_(src)
            self.g_build.replay()
        return self.tree

    def run_accept(self, target: torch.Tensor) -> DeviceAcceptance:
        with torch.inference_mode():
            self.target.copy_(target.view(self.target.shape))
            self.g_accept.replay()
            return outliving(self.acc)
