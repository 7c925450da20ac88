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
    assert all(v == {"budget": 16, "topk": 8, "verify_width": 17, "overlap": True} for v in st.data.values())
    assert "b300-01: DDTree budget 16 top-k 8 (verify width 17, overlap scheduler)" in st.summary


def _inventory(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "src/sglfleet/ansible/inventories/example", inv)
    text = (inv / "group_vars" / "all.yml").read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    (inv / "group_vars" / "all.yml").write_text(text)
    return inv


@pytest.mark.integration
def test_the_overlap_setting_renders_the_flag_and_the_hosts_opt_in(tmp_path: Path) -> None:
    """serve_spec_ddtree_overlap (the example inventory opts in): the command leaves --disable-overlap-schedule
    out and the container env gets SGLANG_DDTREE_OVERLAP=1; false renders exactly what the role rendered before."""
    from sglfleet.rollout import deploy as ro

    on = ro.render(_cfg(ROOT / "src/sglfleet/ansible/inventories/example", tmp_path), "all", "r.example/x:1")
    off = ro.render(_cfg(_inventory(tmp_path, ("serve_spec_ddtree_overlap: true", "serve_spec_ddtree_overlap: false")),
                         tmp_path), "all", "r.example/x:1")
    assert set(on) == set(off) == {"b300-01", "b300-02", "pcie-01", "pcie-02"}
    for host in on:
        assert "--disable-overlap-schedule" not in on[host]["command"], host
        assert on[host]["env"]["SGLANG_DDTREE_OVERLAP"] == "1", host
        assert off[host]["command"].count("--disable-overlap-schedule") == 1, host
        assert [x for x in off[host]["command"] if x != "--disable-overlap-schedule"] == on[host]["command"], host
        assert off[host]["env"] == {k: v for k, v in on[host]["env"].items() if k != "SGLANG_DDTREE_OVERLAP"}, host


@pytest.mark.integration
@pytest.mark.parametrize("algorithm", ["DFLASH", "NONE"])
def test_the_overlap_opt_in_without_ddtree_is_bad_input(tmp_path: Path, algorithm: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    inv = _inventory(tmp_path, ("serve_spec_algorithm: DDTREE", f"serve_spec_algorithm: {algorithm}"))
    with pytest.raises(UsageError) as e:
        serve_args_stage(_cfg(inv, tmp_path), "nvlink", "r.example/x:1")
    assert "b300-0" in str(e.value) and "runs no DDTree" in str(e.value) and "serve_spec_ddtree_overlap" in str(e.value)
    if algorithm == "DFLASH":  # `make render` / python -m sglfleet.rollout render: exit 2, one line, nothing printed
        from sglfleet.rollout.__main__ import main

        assert main(["render", "--hosts", "nvlink", "--inventory", str(inv)]) == 2
        out, err = capsys.readouterr()
        errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
        assert len(errors) == 1 and "serve_spec_ddtree_overlap" in errors[0] and "{" not in out, err


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


@pytest.mark.integration
def test_preflight_refuses_the_overlap_opt_in_without_ddtree(tmp_path: Path) -> None:
    """The deploy playbook's own check (preflight, before any server is touched) for a run the controller's
    serve-args stage does not render: extra vars that turn DDTree off with the inventory's opt-in still on."""
    import json
    import subprocess

    import yaml

    from sglfleet.rollout import ANSIBLE_DIR
    from sglfleet.rollout.inventory import ansible_env

    tasks = yaml.safe_load((ANSIBLE_DIR / "roles" / "preflight" / "tasks" / "main.yml").read_text())
    check = [t for t in tasks if t["name"] == "Check the DDTree overlap opt-in"]
    assert len(check) == 1
    pb = tmp_path / "pf.yml"
    pb.write_text(yaml.safe_dump([{"name": "preflight check", "hosts": "pcie:nvlink", "gather_facts": False,
                                   "connection": "local", "tasks": check}]))

    def run(**extra: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ansible-playbook", "-i", str(ROOT / "src/sglfleet/ansible/inventories/example"),
                               str(pb), "--limit", "b300-01", "-e", json.dumps(extra)],
                              capture_output=True, text=True, env=ansible_env(), timeout=300)

    assert run().returncode == 0  # the example inventory: DDTree, opted in
    assert run(serve_spec_algorithm="NONE", serve_spec_ddtree_overlap=False).returncode == 0  # deploy-target-only
    for bad in ({"serve_spec_algorithm": "DFLASH"}, {"serve_spec_algorithm": "NONE"}, {"serve_engine": "embedded"}):
        p = run(**bad)
        assert p.returncode != 0 and "b300-01: serve_spec_ddtree_overlap is true but the host runs no DDTree" in \
            " ".join(p.stdout.split()), (bad, p.stdout[-2000:])


def test_speculative_hosts_need_a_lossless_baseline_or_a_waiver() -> None:
    from sglfleet.flow.promote import _speculative
    from sglfleet.validation.config import load_gate_config, lossless_requirement

    assert _speculative({"serve_engine": "sglang", "serve_spec_algorithm": "DDTREE"})
    assert not _speculative({"serve_engine": "embedded", "serve_spec_algorithm": "DDTREE"})
    assert not _speculative({"serve_engine": "sglang", "serve_spec_algorithm": "none"})
    why = lossless_requirement(load_gate_config(None), speculative=True)
    assert why and "baseline" in why
