"""DDTree server-argument rules, in one place.

Pure Python (no sglang, no torch): sglang's argument resolution calls ``resolve`` through patch
0015 at startup, and the rollout calls it when it renders a host's command, so a bad budget is
refused before anything is deployed, with the same message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# Attention backends whose target-verify honours an arbitrary tree mask (with patches 0011-0014).
# trtllm_mha (the SM100/SM103 default) and fa3/fa4 run verify as a causal chain only.
TREE_MASK_BACKENDS = ("triton", "flashinfer")
# Upper bounds that keep the verify pass sane; the CUDA-graph capture width is budget + 1.
MAX_BUDGET = 255
MAX_TOPK = 64
# DDTree under sglang's overlap scheduler: built (the worker fences the scheduler's next writes behind its own
# req_to_token commit, see worker.DDTreeWorker._fence_scheduler_writes) and opted into per server with this
# variable (b16/k4 passed 8 of 8 production-sequence gates on an H100, docs/production-gate.md; the serve role sets
# it with serve_spec_ddtree_overlap); without it the overlap scheduler is refused.
OVERLAP_ENV = "SGLANG_DDTREE_OVERLAP"


def overlap_opted_in(env: Any = None) -> bool:
    """Whether ``SGLANG_DDTREE_OVERLAP=1`` is set (in ``env``, default the process environment)."""
    return str((os.environ if env is None else env).get(OVERLAP_ENV, "")).strip() == "1"


class DDTreeArgError(ValueError):
    """A DDTree server argument that cannot start."""


@dataclass(frozen=True)
class DDTreeArgs:
    budget: int
    topk: int
    block_size: int

    @property
    def verify_width(self) -> int:
        """Tree nodes verified per request in one target pass: the root (last committed token)
        plus ``budget`` drafted nodes."""
        return self.budget + 1

    @property
    def max_depth(self) -> int:
        """The drafter predicts block_size - 1 positions after the root."""
        return self.block_size - 1


def max_tree_nodes(block_size: int, topk: int) -> int:
    """Largest tree a block can hold: ``topk`` children per node, depth <= block_size - 1."""
    return sum(topk**d for d in range(1, block_size))


def _as_int(name: str, value: Any) -> int:
    """An int, or the decimal string of one (rendered commands carry strings)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise DDTreeArgError(f"{name} must be an integer, got {value!r}")


def resolve(
    *,
    budget: Any,
    topk: Any,
    block_size: Any,
    algorithm: str | None,
    draft_model_path: str | None,
    attention_backend: str | None,
    prefill_attention_backend: str | None = None,
    decode_attention_backend: str | None = None,
    page_size: Any = None,
    disable_overlap_schedule: bool = False,
    verify_num_tokens: Any = None,
    dp_attention: bool = False,
    overlap_opt_in: bool | None = None,
) -> DDTreeArgs:
    """Check every DDTree argument together; return the resolved values or raise one
    ``DDTreeArgError`` naming the flag and what would work. ``overlap_opt_in``: whether the overlap scheduler is
    opted into (default: ``SGLANG_DDTREE_OVERLAP=1`` in this process's environment)."""
    if (algorithm or "").upper() != "DFLASH":
        raise DDTreeArgError(
            "--speculative-ddtree-budget rides the DFLASH drafter: set --speculative-algorithm DFLASH "
            f"(got {algorithm!r})"
        )
    budget = _as_int("--speculative-ddtree-budget", budget)
    topk = _as_int("--speculative-ddtree-topk", 4 if topk is None else topk)
    if block_size is None:
        raise DDTreeArgError("DDTree needs the DFlash block size (--speculative-num-draft-tokens)")
    block_size = _as_int("--speculative-num-draft-tokens", block_size)
    if block_size < 2:
        raise DDTreeArgError(f"DDTree needs a DFlash block of at least 2 (got {block_size})")
    if not 1 <= budget <= MAX_BUDGET:
        raise DDTreeArgError(f"--speculative-ddtree-budget must be in 1..{MAX_BUDGET}, got {budget}")
    if not 1 <= topk <= MAX_TOPK:
        raise DDTreeArgError(f"--speculative-ddtree-topk must be in 1..{MAX_TOPK}, got {topk}")
    cap = max_tree_nodes(block_size, topk)
    if budget > cap:
        raise DDTreeArgError(
            f"--speculative-ddtree-budget {budget} exceeds the largest tree a block of {block_size} holds "
            f"with top-k {topk} ({cap} nodes: depth <= {block_size - 1}); lower the budget or raise the top-k"
        )
    if not draft_model_path:
        raise DDTreeArgError("DDTree needs the DFlash drafter: set --speculative-draft-model-path")
    backends = {
        "--attention-backend": attention_backend,
        "--prefill-attention-backend": prefill_attention_backend,
        "--decode-attention-backend": decode_attention_backend,
    }
    if attention_backend is None and decode_attention_backend is None:
        raise DDTreeArgError(
            "DDTree verifies a tree mask: set --attention-backend to one of "
            f"{', '.join(TREE_MASK_BACKENDS)} explicitly (the platform default, e.g. trtllm_mha on "
            "SM100/SM103, has no custom mask)"
        )
    for flag, name in backends.items():
        if name is not None and name not in TREE_MASK_BACKENDS:
            raise DDTreeArgError(
                f"{flag} {name} has no tree-mask target verify; DDTree needs one of {', '.join(TREE_MASK_BACKENDS)}"
            )
    if page_size is not None and _as_int("--page-size", page_size) != 1:
        raise DDTreeArgError(
            f"DDTree commits tree nodes by remapping single KV slots: --page-size must be 1, got {page_size}"
        )
    if not disable_overlap_schedule and not (overlap_opted_in() if overlap_opt_in is None else overlap_opt_in):
        raise DDTreeArgError(
            "DDTree runs under the overlap scheduler only when the server opts in: add --disable-overlap-schedule, "
            f"or set {OVERLAP_ENV}=1 in the server's environment to run it"
        )
    if dp_attention:
        raise DDTreeArgError("DDTree does not support --enable-dp-attention")
    args = DDTreeArgs(budget=budget, topk=topk, block_size=block_size)
    width = None if verify_num_tokens is None else _as_int("--speculative-verify-num-tokens", verify_num_tokens)
    if width is not None and width != args.verify_width:
        raise DDTreeArgError(
            f"--speculative-verify-num-tokens {verify_num_tokens} contradicts --speculative-ddtree-budget {budget} "
            f"(the verify width is budget + 1 = {args.verify_width}); leave it unset, it is derived"
        )
    return args


def resolve_from_server_args(cfg: Any) -> DDTreeArgs:
    """``resolve`` over an sglang ServerArgs (or its resolving view)."""
    g = lambda name, default=None: getattr(cfg, name, default)  # noqa: E731
    return resolve(
        budget=g("speculative_ddtree_budget"),
        topk=g("speculative_ddtree_topk"),
        block_size=g("speculative_num_draft_tokens"),
        algorithm=g("speculative_algorithm"),
        draft_model_path=g("speculative_draft_model_path"),
        attention_backend=g("attention_backend"),
        prefill_attention_backend=g("prefill_attention_backend"),
        decode_attention_backend=g("decode_attention_backend"),
        page_size=g("page_size"),
        disable_overlap_schedule=bool(g("disable_overlap_schedule", False)),
        verify_num_tokens=g("speculative_verify_num_tokens"),
        dp_attention=bool(g("enable_dp_attention", False)),
    )
