"""The DDTree rules on a host's rendered sglang command, before anything is deployed.

The serve role renders the container command; sglang would refuse a bad DDTree setting at startup,
but only after the image is pulled, the weights staged and the old server stopped. This runs the
same rules (``sglang_ddtree.config.resolve``, what patch 0015 calls inside sglang) on the rendered
argv on the controller, so a bad budget, a backend without a tree mask or overlap scheduling left on
is one clear error with nothing changed.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

from sglfleet import paths
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

_RULES_MODULE = "sglfleet._sglang_ddtree_config"


def _ddtree_rules() -> ModuleType:
    """sglang_ddtree.config: the installed plugin's (make setup installs it), else the copy of its sources the
    package carries (src/sglfleet/patches/ddtree, package data: an installed controller has it too). The module
    is plain Python (dataclasses, typing), loaded alone, without the plugin's torch parts."""
    try:
        from sglang_ddtree import config

        return config
    except ImportError:
        pass
    if _RULES_MODULE in sys.modules:
        return sys.modules[_RULES_MODULE]
    src = paths.PATCHES_DIR / "ddtree" / "sglang_ddtree" / "config.py"
    spec = importlib.util.spec_from_file_location(_RULES_MODULE, src) if src.is_file() else None
    if spec is None or spec.loader is None:
        raise UsageError(f"the DDTree rules (sglang_ddtree) are neither installed nor at {src}: run make setup")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[_RULES_MODULE] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod

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
    rules = _ddtree_rules()
    DDTreeArgError, resolve = rules.DDTreeArgError, rules.resolve
    if "budget" not in args:
        raise UsageError(f"{host}: --speculative-ddtree-topk without --speculative-ddtree-budget")
    try:
        # the fleet's hosts run DDTree without the overlap scheduler until an H200 run shows that path exact: the
        # controller's own SGLANG_DDTREE_OVERLAP is not the host's, so it is never read here
        return resolve(**{"disable_overlap_schedule": False, "dp_attention": False, "topk": None, "block_size": None,
                          "algorithm": None, "draft_model_path": None, "attention_backend": None,
                          "overlap_opt_in": False, **args})
    except DDTreeArgError as e:
        raise UsageError(f"{host}: DDTree settings cannot start: {e}") from None
