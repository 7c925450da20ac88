"""The flow passes the endpoints' API key source to the gate and the load test (names only, never the key)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglfleet.flow.promote import loadtest_config, with_flow_api_key
from sglfleet.pipeline.errors import UsageError
from sglfleet.rollout.config import RolloutConfig
from sglfleet.validation.config import GateConfig, gate_api_key

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-flow-test-91d2e0"


def test_the_flow_key_reaches_the_gate_and_the_load_test(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLOW_TEST_KEY", SECRET)
    cfg = RolloutConfig(api_key_env="FLOW_TEST_KEY")
    gate = with_flow_api_key(cfg, GateConfig())
    assert gate.api_key_env == "FLOW_TEST_KEY" and gate_api_key(gate) == SECRET
    assert SECRET not in gate.model_dump_json()
    lt = loadtest_config(cfg, "http://127.0.0.1:30000")
    assert lt.api_key == SECRET and lt.api_key_env == "FLOW_TEST_KEY"
    key = tmp_path / "key"
    key.write_text(SECRET + "\n")
    lt = loadtest_config(RolloutConfig(api_key_file=str(key)), "http://127.0.0.1:30000")
    assert lt.api_key == SECRET
    assert with_flow_api_key(RolloutConfig(), GateConfig()).api_key_env is None


def test_a_missing_key_is_bad_input_before_anything_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOW_UNSET_KEY", raising=False)
    with pytest.raises(UsageError, match="FLOW_UNSET_KEY"):
        loadtest_config(RolloutConfig(api_key_env="FLOW_UNSET_KEY"), "http://127.0.0.1:30000")


def test_flow_cli_refuses_a_missing_key_file_with_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLOW_UNSET_KEY"}
    p = subprocess.run([sys.executable, "-m", "sglfleet.flow", "deploy", "--hosts", "pcie", "--image",
                        "127.0.0.1:1/x/y:1", "--api-key-file", str(tmp_path / "nope")], cwd=REPO,
                       capture_output=True, text=True, timeout=120, check=False, env=env)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("error: API key file not found")
