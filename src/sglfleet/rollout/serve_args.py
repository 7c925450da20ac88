"""The DDTree rules on a host's rendered sglang command, before anything is deployed.

The serve role renders the container command; sglang would refuse a bad DDTree setting at startup,
but only after the image is pulled, the weights staged and the old server stopped. This runs the
same rules (``sglang_ddtree.config.resolve``, what patch 0015 calls inside sglang) on the rendered
argv on the controller, so a bad budget, a backend without a tree mask or overlap scheduling left on
is one clear error with nothing changed. Whether a host opted into DDTree under the overlap scheduler
(``SGLANG_DDTREE_OVERLAP=1``, the serve role's ``serve_spec_ddtree_overlap``) is read from that host's
rendered container env, never from the controller's own environment.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
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


def check_serve_command(host: str, command: list[str], env: Mapping[str, Any] | None = None) -> Any:
    """Raise UsageError (bad input, exit 2) naming the host and the rule; return the resolved
    DDTree args, or None for a command without DDTree. ``env``: the environment the host's server
    process gets (the rendered spec's ``env``); None is an empty one. The overlap opt-in counts only
    as the plugin reads it there (``sglang_ddtree.config.overlap_opted_in``: the value ``1``); the
    controller's own environment is never read. An opt-in on a command without DDTree is bad input."""
    args = ddtree_args_of(command)
    if args is None and not env:
        return None
    rules = _ddtree_rules()
    # the host's env, never the controller's: overlap_opted_in(None) would read this process's environment
    opted_in = bool(rules.overlap_opted_in(dict(env or {})))
    if args is None:
        if opted_in:
            raise UsageError(f"{host}: {rules.OVERLAP_ENV}=1 in the server's environment opts DDTree into the "
                             "overlap scheduler, but its command runs no DDTree (no --speculative-ddtree-budget): "
                             "set serve_spec_ddtree_overlap only with serve_spec_algorithm DDTREE")
        return None
    DDTreeArgError, resolve = rules.DDTreeArgError, rules.resolve
    if "budget" not in args:
        raise UsageError(f"{host}: --speculative-ddtree-topk without --speculative-ddtree-budget")
    try:
        return resolve(**{"disable_overlap_schedule": False, "dp_attention": False, "topk": None, "block_size": None,
                          "algorithm": None, "draft_model_path": None, "attention_backend": None,
                          "overlap_opt_in": opted_in, **args})
    except DDTreeArgError as e:
        raise UsageError(f"{host}: DDTree settings cannot start: {e}") from None
