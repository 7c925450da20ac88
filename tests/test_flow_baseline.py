"""The production sequence's two deploys, before anything changes: a target-only deploy (no speculative
decoding, no gate, no promotion) and the speculative deploy that needs the lossless baseline recorded from it
(`make deploy BASELINE=...` -> `--baseline` -> the gate's lossless.baseline). Real inventory parsing and
config loading of the example fleet; no SSH, no registry."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from sglfleet.flow import __main__ as flow_cli
from sglfleet.flow import promote
from sglfleet.pipeline.errors import UsageError
from sglfleet.rollout.config import RolloutConfig

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "src" / "sglfleet" / "ansible" / "inventories" / "example"

pytestmark = pytest.mark.skipif(not (ROOT / ".cache" / "ansible-collections" / ".installed").is_file(),
                                reason="Ansible collections not installed (make setup)")


class _PastTheLosslessCheck(Exception):
    pass


@pytest.fixture
def stop_after_check(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The stage right after the lossless check raises: reaching it means the check let the deploy go on."""
    seen: list[Any] = []

    def stage(cfg: RolloutConfig, hosts: str, image: str) -> None:
        seen.append(cfg)
        raise _PastTheLosslessCheck

    monkeypatch.setattr(promote, "serve_args_stage", stage)
    return seen


def _cfg(tmp_path: Path, inventory: Path = EXAMPLE, **kw: Any) -> RolloutConfig:
    return RolloutConfig(inventory=str(inventory), runs_dir=str(tmp_path / "runs"), **kw)


def test_speculative_fleet_without_baseline_is_refused(tmp_path: Path, stop_after_check: list[Any]) -> None:
    with pytest.raises(UsageError, match=r"run speculative decoding.*no lossless baseline"):
        promote.deploy(_cfg(tmp_path), "pcie", "127.0.0.1:9/x:1", quiet=True)
    assert not stop_after_check


def test_a_recorded_baseline_lets_the_speculative_deploy_go_on(tmp_path: Path, stop_after_check: list[Any]) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text("{}")
    with pytest.raises(_PastTheLosslessCheck):
        promote.deploy(_cfg(tmp_path, gate_baseline=str(baseline)), "pcie", "127.0.0.1:9/x:1", quiet=True)


def test_a_missing_baseline_file_is_bad_input(tmp_path: Path, stop_after_check: list[Any]) -> None:
    with pytest.raises(UsageError, match="baseline not found"):
        promote.deploy(_cfg(tmp_path, gate_baseline=str(tmp_path / "nope.json")), "pcie", "127.0.0.1:9/x:1",
                       quiet=True)
    assert not stop_after_check


def test_extra_vars_that_turn_speculation_on_need_the_baseline_too(tmp_path: Path,
                                                                  stop_after_check: list[Any]) -> None:
    inv = tmp_path / "inv"
    shutil.copytree(EXAMPLE, inv)
    all_yml = inv / "group_vars" / "all.yml"
    all_yml.write_text(all_yml.read_text().replace("serve_spec_algorithm: DDTREE", "serve_spec_algorithm: NONE"))
    with pytest.raises(_PastTheLosslessCheck):  # a target-only fleet needs no baseline
        promote.deploy(_cfg(tmp_path, inv), "pcie", "127.0.0.1:9/x:1", quiet=True)
    with pytest.raises(UsageError, match="no lossless baseline"):  # ... until -e turns speculation back on
        promote.deploy(_cfg(tmp_path, inv), "pcie", "127.0.0.1:9/x:1", quiet=True,
                       extra_vars={"serve_spec_algorithm": "DDTREE"})


def test_target_only_cli_deploys_without_gate_and_speculation(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    got: dict[str, Any] = {}

    def deploy(cfg: RolloutConfig, hosts: str, image: str, **kw: Any) -> tuple[int, Path]:
        got.update(cfg=cfg, hosts=hosts, image=image, **kw)
        return 0, tmp_path

    monkeypatch.setattr(promote, "deploy", deploy)
    assert flow_cli.main(["deploy", "--hosts", "pcie-01", "--image", "r.example/x:1", "--target-only"]) == 0
    # the target alone: no speculation, and no DDTree overlap opt-in (bad input without DDTree)
    assert got["cfg"].gate is False and got["extra_vars"] == {"serve_spec_algorithm": "NONE",
                                                             "serve_spec_ddtree_overlap": False}
    assert not promote._speculative({**{"serve_engine": "sglang", "serve_spec_algorithm": "DDTREE"},
                                     **got["extra_vars"]})


def test_target_only_with_a_baseline_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    rc = flow_cli.main(["deploy", "--hosts", "pcie-01", "--image", "r.example/x:1", "--target-only",
                        "--baseline", "b.json"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("error: --target-only")


def test_baseline_flag_reaches_the_rollout_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got: dict[str, Any] = {}

    def deploy(cfg: RolloutConfig, hosts: str, image: str, **kw: Any) -> tuple[int, Path]:
        got["cfg"] = cfg
        return 0, tmp_path

    monkeypatch.setattr(promote, "deploy", deploy)
    assert flow_cli.main(["deploy", "--hosts", "pcie", "--image", "r.example/x:1", "--baseline", "b.json"]) == 0
    assert got["cfg"].gate_baseline == "b.json" and got["cfg"].gate is True
