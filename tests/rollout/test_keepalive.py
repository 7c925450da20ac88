"""SGLang's HTTP keep-alive outlives the router's idle upstream connections (the serve role's
serve_keep_alive_s), so the router never sends on a connection the server is closing: the upstream errors
bench/keepalive_race.py reproduces against a server that closes idle connections at 5 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import keepalive_race  # noqa: E402

# sglang-router 0.3.2 closed idle upstream connections 82-92 s after their last use (docs/results/
# keepalive-pool-probe-2026-12-07.json); the server must keep them open longer, with room
ROUTER_POOL_IDLE_MAX_S = 100


@pytest.mark.integration
def test_every_sglang_host_keeps_idle_connections_longer_than_the_router() -> None:
    proc = subprocess.run([sys.executable, "-m", "sglfleet.rollout", "render", "--hosts", "all", "--inventory",
                           str(ROOT / "src" / "sglfleet" / "ansible" / "inventories" / "example"), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    specs = {h: v for h, v in data.get("hosts", data).items() if isinstance(v, dict)}
    sglang = {h: v for h, v in specs.items() if v["engine"] == "sglang"}
    assert sglang, specs
    for host, spec in sglang.items():
        assert int(spec["env"]["SGLANG_TIMEOUT_KEEP_ALIVE"]) > ROUTER_POOL_IDLE_MAX_S, (host, spec["env"])
        assert any(k.startswith("NCCL_") for k in spec["env"]), (host, spec["env"])  # the group's NCCL env kept
    for host, spec in specs.items():  # llama.cpp reads no SGLANG_ variable: none rendered for it
        if spec["engine"] != "sglang":
            assert "SGLANG_TIMEOUT_KEEP_ALIVE" not in spec["env"], (host, spec["env"])


@pytest.mark.parametrize("argv", [
    ["--servers", "nginx", "--out", "x.json"],
    ["--servers", "uvicorn-5", "--lo", "5.1", "--hi", "5.0", "--out", "x.json"],
    ["--servers", "uvicorn-5", "--step", "0", "--out", "x.json"],
    ["--servers", "", "--out", "x.json"],
])
def test_the_race_bench_refuses_bad_input(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    out = tmp_path / "x.json"
    assert keepalive_race.main([*argv[:-1], str(out)]) == 2
    assert "error:" in capsys.readouterr().err and not out.exists()


def test_the_gap_grid_holds_both_ends() -> None:
    assert keepalive_race.grid(4.994, 5.010, 0.001)[0] == 4.994
    assert keepalive_race.grid(4.994, 5.010, 0.001)[-1] == 5.01
    assert len(keepalive_race.grid(4.994, 5.010, 0.001)) == 17
