"""The sweep's sglang kind on CPU: grid validation, the commands it renders, DDTree settings refused
before anything starts (error rows, the matrix goes on), and real server processes that fail to
come up (this venv has no sglang: `python -m sglang.launch_server` exits at once) reported with
their log tail. sglang's own parser on every rendered command: tests/ddtree/test_sweep_sglang_args.py."""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from sglfleet.flow.sweep import SweepConfig, load_sweep_config, run_sweep
from sglfleet.flow.sweep_sglang import SGLangConfig, cell_command, server_command
from sglfleet.pipeline.errors import TargetError, UsageError

REPO = Path(__file__).resolve().parents[2]
GRID = REPO / "src" / "sglfleet" / "validation" / "grids" / "sglang-smollm2.yaml"
SECTION = {"model_path": "/tmp/smollm2", "draft_model_path": "/tmp/smollm2-dflash"}


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_the_h200_grid_loads_and_every_command_is_rendered() -> None:
    cfg = load_sweep_config(str(GRID))
    s = cfg.sglang
    assert s is not None and cfg.kind == "sglang" and s.start == "all" and s.block_size == 8
    cells = cfg.expand()
    assert [(c.settings["budget"], c.settings["topk"]) for c in cells] == [
        (b, k) for b in (7, 16) for k in (4,)]
    base = server_command(s, s.port_base, None)
    argvs = [cell_command(s, c.settings, s.port_base + 1 + i, str(i)) for i, c in enumerate(cells)]
    assert base[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert not any(a.startswith("--speculative") for a in base) and "--disable-overlap-schedule" not in base
    ports = [_flag(a, "--port") for a in [base, *argvs]]
    nccl = [_flag(a, "--nccl-port") for a in [base, *argvs]]
    assert len(set(ports)) == len(set(nccl)) == 3 and not set(ports) & set(nccl)
    for c, a in zip(cells, argvs, strict=True):
        assert a[:5] == [sys.executable, "-m", "sglang.launch_server", "--model-path", "/tmp/smollm2"]
        assert (_flag(a, "--speculative-algorithm"), _flag(a, "--speculative-draft-model-path"),
                _flag(a, "--speculative-num-draft-tokens"), _flag(a, "--attention-backend")) == (
                    "DFLASH", "/tmp/smollm2-dflash", "8", "triton")
        assert _flag(a, "--speculative-ddtree-budget") == str(c.settings["budget"])
        assert _flag(a, "--speculative-ddtree-topk") == str(c.settings["topk"])
        assert "--disable-overlap-schedule" in a and _flag(a, "--host") == "127.0.0.1"
        assert (_flag(a, "--mem-fraction-static"), _flag(a, "--max-total-tokens")) == ("0.5", "30000")
        # the baseline is the same server without the speculative flags and their overlap switch
        valued = {"--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-draft-tokens",
                  "--speculative-ddtree-budget", "--speculative-ddtree-topk", "--port", "--nccl-port"}
        assert _without(a, valued, {"--disable-overlap-schedule"}) == _without(base, valued, set())


def _without(argv: list[str], valued: set[str], bare: set[str]) -> list[str]:
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in valued:
            skip = True
        elif x not in bare:
            out.append(x)
    return out


def test_section_defaults_and_per_cell_overrides() -> None:
    s = SGLangConfig(**SECTION)
    assert (s.block_size, s.attention_backend, s.python, s.port_base, s.cuda_graph, s.start) == (
        8, "triton", sys.executable, 30000, True, "all")
    assert s.mem_fraction_static is None and s.max_total_tokens is None
    plain = server_command(s, 30000, None)
    assert "--mem-fraction-static" not in plain and "--disable-decode-cuda-graph" not in plain
    a = cell_command(s, {"budget": 15, "topk": 2, "block_size": 5, "cuda_graph": False,
                         "attention_backend": "flashinfer"}, 30003, "x")
    assert (_flag(a, "--speculative-num-draft-tokens"), _flag(a, "--attention-backend")) == ("5", "flashinfer")
    assert "--disable-decode-cuda-graph" in a and "--disable-prefill-cuda-graph" in a
    chain = cell_command(s, {"block_size": 4}, 30004, "chain")  # DFLASH alone: no DDTree flags
    assert "--speculative-ddtree-budget" not in chain and _flag(chain, "--speculative-algorithm") == "DFLASH"


@pytest.mark.parametrize("settings,message", [
    ({"budget": 0, "topk": 2}, "cell b0: DDTree settings cannot start: --speculative-ddtree-budget must be in 1..255"),
    ({"budget": 8, "topk": 1}, "exceeds the largest tree a block of 8 holds with top-k 1"),
    ({"budget": "many", "topk": 2}, "--speculative-ddtree-budget must be an integer"),
    ({"topk": 4}, "--speculative-ddtree-topk without --speculative-ddtree-budget"),
    ({"budget": 16, "attention_backend": "fa3"}, "--attention-backend fa3 has no tree-mask target verify"),
    ({"budget": 16, "block_size": 1}, "invalid cell settings"),
    ({"budget": 16, "cuda_graph": "sometimes"}, "invalid cell settings"),
    ({"budget": 16, "page": 1}, "unknown setting(s) ['page']"),
])
def test_a_cell_the_ddtree_rules_refuse_is_one_clear_error(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as e:
        cell_command(SGLangConfig(**SECTION), settings, 30001, "b0")
    assert message in str(e.value)


def test_extra_args_cannot_break_the_ddtree_rules() -> None:
    s = SGLangConfig(**SECTION, extra_args=["--page-size", "16"])
    with pytest.raises(UsageError, match="--page-size must be 1"):
        cell_command(s, {"budget": 16}, 30001, "x")
    server_command(s, 30000, None)  # the baseline has no DDTree


@pytest.mark.parametrize("sweep,message", [
    ({"kind": "sglang", "axes": {"budget": [7]}}, "needs an `sglang` section"),
    ({"kind": "sglang", "sglang": SECTION}, "needs `axes`"),
    ({"kind": "sglang", "sglang": SECTION, "axes": {"draft_max": [2]}}, "unknown axis ['draft_max']"),
    ({"kind": "sglang", "sglang": SECTION, "axes": {"budget": [7]}, "port_base": 20000}, "sglang.port_base"),
    ({"kind": "sglang", "sglang": SECTION, "axes": {"budget": [7]}, "cells": [{"url": "http://x:1"}]},
     "`cells` is for the endpoints kind"),
    ({"kind": "embedded", "sglang": SECTION, "axes": {"draft_max": [2]}}, "not of embedded"),
    ({"kind": "sglang", "sglang": {**SECTION, "nccl_port_offset": 3}, "axes": {"budget": [7, 15, 16]}},
     "nccl_port_offset 3 must be >= 4"),
    ({"kind": "sglang", "sglang": {**SECTION, "port_base": 64990}, "axes": {"budget": [7]}}, "past 65535"),
    ({"kind": "sglang", "sglang": {**SECTION, "port_base": 31800}, "axes": {"budget": [7]}},
     "keep them below 32768"),
    ({"kind": "sglang", "sglang": {**SECTION, "extra_args": ["--port=1"]}, "axes": {"budget": [7]}},
     "['--port'] are rendered by the sweep"),
    ({"kind": "sglang", "sglang": {**SECTION, "mem_fraction_static": 1.5}, "axes": {"budget": [7]}},
     "mem_fraction_static"),
    ({"kind": "sglang", "sglang": {**SECTION, "start": "sometimes"}, "axes": {"budget": [7]}}, "sglang.start"),
    ({"kind": "sglang", "sglang": {**SECTION, "gpu": 0}, "axes": {"budget": [7]}}, "sglang.gpu: unknown key"),
    ({"kind": "sglang", "sglang": {"model_path": "/m"}, "axes": {"budget": [7]}}, "sglang.draft_model_path"),
])
def test_grid_errors_are_refused_at_load(tmp_path: Path, sweep: dict[str, Any], message: str) -> None:
    import yaml

    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"sweep": sweep}))
    with pytest.raises(UsageError) as e:
        load_sweep_config(str(grid))
    assert message in str(e.value), str(e.value)


