"""TEST ONLY: make the DDTree drafter propose what the target will say.

A random (dummy-weight) drafter accepts almost nothing, so a proof with it never exercises a
multi-token commit. With ``DDTREE_ORACLE=<file.json>`` (``{"<prompt ids joined by ,>":
[target-only greedy output ids]}``), requests that carry ``custom_params.ddtree_oracle = true``
get, at each depth, the recorded next token among the top-k (at rank 0, or at rank 1 on every
third depth so that acceptance has to leave the first branch) and random siblings; the real
drafter still runs first (its KV path is exercised), only its proposals are replaced.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

TARGET = "sglang_ddtree.worker.DDTreeWorker._tree_candidates"
_table: dict[str, list[int]] | None = None


def _load_table() -> dict[str, list[int]]:
    global _table
    if _table is None:
        path = os.environ["DDTREE_ORACLE"]
        with open(path) as f:
            _table = json.load(f)
    return _table


def oracle_rows(prompt: list[int], n_out: int, cont: list[int], depth: int, k: int, vocab: int, salt: int):
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
        rank = 1 if (k > 1 and (i % 3) == 2) else 0
        ids.insert(rank, true_tok)
        logp = [math.log(0.55), math.log(0.35)] + [math.log(0.1 / (k - 1)) - 0.01 * r for r in range(max(k - 2, 0))]
        rows.append((logp[:k], ids[:k]))
    return rows


def _candidates(original: Any, self: Any, batch: Any, draft_hidden: Any):
    import torch

    logp, ids = original(self, batch, draft_hidden)
    wanted = [bool((getattr(r.sampling_params, "custom_params", None) or {}).get("ddtree_oracle")) for r in batch.reqs]
    if not any(wanted):
        return logp, ids
    table = _load_table()
    logp = logp.clone()
    ids = ids.clone()
    depth, k = logp.shape[1], logp.shape[2]
    vocab = int(self.model_runner.model_config.vocab_size)
    for b, req in enumerate(batch.reqs):
        if not wanted[b]:
            continue
        prompt = list(req.origin_input_ids)
        cont = table.get(",".join(map(str, prompt)))
        if cont is None:
            continue
        rows = oracle_rows(prompt, len(req.output_ids), cont, depth, k, vocab, salt=len(prompt))
        for d, row in enumerate(rows):
            if row is None:
                continue
            lp, tok = row
            logp[b, d] = torch.tensor(lp, dtype=logp.dtype, device=logp.device)
            ids[b, d] = torch.tensor(tok, dtype=ids.dtype, device=ids.device)
    return logp, ids


def load() -> None:
    if not os.environ.get("DDTREE_ORACLE"):
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _candidates, HookType.AROUND)
