"""The flow's load-test stage and its verdict rule, in process, against the simulated streaming server
(testbed/simserver.py): promotion needs `min_capacity` users meeting the deployment's SLOs."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sglfleet.flow.promote import loadtest_config, loadtest_stage
from sglfleet.rollout.config import RolloutConfig
from testbed.simserver import SimServer

pytestmark = [pytest.mark.integration]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sim():
    with SimServer(_port(), "--ttft-ms", "20", "--itl-ms", "5", "--tokens", "8") as srv:
        yield srv.url


def test_loadtest_stage_meets_slos(sim, tmp_path: Path) -> None:
    cfg = RolloutConfig(loadtest_max_load=2)
    st = loadtest_stage(loadtest_config(cfg, sim), tmp_path / "lt", min_capacity=2, quiet=True)
    assert st.ok, st.summary
    assert st.data["capacity"] == 2 and st.data["ttft_p95_ms_at_capacity"] is not None
    assert (tmp_path / "lt" / "capacity.html").is_file()


def test_loadtest_stage_misses_slos_fails(sim, tmp_path: Path) -> None:
    slo = tmp_path / "slo.yaml"
    slo.write_text("loadtest:\n  slo:\n    ttft_p95_ms: 1\n")  # 20 ms TTFT can never meet 1 ms
    cfg = RolloutConfig(loadtest_max_load=2, loadtest_config=str(slo))
    st = loadtest_stage(loadtest_config(cfg, sim), tmp_path / "lt", min_capacity=1, quiet=True)
    assert not st.ok and st.data["capacity"] is None, st.summary
    assert "misses the required 1" in st.summary


def test_loadtest_stage_unreachable_target_fails(tmp_path: Path) -> None:
    cfg = RolloutConfig(loadtest_max_load=1)
    st = loadtest_stage(loadtest_config(cfg, f"http://127.0.0.1:{_port()}"), tmp_path / "lt", 1, quiet=True)
    assert not st.ok and "could not complete" in st.summary
