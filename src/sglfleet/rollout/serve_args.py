"""The DDTree rules on a host's rendered sglang command, before anything is deployed.

The serve role renders the container command; sglang would refuse a bad DDTree setting at startup,
but only after the image is pulled, the weights staged and the old server stopped. This runs the
same rules (``sglang_ddtree.config.resolve``, what patch 0015 calls inside sglang) on the rendered
argv on the controller, so a bad budget, a backend without a tree mask or overlap scheduling left on
is one clear error with nothing changed.
"""

from __future__ import annotations

from typing import Any

from sglfleet.pipeline.errors import UsageError

_VALUED = {
    "--speculative-algorithm": "algorithm",
    "--speculative-ddtree-budget": "budget",
    "--speculative-ddtree-topk": "topk",
    "--speculative-num-draft-tokens": "block_size",
    "--speculative-draft-model-path": "draft_model_path",
    "--attention-backend": "attention_backend",
    "--prefill-attention-backend": "prefill_attention_backend",
    "--decode-attention-backend": "decode_attention_backend",
    "--page-size": "page_size",
    "--speculative-verify-num-tokens": "verify_num_tokens",
}
_FLAGS = {"--disable-overlap-schedule": "disable_overlap_schedule", "--enable-dp-attention": "dp_attention"}


def ddtree_args_of(command: list[str]) -> dict[str, Any] | None:
    """The DDTree-relevant settings of an sglang argv, or None when it sets no budget."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(command):
        tok = str(command[i])
        key, _, inline = tok.partition("=")
        if key in _VALUED:
            if inline:
                out[_VALUED[key]] = inline
            elif i + 1 < len(command):
                out[_VALUED[key]] = str(command[i + 1])
                i += 1
        elif tok in _FLAGS:
            out[_FLAGS[tok]] = True
        i += 1
    if "budget" not in out and "topk" not in out:
        return None
    return out


def check_serve_command(host: str, command: list[str]) -> Any:
    """Raise UsageError (bad input, exit 2) naming the host and the rule; return the resolved
    DDTree args, or None for a command without DDTree."""
    args = ddtree_args_of(command)
    if args is None:
        return None
    try:
        from sglang_ddtree.config import DDTreeArgError, resolve
    except ImportError:
        raise UsageError("the DDTree rules (sglang_ddtree, patches/ddtree) are not installed: run make setup") from None
    if "budget" not in args:
        raise UsageError(f"{host}: --speculative-ddtree-topk without --speculative-ddtree-budget")
    try:
        return resolve(**{"disable_overlap_schedule": False, "dp_attention": False, "topk": None, "block_size": None,
                          "algorithm": None, "draft_model_path": None, "attention_backend": None, **args})
    except DDTreeArgError as e:
        raise UsageError(f"{host}: DDTree settings cannot start: {e}") from None
