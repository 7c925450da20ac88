"""TEST ONLY: make the drafter propose what the target will say.

A random (dummy-weight) drafter accepts almost nothing, so a proof with it never exercises a
multi-token commit. With ``DDTREE_ORACLE=<file.json>`` (``{"<prompt ids joined by ,>":
[target-only greedy output ids]}``), requests that carry ``custom_params.ddtree_oracle`` get the
recorded continuation as the draft; the real drafter still runs first (its KV path is exercised),
only its proposals are replaced. Two modes:

- ``true`` / ``"branch"``: at each depth the recorded token is among the top-k, at rank 0, or at
  rank 1 on every third depth (so DDTree's acceptance has to leave the first branch), with random
  siblings. The DFLASH chain proposes rank 0, so it misses on those depths.
- ``"top1"``: the recorded token at rank 0 at every depth: the chain accepts its whole block while
  the recording lasts; the tree, shaped by the same fixed log-probs (0.55, 0.35, ...), still spends
  part of its budget on siblings.

DDTree is hooked at ``DDTreeWorker._tree_candidates``; the DFLASH chain at
``DFlashVerifyInput.prepare_for_verify`` (its draft tokens are written in place before the
verify; a tree verify, which carries a custom mask, is left alone). Each hook builds its rows on
the host and copies them to the device once per step.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

TARGET = "sglang_ddtree.worker.DDTreeWorker._tree_candidates"
CHAIN_TARGET = "sglang.srt.speculative.dflash_info.DFlashVerifyInput.prepare_for_verify"
_table: dict[str, list[int]] | None = None


def _load_table() -> dict[str, list[int]]:
    global _table
    if _table is None:
        path = os.environ["DDTREE_ORACLE"]
        with open(path) as f:
            _table = json.load(f)
    return _table


def mode_of(value: Any) -> str | None:
    """The oracle mode a request asks for, None for none."""
    if value is True or value == "branch":
        return "branch"
    if value == "top1":
        return "top1"
    if value in (None, False, "", "off"):
        return None
    raise ValueError(f"ddtree_oracle must be true, 'branch' or 'top1', got {value!r}")


def true_rank(i: int, k: int, mode: str) -> int:
    """Rank of the recorded token for output index ``i``."""
    return 1 if (mode == "branch" and k > 1 and i % 3 == 2) else 0


def oracle_rows(prompt: list[int], n_out: int, cont: list[int], depth: int, k: int, vocab: int, salt: int,
                mode: str = "branch"):
    """Per depth (1..depth): (log-probs, ids) of k candidates with the recorded token placed."""
    import random

    rng = random.Random(salt * 1000003 + n_out)
    rows = []
    for d in range(1, depth + 1):
        i = n_out + d - 1
        if i >= len(cont):
            rows.append(None)
            continue
        true_tok = cont[i]
        ids = []
        while len(ids) < k - 1:
            t = rng.randrange(vocab)
            if t != true_tok and t not in ids:
                ids.append(t)
        ids.insert(true_rank(i, k, mode), true_tok)
        logp = [math.log(0.55), math.log(0.35)] + [math.log(0.1 / (k - 1)) - 0.01 * r for r in range(max(k - 2, 0))]
        rows.append((logp[:k], ids[:k]))
    return rows


def chain_row(n_out: int, cont: list[int], depth: int, mode: str) -> list[int | None]:
    """The chain's rank-0 proposal per depth under the same placement (None past the recording):
    the recorded token, or a different one where the tree oracle puts it at rank 1."""
    out: list[int | None] = []
    for d in range(1, depth + 1):
        i = n_out + d - 1
        if i >= len(cont):
            out.append(None)
        elif true_rank(i, 4, mode) == 0:
            out.append(cont[i])
        else:
            out.append(cont[i] - 1 if cont[i] > 0 else cont[i] + 1)  # in the vocabulary, not the token
    return out


def _wanted(batch: Any) -> list[str | None]:
    return [mode_of((getattr(r.sampling_params, "custom_params", None) or {}).get("ddtree_oracle"))
            for r in batch.reqs]


def _candidates(original: Any, self: Any, batch: Any, draft_hidden: Any):
    import numpy as np
    import torch

    logp, ids = original(self, batch, draft_hidden)
    wanted = _wanted(batch)
    if not any(wanted):
        return logp, ids
    table = _load_table()
    bs, depth, k = (int(x) for x in logp.shape)
    vocab = int(self.model_runner.model_config.vocab_size)
    lp_h = np.zeros((bs, depth, k), dtype=np.float32)
    id_h = np.zeros((bs, depth, k), dtype=np.int64)
    use = np.zeros((bs, depth, 1), dtype=bool)
    for b, req in enumerate(batch.reqs):
        if not wanted[b]:
            continue
        prompt = list(req.origin_input_ids)
        cont = table.get(",".join(map(str, prompt)))
        if cont is None:
            continue
        rows = oracle_rows(prompt, len(req.output_ids), cont, depth, k, vocab, salt=len(prompt), mode=wanted[b])
        for d, row in enumerate(rows):
            if row is not None:
                lp_h[b, d], id_h[b, d], use[b, d] = row[0], row[1], True
    dev = logp.device
    use_d = torch.from_numpy(use).to(dev)
    logp = torch.where(use_d, torch.from_numpy(lp_h).to(dev, logp.dtype), logp)
    ids = torch.where(use_d, torch.from_numpy(id_h).to(dev, ids.dtype), ids)
    return logp, ids


def _chain_verify(original: Any, self: Any, batch: Any, *args: Any, **kwargs: Any):
    if getattr(self, "custom_mask", None) is None and not batch.forward_mode.is_idle():
        wanted = _wanted(batch)
        if any(wanted):
            _write_chain(self, batch, wanted)
    return original(self, batch, *args, **kwargs)


def _write_chain(verify_input: Any, batch: Any, wanted: list[str | None]) -> None:
    import numpy as np
    import torch

    table = _load_table()
    width = int(verify_input.draft_token_num)
    bs = len(batch.reqs)
    draft = verify_input.draft_token.view(bs, width)
    tok = np.zeros((bs, width - 1), dtype=np.int64)
    use = np.zeros((bs, width - 1), dtype=bool)
    for b, req in enumerate(batch.reqs):
        if not wanted[b]:
            continue
        cont = table.get(",".join(map(str, req.origin_input_ids)))
        if cont is None:
            continue
        for d, t in enumerate(chain_row(len(req.output_ids), cont, width - 1, wanted[b])):
            if t is not None:
                tok[b, d], use[b, d] = t, True
    dev = draft.device
    rows = torch.where(torch.from_numpy(use).to(dev), torch.from_numpy(tok).to(dev, draft.dtype), draft[:, 1:])
    draft[:, 1:].copy_(rows)


def load() -> None:
    if not os.environ.get("DDTREE_ORACLE"):
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _candidates, HookType.AROUND)
    HookRegistry.register(CHAIN_TARGET, _chain_verify, HookType.AROUND)
