"""bench/router_upstream_errors.py: sglang-router's `Failed to send` lines (its own coloured log format) placed in
the fleet load test's steps of a demo run directory."""

from __future__ import annotations

import json
from pathlib import Path

from bench.router_upstream_errors import main

# one line of sglang-router 0.3.2's log as the demo's router container writes it (ANSI colours included)
ERR = ("\x1b[2m2026-12-06 09:50:35\x1b[0m \x1b[31mERROR\x1b[0m \x1b[2msmg::routers::http::router\x1b[0m\x1b[2m:\x1b[0m "
       "\x1b[2m/home/runner/work/sglang/sglang/src/routers/http/router.rs\x1b[0m\x1b[2m:\x1b[0m\x1b[2m563:\x1b[0m "
       "Failed to send typed request worker_url=http://127.0.0.1:18302 route=/v1/chat/completions "
       "error=error sending request for url (http://127.0.0.1:18302/v1/chat/completions)")
WARN = ("\x1b[2m2026-12-06 09:50:13\x1b[0m \x1b[33m WARN\x1b[0m \x1b[2msmg::core\x1b[0m: Endpoint '/server_info' "
        "returned 404")
T0 = 1796550600.0  # 2026-12-06 09:50:00 UTC


def _run(tmp_path: Path, lines: list[str], windows: list[tuple[str, float, float]]) -> Path:
    run = tmp_path / "demo-x"
    (run / "inventory-data" / "router").mkdir(parents=True)
    (run / "inventory-data" / "router" / "router.log").write_text("\n".join(lines) + "\n")
    for i, (stage, start, stop) in enumerate(windows):
        d = run / "deploy-1" / "loadtest" / stage / "steps" / f"{i:02d}-users-{i + 1}"
        d.mkdir(parents=True)
        (d / "stats_reset.json").write_text(json.dumps({"at": T0 + start, "reason": "warmup"}))
        (d / "stop_at.json").write_text(json.dumps({"at": T0 + stop}))
    return run


def test_an_error_inside_a_step_is_placed_there_with_its_distance_to_the_steps_end(tmp_path: Path) -> None:
    run = _run(tmp_path, [WARN, ERR, ERR], [("fleet-pcie", 28.8, 31.8), ("fleet-pcie", 33.6, 36.6)])
    out = tmp_path / "r.json"
    assert main([str(run), "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert [e["step"] for e in d["errors"]] == ["fleet-pcie/01-users-2"] * 2
    assert d["errors"][0]["seconds_before_step_end"] == 0.6 and d["inside_a_step_before_its_end"] == 2
    assert d["errors"][0]["worker"] == "http://127.0.0.1:18302"


def test_an_error_at_a_steps_end_or_outside_every_step_is_not_counted_inside(tmp_path: Path) -> None:
    run = _run(tmp_path, [ERR], [("fleet-pcie", 30.0, 35.5)])  # stopped within the logged second
    out = tmp_path / "r.json"
    assert main([str(run), "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["errors"][0]["seconds_before_step_end"] < 0 and d["inside_a_step_before_its_end"] == 0
    run2 = _run(tmp_path / "b", [ERR], [("fleet-pcie", 0.0, 10.0)])
    assert main([str(run2), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["errors"][0]["step"] is None


def test_a_directory_without_router_log_or_steps_is_bad_input(tmp_path: Path) -> None:
    assert main([str(tmp_path), "--out", str(tmp_path / "r.json")]) == 2
    assert not (tmp_path / "r.json").exists()
