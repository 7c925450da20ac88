"""The flow's serve-args stage: every target host's rendered command passes the DDTree rules
before anything changes (real Ansible render of the example inventory, no SSH)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sglfleet.flow.promote import serve_args_stage
from sglfleet.pipeline.errors import UsageError
from sglfleet.rollout.config import RolloutConfig

ROOT = Path(__file__).resolve().parents[1]


def _cfg(inv: Path, tmp_path: Path) -> RolloutConfig:
    return RolloutConfig(inventory=str(inv), runs_dir=str(tmp_path / "runs"))


@pytest.mark.integration
def test_example_fleet_renders_startable_ddtree_commands(tmp_path: Path) -> None:
    st = serve_args_stage(_cfg(ROOT / "src/sglfleet/ansible/inventories/example", tmp_path), "all", "r.example/x:1")
    assert st.ok and set(st.data) == {"b300-01", "b300-02", "pcie-01", "pcie-02"}
    assert all(v == {"budget": 16, "topk": 4, "verify_width": 17} for v in st.data.values())


@pytest.mark.integration
@pytest.mark.parametrize("edit,message", [
    ("serve_spec_ddtree_budget: 16", "serve_spec_ddtree_budget: 300"),
    ("serve_attention_backend: triton", "serve_attention_backend: trtllm_mha"),
])
def test_bad_ddtree_settings_are_refused_before_any_change(tmp_path: Path, edit: str, message: str) -> None:
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "src/sglfleet/ansible/inventories/example", inv)
    for f in (inv / "group_vars").glob("*.yml"):
        f.write_text(f.read_text().replace(edit, message))
    with pytest.raises(UsageError) as e:
        serve_args_stage(_cfg(inv, tmp_path), "nvlink", "r.example/x:1")
    assert "b300-0" in str(e.value) and "DDTree settings cannot start" in str(e.value)


def test_speculative_hosts_need_a_lossless_baseline_or_a_waiver() -> None:
    from sglfleet.flow.promote import _speculative
    from sglfleet.validation.config import load_gate_config, lossless_requirement

    assert _speculative({"serve_engine": "sglang", "serve_spec_algorithm": "DDTREE"})
    assert not _speculative({"serve_engine": "embedded", "serve_spec_algorithm": "DDTREE"})
    assert not _speculative({"serve_engine": "sglang", "serve_spec_algorithm": "none"})
    why = lossless_requirement(load_gate_config(None), speculative=True)
    assert why and "baseline" in why
