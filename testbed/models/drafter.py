"""A DFlash drafter checked against its target before any server starts.

sglang 0.5.23 loads a DFlashDraftModel checkpoint whose config.json carries
``architectures: [DFlashDraftModel]`` and a ``dflash_config`` with ``block_size``,
``target_layer_ids`` (the target layers whose hidden states the drafter reads) and a mask token.
A drafter trained for another target or block loads without complaint and then drafts garbage
(accept length 1) or fails deep in the first decode; this check names the mismatch instead.

    python -m testbed.models check-drafter --target DIR --drafter DIR [--block-size 8]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglfleet.pipeline.errors import UsageError


@dataclass(frozen=True)
class DrafterInfo:
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int | None
    num_hidden_layers: int


def _load(path: Path | str, what: str) -> dict[str, Any]:
    p = Path(path)
    f = p / "config.json" if p.is_dir() else p
    try:
        return json.loads(f.read_text())
    except OSError:
        raise UsageError(f"{what}: no config.json at {p}") from None
    except ValueError as e:
        raise UsageError(f"{what}: {f} is not JSON ({e})") from None


def check(target: dict[str, Any], drafter: dict[str, Any], *, block_size: int | None = None) -> DrafterInfo:
    """Raise UsageError naming the first mismatch between a drafter config and its target config."""
    if "DFlashDraftModel" not in (drafter.get("architectures") or []):
        raise UsageError(f"drafter architectures {drafter.get('architectures')} is not [DFlashDraftModel]")
    dcfg = drafter.get("dflash_config") or {}
    blk = dcfg.get("block_size", drafter.get("block_size"))
    if not isinstance(blk, int) or isinstance(blk, bool) or blk < 2:
        raise UsageError(f"drafter dflash_config.block_size must be an integer >= 2, got {blk!r}")
    if block_size is not None and blk != block_size:
        raise UsageError(f"drafter was trained for block size {blk}, the server is configured for {block_size} "
                         "(--speculative-num-draft-tokens)")
    n_target = int(target.get("num_hidden_layers", 0))
    ids = dcfg.get("target_layer_ids", drafter.get("target_layer_ids"))
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise UsageError(f"drafter dflash_config.target_layer_ids must be a non-empty list of ints, got {ids!r}")
    bad = [i for i in ids if not 0 <= i < n_target]
    if bad:
        raise UsageError(f"drafter reads target layers {bad}, but the target has {n_target} layers (0..{n_target - 1})")
    if len(set(ids)) != len(ids):
        raise UsageError(f"drafter target_layer_ids repeat a layer: {ids}")
    # sglang captures the residual stream entering layer id + 1 (set_dflash_layers_to_capture), in
    # layer order: the last layer's output is never captured, and features come in increasing order.
    if n_target - 1 in ids:
        raise UsageError(f"drafter reads target layer {n_target - 1}, the last one: sglang captures the input of "
                         f"layer id + 1, and there is no layer {n_target}")
    if ids != sorted(ids):
        raise UsageError(f"drafter target_layer_ids {ids} must increase: sglang concatenates the captured layers "
                         "in layer order")
    for key in ("vocab_size", "hidden_size"):
        if drafter.get(key) != target.get(key):
            raise UsageError(f"drafter {key} {drafter.get(key)} != target {key} {target.get(key)}")
    mask = dcfg.get("mask_token_id", drafter.get("mask_token_id"))
    if mask is not None and not (isinstance(mask, int) and 0 <= mask < int(target["vocab_size"])):
        raise UsageError(
            f"drafter mask_token_id {mask!r} is outside the target vocabulary (0..{target['vocab_size'] - 1})"
        )
    return DrafterInfo(block_size=blk, target_layer_ids=tuple(ids), mask_token_id=mask,
                       num_hidden_layers=int(drafter.get("num_hidden_layers", 0)))


def check_dirs(target_dir: Path | str, drafter_dir: Path | str, *, block_size: int | None = None) -> DrafterInfo:
    return check(_load(target_dir, "target"), _load(drafter_dir, "drafter"), block_size=block_size)


def drafter_config_for(target: dict[str, Any], *, block_size: int = 8, layers: int = 1,
                       target_layer_ids: list[int] | None = None, mask_token_id: int | None = None) -> dict[str, Any]:
    """A DFlashDraftModel config shaped for ``target`` (what the GPU proof's dummy drafter uses)."""
    n = int(target["num_hidden_layers"])
    mask = int(target["vocab_size"]) - 1 if mask_token_id is None else mask_token_id
    cfg = dict(target, architectures=["DFlashDraftModel"], num_hidden_layers=layers,
               dflash_config={"block_size": block_size,
                              "target_layer_ids": target_layer_ids or sorted({1, n // 2, n - 2}),
                              "mask_token_id": mask})
    check(target, cfg, block_size=block_size)
    return cfg
