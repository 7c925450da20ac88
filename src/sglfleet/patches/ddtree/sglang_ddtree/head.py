"""The drafter's top-k per depth, folded into the draft model's CUDA graph.

DFLASH folds its greedy head (the target's ``lm_head`` matmul plus an argmax) into the draft
graph through a capture hook. DDTree inherited that hook, ran the argmax it never reads, then
multiplied the same hidden states by the same head again, eagerly, for its top-k: two
128 256 x 4096 head passes a step and a dozen host-issued launches (docs/ddtree-step.md, the
``topk`` stage). ``DraftTopKHead`` replaces DFLASH's hook on DDTree servers: the graph computes
the top-``K`` log-probabilities and token ids of every depth into static buffers, and the step
reads them after the replay. Eager draft forwards (no graph for the batch) compute the same
numbers through the same function, ``draft_topk``.
"""

from __future__ import annotations

import torch

from .tree_device import topk_chunked


def draft_topk(hidden: torch.Tensor, weight: torch.Tensor, vocab: int, block_size: int,
               k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``hidden`` ``[bs * B, H]`` (the drafter's block, position 0 the root), ``weight`` the
    head ``[>= vocab, H]``: the top-``k`` log-probabilities (float32, sorted best first) and ids
    (int64) of depths ``1..B-1``, ``[bs * (B - 1), k]`` each. Top-k of the raw logits in
    vocabulary slices, normalised by one logsumexp: no log-softmax is written. With a bf16 head
    each term of the sum is rounded to bf16 (relative 2**-9), so the log-probs are within about
    0.002 nats of a float32 log-softmax; the tree's shape, never the output, depends on them."""
    h = hidden.view(-1, block_size, hidden.shape[-1])[:, 1:, :].reshape(-1, hidden.shape[-1])
    if h.dtype != weight.dtype:
        h = h.to(weight.dtype)
    logits = torch.matmul(h, weight[:vocab].t())
    vals, ids = topk_chunked(logits, k)
    # logsumexp with a float32 sum but no float32 copy of the logits: inside the draft graph
    # every temporary is held at the largest captured batch
    top = logits.amax(dim=-1, keepdim=True)
    lse = top.float() + torch.log(torch.exp(logits - top).sum(dim=-1, keepdim=True, dtype=torch.float32))
    return vals.float() - lse, ids.to(torch.int64)


class DraftTopKHead:
    """Capture-safe ``draft_topk`` (a draft-graph tail hook's callee, as DFLASH's
    ``_DflashDraftSampler``): writes into buffers whose addresses the captured graph keeps.
    ``read(bs)`` gives the rows of the last replay, ``[bs, B-1, K]``; they are overwritten by the
    next replay, so a step uses them before its next draft forward."""

    def __init__(self, *, weight: torch.Tensor, vocab: int, block_size: int, k: int, max_bs: int) -> None:
        self.weight, self.vocab, self.block_size, self.k = weight, int(vocab), int(block_size), int(k)
        rows = int(max_bs) * (self.block_size - 1)
        self.logp = torch.empty((rows, self.k), dtype=torch.float32, device=weight.device)
        self.ids = torch.empty((rows, self.k), dtype=torch.int64, device=weight.device)

    def __call__(self, hidden_states: torch.Tensor, input_ids: torch.Tensor | None = None) -> None:
        logp, ids = draft_topk(hidden_states, self.weight, self.vocab, self.block_size, self.k)
        n = logp.shape[0]
        self.logp[:n].copy_(logp)
        self.ids[:n].copy_(ids)

    def read(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = bs * (self.block_size - 1)
        return (self.logp[:n].view(bs, self.block_size - 1, self.k),
                self.ids[:n].view(bs, self.block_size - 1, self.k))
