"""Every command the sweep's sglang kind renders for validation/grids/sglang-smollm2.yaml (the
baseline and each cell) through sglang 0.5.23's own parser with the patch series applied, and its
own DFLASH/DDTree resolution (patch 0015): the harness of test_ddtree_args.py. A cell the sweep
refuses before starting is refused by sglang's startup with the same rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_ddtree_args import parse, patched_sglang  # noqa: F401 - the module-scoped fixture

from sglfleet.flow.sweep import load_sweep_config
from sglfleet.flow.sweep_sglang import cell_command, server_command
from sglfleet.pipeline.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
GRID = ROOT / "src" / "sglfleet" / "validation" / "grids" / "sglang-smollm2.yaml"


@pytest.mark.integration
def test_every_command_of_the_h200_grid_passes_sglangs_parser(patched_sglang: Path) -> None:  # noqa: F811
    cfg = load_sweep_config(str(GRID))
    s = cfg.sglang
    assert s is not None
    cells = cfg.expand()
    argvs = [server_command(s, s.port_base, None)] + [
        cell_command(s, c.settings, s.port_base + 1 + i, str(i)) for i, c in enumerate(cells)]
    assert all(a[1:3] == ["-m", "sglang.launch_server"] for a in argvs)
    results = parse(patched_sglang, [a[3:] for a in argvs])  # what launch_server hands prepare_server_args
    base = results[0]
    assert base["rc"] == 0, base["stderr"]
    assert base["ddtree"] is None and "resolved" not in base  # the baseline: no speculative decoding
    for cell, argv, res in zip(cells, argvs[1:], results[1:], strict=True):
        b, k = cell.settings["budget"], cell.settings["topk"]
        assert res["rc"] == 0, f"sglang rejects {' '.join(argv)}\n{res['stderr']}"
        assert res["ddtree"] == {"budget": b, "topk": k, "verify_width": b + 1}, (cell, res)
        assert res["resolved"] == {"verify_width": b + 1, "topk": k, "block": 8}, (cell, res)
        assert res["max_draft_width"] == max(8, b + 1), (cell, res)


@pytest.mark.integration
def test_a_cell_the_sweep_refuses_is_refused_by_sglangs_startup_too(patched_sglang: Path) -> None:  # noqa: F811
    s = load_sweep_config(str(GRID)).sglang
    assert s is not None
    cases = {(0, 2): "must be in 1..255", (8, 1): "exceeds the largest tree a block of 8 holds"}
    rendered = []
    for (b, k), message in cases.items():
        with pytest.raises(UsageError, match=message):
            cell_command(s, {"budget": b, "topk": k}, 30001, "bad")
        # the same cell rendered without the check (what a start would have run)
        argv = server_command(s, 30001, {"budget": b, "topk": k})
        rendered.append(argv[3:])
    for ((b, k), message), res in zip(cases.items(), parse(patched_sglang, rendered), strict=True):
        assert res["rc"] == 0, res["stderr"]
        assert message in res["resolved"].get("error", ""), ((b, k), res["resolved"])