def _free_port_block(n: int) -> int:
    for base in range(31700, 33000, 20):
        with socket.socket() as s0:
            if any(s0.connect_ex(("127.0.0.1", p)) == 0 for p in range(base, base + n)):
                continue
        return base
    raise RuntimeError("no free port block")


@pytest.mark.integration
@pytest.mark.parametrize("start", ["all", "one_at_a_time"])
def test_refused_cells_are_error_rows_and_the_rest_of_the_matrix_runs(tmp_path: Path, start: str) -> None:
    """budget 0 and budget 8 / top-k 1 are refused before anything starts; budget 7 / top-k 1 is
    started for real and fails to come up (no sglang in this venv): three error rows, each with its
    own reason, in sweep.json, junit.xml and sweep.html."""
    pytest.importorskip("sglang_ddtree")
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is importable here: the started cell would load a model")
    cfg = SweepConfig(kind="sglang", baseline_url="http://127.0.0.1:9",
                      sglang={**SECTION, "port_base": _free_port_block(8), "start": start, "startup_timeout_s": 60},
                      axes={"budget": [0, 7, 8], "topk": [1]})
    out = tmp_path / "sweep"
    summary = run_sweep(cfg, out)
    rows = {r["cell"]: r for r in summary["rows"]}
    assert list(rows) == ["budget=0,topk=1", "budget=7,topk=1", "budget=8,topk=1"]
    assert all(r["status"] == "error" and r["failed_checks"] == ["cell-error"] for r in rows.values())
    assert "--speculative-ddtree-budget must be in 1..255, got 0" in rows["budget=0,topk=1"]["error"]
    assert "exceeds the largest tree a block of 8 holds" in rows["budget=8,topk=1"]["error"]
    started = rows["budget=7,topk=1"]
    assert started["error"].startswith("cell budget=7,topk=1: exited with 1 before it was ready; log ")
    assert "No module named 'sglang'" in started["error"]  # the tail of its own log
    assert "--speculative-ddtree-budget 7" in started["command"]
    assert sorted(p.name for p in out.glob("cell-*/sglang-*.log")) == [f"sglang-{cfg.sglang.port_base + 2}.log"]
    assert summary["recommendation"] is None and summary["passed"] == 0
    assert json.loads((out / "sweep.json").read_text())["rows"][0]["cell"] == "budget=0,topk=1"
    junit = (out / "junit.xml").read_text()
    assert junit.count("<failure") == 3 and "must be in 1..255" in junit
    html = (out / "sweep.html").read_text()
    assert "NO CELL PASSED" in html and "budget=8,topk=1" in html


