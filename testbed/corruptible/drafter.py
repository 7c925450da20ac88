"""The drafter: a cheap, real proposer of a token tree, and the tree's attention mask.

Two sources of candidates, both from the request itself (so a request's tree depends only on its own
tokens, and a seeded request is reproducible):
- prompt lookup: the tokens that followed the most recent earlier occurrence of the context's last n
  tokens (n = 3, then 2), a chain scored as near-certain;
- the target's own predictions: after every target pass, the top-k tokens the target gave after each
  input token are kept (`observe`), so a node whose token was seen before gets the target's earlier
  top-k after it as its candidate children, scored with their log-probabilities.
A node with neither gets the context's most frequent tokens, scored low, so the tree always has `budget`
nodes and the verify width w = budget + 1 is constant (as DDTree's).

The tree is built best-first on cumulative log-probability (DDTree's heap: each pop adds a node and
pushes its next sibling and its first child) up to `budget` nodes below the root, at most `topk`
children per node and depth <= max_depth (the DFlash block size - 1).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

import numpy as np

NGRAM_SCORE = -0.05    # log-prob given to a prompt-lookup continuation
FALLBACK_SCORE = -9.0  # log-prob given to a frequent-token filler


@dataclass
class Tree:
    """A drafted tree: node 0 is the root (the last committed token, not yet in the KV cache); every
    other node's parent has a smaller index."""

    tokens: list[int]
    parents: list[int]   # parents[0] == -1
    depths: list[int]

    @property
    def width(self) -> int:
        return len(self.tokens)

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.tokens]
        for i, p in enumerate(self.parents):
            if p >= 0:
                out[p].append(i)
        return out

    def mask(self) -> np.ndarray:
        """(w, w) bool: node i attends to node j iff j is i itself or one of its ancestors."""
        w = self.width
        m = np.zeros((w, w), dtype=bool)
        for i in range(w):
            j = i
            while j >= 0:
                m[i, j] = True
                j = self.parents[j]
        return m


class Drafter:
    """Per-request draft state: the request's tokens and the target's top-k after tokens it has seen."""

    def __init__(self, budget: int, topk: int, max_depth: int) -> None:
        self.budget, self.topk, self.max_depth = budget, topk, max_depth
        self.ctx: list[int] = []
        self.after: dict[int, list[tuple[int, float]]] = {}  # token -> the target's top-k next tokens after it
        self.freq: Counter[int] = Counter()

    def extend(self, ids: list[int]) -> None:
        """Tokens committed to the context (prompt, then every emitted token)."""
        self.ctx.extend(ids)
        self.freq.update(ids)

    def observe(self, input_ids: list[int], logits: np.ndarray) -> None:
        """The target's logits after each of `input_ids` (rows of `logits`): keep the top-k per token."""
        k = self.topk
        if len(input_ids) == 0:
            return
        top = np.argpartition(-logits, k - 1, axis=1)[:, :k] if k < logits.shape[1] else \
            np.tile(np.arange(logits.shape[1]), (len(input_ids), 1))
        m = logits.max(axis=1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))).astype(np.float64)
        for r, tok in enumerate(input_ids):
            cand = top[r]
            vals = logits[r, cand].astype(np.float64) - lse[r]
            order = np.argsort(-vals, kind="stable")
            self.after[int(tok)] = [(int(cand[o]), float(vals[o])) for o in order]

    def _lookup(self, n_max: int) -> list[int]:
        """Prompt lookup: what followed the latest earlier occurrence of the last 3 (or 2) tokens."""
        ctx = self.ctx
        for n in (3, 2):
            if len(ctx) <= n:
                continue
            tail = ctx[-n:]
            for s in range(len(ctx) - n - 1, -1, -1):
                if ctx[s:s + n] == tail:
                    return ctx[s + n:s + n + n_max]
        return []

    def _fallback(self, exclude: set[int]) -> list[tuple[int, float]]:
        out = []
        for i, (tok, _) in enumerate(self.freq.most_common(self.topk + len(exclude))):
            if tok not in exclude:
                out.append((tok, FALLBACK_SCORE - 0.01 * i))
        return out[:self.topk]

    def _candidates(self, token: int, chain_next: int | None) -> list[tuple[int, float]]:
        out: list[tuple[int, float]] = []
        seen: set[int] = set()
        if chain_next is not None:
            out.append((chain_next, NGRAM_SCORE))
            seen.add(chain_next)
        for tok, lp in self.after.get(token, []):
            if tok not in seen and len(out) < self.topk:
                out.append((tok, lp))
                seen.add(tok)
        if not out:
            out = self._fallback(seen)
        return out[:self.topk]

    def draft(self, root: int) -> Tree:
        """The tree below `root` (the last emitted token, which is also the last token of the context)."""
        tree = Tree([root], [-1], [0])
        if self.budget <= 0:
            return tree
        chain = self._lookup(self.max_depth)
        on_chain = {0: 0}          # node -> index into chain of its next token
        cands: dict[int, list[tuple[int, float]]] = {}
        score = [0.0]

        def cands_of(u: int) -> list[tuple[int, float]]:
            if u not in cands:
                ci = on_chain.get(u)
                nxt = chain[ci] if ci is not None and ci < len(chain) else None
                cands[u] = self._candidates(tree.tokens[u], nxt) if tree.depths[u] < self.max_depth else []
            return cands[u]

        heap: list[tuple[float, int, int, int]] = []  # (-cumulative log-prob, order, parent, rank)
        order = 0
        if cands_of(0):
            heapq.heappush(heap, (-cands_of(0)[0][1], order, 0, 0))
        while heap and tree.width - 1 < self.budget:
            neg, _, parent, rank = heapq.heappop(heap)
            tok, _lp = cands_of(parent)[rank]
            node = tree.width
            tree.tokens.append(tok)
            tree.parents.append(parent)
            tree.depths.append(tree.depths[parent] + 1)
            score.append(-neg)
            ci = on_chain.get(parent)
            if ci is not None and ci < len(chain) and chain[ci] == tok:
                on_chain[node] = ci + 1
            order += 1
            if rank + 1 < len(cands_of(parent)):
                heapq.heappush(heap, (-(score[parent] + cands_of(parent)[rank + 1][1]), order, parent, rank + 1))
            kids = cands_of(node)
            if kids:
                order += 1
                heapq.heappush(heap, (-(score[node] + kids[0][1]), order, node, 0))
        return tree
