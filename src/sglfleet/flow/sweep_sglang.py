"""The `sglang` kind of the sweep: one `python -m sglang.launch_server` per cell, started by the sweep.

    sweep:
      kind: sglang
      sglang: {model_path: /tmp/smollm2, draft_model_path: /tmp/smollm2-dflash, mem_fraction_static: 0.5}
      axes: {budget: [7, 15, 16, 31], topk: [2, 4, 8]}

Every cell is the target with DFLASH + DDTree at the cell's budget / top-k (and, when an axis names
them, its block size, attention backend or CUDA-graph setting); the baseline is the same server
without speculative decoding. Each cell's rendered command is checked with the rollout's own DDTree
rules (rollout.serve_args.check_serve_command -> sglang_ddtree.config.resolve, what sglang runs at
startup) before anything is started: a cell those rules refuse is an error row and is never started.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from sglfleet.pipeline.config import StrictModel, format_validation_error
from sglfleet.pipeline.errors import UsageError
from sglfleet.pipeline.server_proc import ServerProcess

# What an axis of an sglang sweep may vary: the DDTree settings, and per-cell overrides of the
# `sglang` section's fields of the same name.
CELL_SETTINGS = ("budget", "topk", "block_size", "attention_backend", "cuda_graph")
_SECTION_OVERRIDES = ("block_size", "attention_backend", "cuda_graph")
# Flags the kind renders itself from the section and the cell: not allowed in extra_args (the
# CUDA-graph switches are: `--disable-prefill-cuda-graph` keeps decode graphs with cuda_graph on).
RENDERED_FLAGS = (
    "--model-path", "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-draft-tokens",
    "--speculative-ddtree-budget", "--speculative-ddtree-topk", "--disable-overlap-schedule", "--attention-backend",
    "--host", "--port", "--nccl-port", "--mem-fraction-static", "--max-total-tokens",
)
# Linux's default ip_local_port_range starts here; NCCL ports that sglang binds late must stay below it.
EPHEMERAL_LOW = 32768
EAGER_FLAGS = ["--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"]  # sglang 0.5.23 spelling


class SGLangConfig(StrictModel):
    """The servers an sglang sweep starts. Field defaults are the sweep's defaults."""

    model_path: str = Field(min_length=1, description="the target checkpoint (--model-path)")
    draft_model_path: str = Field(min_length=1, description="the DFlash drafter (--speculative-draft-model-path)")
    block_size: int = Field(default=8, ge=2, description="the DFlash block (--speculative-num-draft-tokens)")
    attention_backend: str = Field(default="triton", min_length=1, description="a tree-mask backend for DDTree")
    python: str = Field(default_factory=lambda: sys.executable, min_length=1,
                        description="the interpreter that has sglang (with the patch series)")
    extra_args: list[str] = Field(default_factory=list, description="more launch_server arguments, every server")
    host: str = "127.0.0.1"
    port_base: int = Field(default=30000, ge=1024, le=65000, description="baseline port; cell i gets +1+i")
    nccl_port_offset: int = Field(default=1000, ge=1, description="each server's --nccl-port is its port + this")
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1, description="per server; None: sglang's")
    max_total_tokens: int | None = Field(default=None, ge=1, description="KV pool cap per server")
    cuda_graph: bool = True
    startup_timeout_s: float = Field(default=900.0, gt=0, description="launch to /health + /v1/models")
    start: Literal["all", "one_at_a_time"] = Field(
        default="all", description="all: every server loads at once, then cells are gated in turn")

    @field_validator("extra_args")
    @classmethod
    def _no_rendered_flags(cls, v: list[str]) -> list[str]:
        clash = sorted({a.partition("=")[0] for a in v} & set(RENDERED_FLAGS))
        if clash:
            raise ValueError(f"{clash} are rendered by the sweep from the `sglang` section and the cell; "
                             "set the section's field (or an axis) instead")
        return v


def server_command(s: SGLangConfig, port: int, spec: dict[str, Any] | None) -> list[str]:
    """One launch_server argv: the baseline when `spec` is None, else DFLASH (+ DDTree when the
    cell sets a budget or top-k). The baseline is the target as it would be served alone: no
    speculative flags and the overlap scheduler on (DDTree needs it off)."""
    c = [s.python, "-m", "sglang.launch_server", "--model-path", s.model_path]
    if spec is not None:
        c += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", s.draft_model_path,
              "--speculative-num-draft-tokens", str(s.block_size)]
        for key, flag in (("budget", "--speculative-ddtree-budget"), ("topk", "--speculative-ddtree-topk")):
            if key in spec:
                c += [flag, str(spec[key])]
        c += ["--disable-overlap-schedule"]
    c += ["--attention-backend", s.attention_backend, "--port", str(port), "--host", s.host,
          "--nccl-port", str(port + s.nccl_port_offset)]
    if s.mem_fraction_static is not None:
        c += ["--mem-fraction-static", f"{s.mem_fraction_static:g}"]
    if s.max_total_tokens is not None:
        c += ["--max-total-tokens", str(s.max_total_tokens)]
    if not s.cuda_graph:
        c += EAGER_FLAGS
    return c + list(s.extra_args)


def cell_command(s: SGLangConfig, settings: dict[str, Any], port: int, label: str) -> list[str]:
    """The cell's argv, after the rollout's DDTree rules accepted it; UsageError naming the cell otherwise."""
    from sglfleet.rollout.serve_args import check_serve_command

    unknown = sorted(set(settings) - set(CELL_SETTINGS))
    if unknown:
        raise UsageError(f"unknown setting(s) {unknown} for an sglang cell; known: {list(CELL_SETTINGS)}")
    try:
        cell_cfg = SGLangConfig.model_validate(
            {**s.model_dump(), **{k: settings[k] for k in _SECTION_OVERRIDES if k in settings}})
    except ValidationError as exc:
        raise UsageError(format_validation_error(exc, f"invalid cell settings {settings}")) from None
    argv = server_command(cell_cfg, port, {k: settings[k] for k in ("budget", "topk") if k in settings})
    check_serve_command(f"cell {label}", argv[3:])  # the same rules sglang runs at startup (patch 0015)
    return argv


def cell_server(command: list[str], s: SGLangConfig, port: int, run_dir: Path, name: str) -> ServerProcess:
    return ServerProcess(command, f"http://{s.host}:{port}", run_dir / f"sglang-{port}.log",
                         timeout_s=s.startup_timeout_s, name=name)


__all__ = ["CELL_SETTINGS", "SGLangConfig", "cell_command", "cell_server", "server_command"]
