"""The host's view of a decode step's request lengths, for the step's KV plans and buffer sizes.

A step's KV plans (the drafter's block, the verify window, the drafter's context write) and the flat verify
mask need a host-side bound on each request's length: the attention backends size buffers from it, and the
kernels read the exact lengths from the device. Three sources, best first:

* ``exact``: the scheduler's host copy of the committed prefix lengths (the non-overlap scheduler keeps one;
  under the overlap scheduler, backends that ask for it get it from the step before's published lengths);
* ``reserved``: under the overlap scheduler with a backend that runs from device lengths alone (triton), no
  host copy exists; the KV each request has reserved for this step (DFLASH v2's ``nxt_kv_lens_cpu``, set by
  its ``prepare_for_decode`` on the host) bounds the window: the reserve covers a block of lag plus the verify
  window (patch 0016, checked at start), so ``reserved >= prefix + window`` without waiting for the GPU.
  This is what sglang's own DFLASH v2 worker plans from in that case;
* ``synced``: the device lengths copied to the host, which waits for every step queued before this one. Kept
  for the numpy reference path (it needs the exact lengths) and, with ``SGLANG_DDTREE_SYNC_LENS=1``, to measure
  the cut against (bench/ddtree_real.py ``--overlap-sync-budgets``).

Plain torch (no sglang): tests/ddtree/test_ddtree_lens.py runs it on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

SYNC_ENV = "SGLANG_DDTREE_SYNC_LENS"


def sync_forced(env: Any = None) -> bool:
    """Whether ``SGLANG_DDTREE_SYNC_LENS=1`` asks for the device lengths' host copy every step."""
    return str((os.environ if env is None else env).get(SYNC_ENV, "")).strip() == "1"


@dataclass(frozen=True)
class HostLens:
    """Per-request host lengths of one step: ``prefix`` (exact committed lengths) or ``reserved`` (a bound on
    ``prefix + window``), never both; ``source`` says which (exact / reserved / synced)."""

    source: str
    window: int
    prefix: torch.Tensor | None = None
    reserved: torch.Tensor | None = None

    def bound(self, width: int) -> torch.Tensor:
        """int32 per request, at least ``prefix + width``: the host bound of a forward writing ``width`` slots
        from the prefix (DFLASH's convention: committed prefix + the slots the forward writes)."""
        if width < 1 or width > self.window:
            raise ValueError(f"a step's forwards write 1..{self.window} slots per request, got {width}")
        if self.prefix is not None:
            return self.prefix.to(torch.int32) + width
        assert self.reserved is not None
        return self.reserved.to(torch.int32)

    @property
    def exact(self) -> bool:
        return self.prefix is not None


def host_lens(*, seq_lens_cpu: torch.Tensor | None, reserved: torch.Tensor | None, device_lens: torch.Tensor,
              window: int, need_exact: bool = False, sync: bool = False) -> HostLens:
    """The best host lengths a step can have without waiting (see the module docstring). ``need_exact``: the
    caller reads the exact lengths on the host (the numpy reference path), ``sync``: measure the wait."""
    bs = int(device_lens.shape[0])
    if seq_lens_cpu is not None and not need_exact:
        return HostLens("exact", window, prefix=seq_lens_cpu.to(torch.int64))
    if reserved is not None and not need_exact and not sync and int(reserved.shape[0]) == bs:
        # a copy: the scheduler refills its buffer while this step's plans may still hold the tensor
        return HostLens("reserved", window, reserved=reserved.to(torch.int64).clone())
    return HostLens("synced", window, prefix=device_lens.to("cpu", torch.int64))


def mask_cells(lens: HostLens, width: int, limit: int | None = None) -> int:
    """Cells of the flat verify mask for ``width`` nodes per request: each request's ``width x (bound)`` block
    (bound = prefix + width, or the reservation) plus ``bs x width x width`` of padding that the backends check
    against the host bound (cells past the last block are never read). ``limit``: the target's captured mask
    buffer (graph replays copy the mask into it; the real layout, from device lengths, always fits it, an
    over-estimate from the reservation may not near the context's end)."""
    bound = lens.bound(width)
    cells = width * int(bound.sum()) + int(bound.shape[0]) * width * width
    return cells if limit is None else min(cells, int(limit))