@pytest.mark.integration
def test_a_baseline_that_does_not_come_up_stops_the_sweep_with_its_log(tmp_path: Path) -> None:
    cfg = SweepConfig(kind="sglang", sglang={**SECTION, "port_base": _free_port_block(4), "startup_timeout_s": 60},
                      axes={"budget": [7]})
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is importable here")
    with pytest.raises(TargetError) as e:
        run_sweep(cfg, tmp_path / "sweep")
    assert str(e.value).startswith("baseline: exited with 1 before it was ready; log ")
    assert "No module named 'sglang'" in str(e.value)


def test_advice_names_what_to_serve() -> None:
    """The sweep's one-line advice: the passing cell; without one, no speculation when the correct cells
    lost only on speed (the H200 sweep of 2026-12-01: DDTree at 0.36-0.38x of a 135M target); else nothing."""
    from sglfleet.flow.sweep import advise

    def row(cell: str, status: str, failed: list[str], tok_s: float, speedup: float) -> dict[str, Any]:
        return {"cell": cell, "status": status, "failed_checks": failed, "tok_s": tok_s, "speedup": speedup}

    fast = row("budget=16,topk=4", "passed", [], 300.0, 1.4)
    assert advise([fast], fast).startswith("serve budget=16,topk=4")
    slow = [row("budget=7,topk=4", "failed", ["speed_vs_baseline@c1"], 203.4, 0.38),
            row("budget=16,topk=4", "failed", ["speed_vs_baseline@c1"], 210.2, 0.36),
            row("budget=31,topk=4", "failed", ["lossless_t0", "speed_vs_baseline@c1"], 250.0, 0.45)]
    got = advise(slow, None)
    assert got.startswith("serve without speculative decoding: 2 cell(s)") and "budget=16,topk=4" in got
    broken = [row("budget=16,topk=4", "failed", ["token_soup@T0", "speed_vs_baseline@c1"], 210.0, 0.36),
              {"cell": "budget=0", "status": "error", "failed_checks": ["cell-error"]}]
    assert advise(broken, None).startswith("no cell is safe to serve")
