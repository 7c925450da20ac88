"""The ``sglang.srt.plugins`` entry point: DFLASH creates ``DDTreeWorker`` when a budget is set.

sglang calls ``load`` in each of its processes (launcher, scheduler, detokenizer) and applies
the hooks right after. The hook only chooses the worker class; argument rules live in
``config`` (called from sglang's resolution through patch 0015), and patch 0015 makes DFLASH
refuse a budget if this hook did not answer (a plugin that failed to load is never a silent
fallback to DFLASH's chain).
"""

from __future__ import annotations

from typing import Any

TARGET = "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker"


def _create_worker(original: Any, self: Any, server_args: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    if self.is_dflash() and getattr(cfg, "speculative_ddtree_budget", None) is not None:
        from .worker import DDTreeWorker

        return DDTreeWorker
    return original(self, server_args, *args, **kwargs)


def load() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _create_worker, HookType.AROUND)
