"""The draft tree and its acceptance walk (numpy only; the worker runs these on the host).

Tree (the DDTree rule). The DFlash drafter predicts, in one pass, a distribution for each of
the ``D = block_size - 1`` positions after the root (the last committed token). Take the top-k
tokens of each depth with their log-probabilities ``lp[d][r]`` (rank ``r`` sorted best first).
A node at depth ``d`` with rank ``r`` under parent ``p`` scores ``score(p) + lp[d][r]``. Nodes
are added best-first from a heap: the first pop is (depth 1, rank 0); each pop adds the node and
pushes its next sibling (same parent, rank + 1) and its first child (depth + 1, rank 0). This
stops at ``budget`` nodes, so every node's parent is added before it (node order is a
topological order) and the tree holds the ``budget`` highest-scoring paths' prefixes.

Layout of one request's verify block (width ``W = budget + 1``): slot 0 is the root, slots
``1..n`` the added nodes in pop order, slots ``n+1..W-1`` padding when the block cannot hold
``budget`` nodes (``topk = 1`` gives a chain of ``D``). Padding nodes are never anyone's child:
they attend to the prefix and themselves and their outputs are ignored.

Acceptance (exact for any temperature). ``target[j]`` is the token the target emits at node
``j`` -- its argmax at T = 0, a sample from its own (temperature / top-k / top-p adjusted)
distribution at T > 0. Starting at the root, move to the child whose token equals ``target``
of the current node while one exists; the first miss is the bonus token. Every emitted token
is a draw from the target's distribution given the path so far, so the output distribution is
exactly the target's whatever the drafter proposed (no draft-probability ratio is involved).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

PAD_PARENT = -1  # parent of the root and of padding nodes


@dataclass
class TreeBatch:
    """Verify blocks for ``bs`` requests, each ``W`` wide."""

    tokens: np.ndarray  # [bs, W] int64; column 0 is the root
    parents: np.ndarray  # [bs, W] int64; PAD_PARENT for root and padding
    depths: np.ndarray  # [bs, W] int64; root 0, padding 1
    valid: np.ndarray  # [bs, W] bool; root and real nodes
    n_nodes: np.ndarray  # [bs] int64; real drafted nodes (<= budget)

    @property
    def width(self) -> int:
        return int(self.tokens.shape[1])

    def ancestor_mask(self) -> np.ndarray:
        """[bs, W, W] bool: row j allows column i when i is j or an ancestor of j. Padding rows
        allow the root and themselves."""
        bs, w = self.tokens.shape
        anc = np.zeros((bs, w, w), dtype=bool)
        idx = np.arange(w)
        anc[:, idx, idx] = True
        for b in range(bs):
            par = self.parents[b]
            for j in range(1, w):
                if not self.valid[b, j]:
                    anc[b, j, 0] = True
                    continue
                p = par[j]
                # parents precede children, so row p is complete already
                anc[b, j] |= anc[b, p]
        return anc


def build_tree(
    topk_logp: np.ndarray, topk_ids: np.ndarray, budget: int
) -> tuple[list[int], list[int], list[int]]:
    """One request: ``topk_logp`` / ``topk_ids`` are ``[D, K]`` sorted best first per depth.
    Returns (tokens, parents, depths) of the drafted nodes in pop order (without the root);
    parents index the verify block (0 = root)."""
    depth_count, k = topk_logp.shape
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    if depth_count == 0 or k == 0 or budget <= 0:
        return tokens, parents, depths
    scores: list[float] = [0.0]  # per block slot; root scores 0
    # heap items: (-score, tie, depth_index, rank, parent_slot)
    tie = 0
    heap = [(-float(topk_logp[0, 0]), tie, 0, 0, 0)]
    while heap and len(tokens) < budget:
        neg, _, d, r, parent = heapq.heappop(heap)
        score = -neg
        slot = len(tokens) + 1
        tokens.append(int(topk_ids[d, r]))
        parents.append(parent)
        depths.append(d + 1)
        scores.append(score)
        if r + 1 < k:
            tie += 1
            heapq.heappush(heap, (-(scores[parent] + float(topk_logp[d, r + 1])), tie, d, r + 1, parent))
        if d + 1 < depth_count:
            tie += 1
            heapq.heappush(heap, (-(score + float(topk_logp[d + 1, 0])), tie, d + 1, 0, slot))
    return tokens, parents, depths


def build_batch(
    root_tokens: np.ndarray, topk_logp: np.ndarray, topk_ids: np.ndarray, budget: int, topk: int | None = None
) -> TreeBatch:
    """Trees for a batch: ``topk_logp`` / ``topk_ids`` ``[bs, D, K]``; ``topk`` (<= K) narrows
    the candidates per depth (tests use it to sweep top-k on one server)."""
    bs = int(root_tokens.shape[0])
    w = budget + 1
    k = topk_logp.shape[2] if topk is None else min(int(topk), topk_logp.shape[2])
    tokens = np.zeros((bs, w), dtype=np.int64)
    parents = np.full((bs, w), PAD_PARENT, dtype=np.int64)
    depths = np.ones((bs, w), dtype=np.int64)
    valid = np.zeros((bs, w), dtype=bool)
    n_nodes = np.zeros(bs, dtype=np.int64)
    for b in range(bs):
        toks, pars, deps = build_tree(topk_logp[b, :, :k], topk_ids[b, :, :k], budget)
        n = len(toks)
        tokens[b, 0] = root_tokens[b]
        depths[b, 0] = 0
        valid[b, : n + 1] = True
        tokens[b, 1 : n + 1] = toks
        parents[b, 1 : n + 1] = pars
        depths[b, 1 : n + 1] = deps
        tokens[b, n + 1 :] = root_tokens[b]  # padding: any token, never accepted
        n_nodes[b] = n
    return TreeBatch(tokens=tokens, parents=parents, depths=depths, valid=valid, n_nodes=n_nodes)


@dataclass
class Acceptance:
    paths: np.ndarray  # [bs, B] block slots of the accepted path (root first), padded with 0
    accept_lens: np.ndarray  # [bs] accepted drafted nodes (path length - 1)
    bonus: np.ndarray  # [bs] the target's token after the path
    out_tokens: np.ndarray  # [bs, B] accepted tokens then the bonus, padded with 0

    @property
    def commit_lens(self) -> np.ndarray:
        """Tokens whose KV becomes committed: the root plus the accepted nodes."""
        return self.accept_lens + 1


def accept(tree: TreeBatch, target: np.ndarray, block_size: int) -> Acceptance:
    """Walk each tree along ``target`` (``[bs, W]``, the target's token at every node)."""
    bs, w = tree.tokens.shape
    paths = np.zeros((bs, block_size), dtype=np.int64)
    accept_lens = np.zeros(bs, dtype=np.int64)
    bonus = np.zeros(bs, dtype=np.int64)
    out_tokens = np.zeros((bs, block_size), dtype=np.int64)
    for b in range(bs):
        children: dict[int, dict[int, int]] = {}
        for j in range(1, w):
            if tree.valid[b, j]:
                # first node wins if a token repeats under one parent (cannot happen with top-k ids)
                children.setdefault(int(tree.parents[b, j]), {}).setdefault(int(tree.tokens[b, j]), j)
        node, n = 0, 0
        while True:
            t = int(target[b, node])
            nxt = children.get(node, {}).get(t)
            if nxt is None or n + 1 >= block_size:
                bonus[b] = t
                break
            n += 1
            paths[b, n] = nxt
            out_tokens[b, n - 1] = t
            node = nxt
        accept_lens[b] = n
        out_tokens[b, n] = bonus[b]
    return Acceptance(paths=paths, accept_lens=accept_lens, bonus=bonus, out_tokens=out_tokens)


def window_permutation(acc: Acceptance, width: int) -> np.ndarray:
    """``[bs, W]``: new slot ``j`` of a request's verify window takes old slot ``perm[j]``. The
    accepted path moves to the front (root, then nodes by depth), the rest keep their order, so
    committed KV is contiguous and nothing is copied."""
    bs = acc.paths.shape[0]
    perm = np.empty((bs, width), dtype=np.int64)
    for b in range(bs):
        n = int(acc.accept_lens[b]) + 1
        front = [int(x) for x in acc.paths[b, :n]]
        taken = set(front)
        perm[b, :n] = front
        perm[b, n:] = [j for j in range(width) if j not in taken]
    return perm


def flat_mask(tree: TreeBatch, prefix_lens: np.ndarray, pad_to: int = 0) -> np.ndarray:
    """The batch's tree-verify allow-mask as the attention backends read it: for each request
    a row-major ``W x (prefix + W)`` block (prefix columns all allowed, then the ancestor
    mask), blocks concatenated in request order; padded with True up to ``pad_to`` cells."""
    anc = tree.ancestor_mask()
    w = tree.width
    parts = []
    for b in range(anc.shape[0]):
        p = int(prefix_lens[b])
        blk = np.ones((w, p + w), dtype=bool)
        blk[:, p:] = anc[b]
        parts.append(blk.reshape(-1))
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
    if pad_to > flat.size:
        flat = np.concatenate([flat, np.ones(pad_to - flat.size, dtype=bool)])
    return flat
