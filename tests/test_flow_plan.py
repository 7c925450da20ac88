"""`make deploy CHECK=1` as a plan a reviewer can read offline: it prints the hosts, the canary, the batches,
every stage and the false-fail budget, changes nothing, and with the registry unreachable still prints the
plan with what it could not verify (exit 0); bad plan input is exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sglfleet.flow.plan import build
from sglfleet.pipeline.errors import UsageError
from sglfleet.rollout.inventory import Inventory
from testbed import REPO_ROOT


def _inv(**hv) -> Inventory:
    hosts = ["p1", "p2", "p3", "n1"]
    return Inventory(Path("inv"), {"pcie": {"p1", "p2", "p3"}, "nvlink": {"n1"}, "all": set(hosts)},
                     {h: {"serve_port": 30000 + i, **hv.get(h, {})} for i, h in enumerate(hosts)})


def test_plan_canary_batches_budget() -> None:
    p = build(_inv(p2={"rollout_canary": True}), ["p1", "p2", "p3", "n1"], "r/x:1", serial=2, gate="g.yaml",
              gate_alpha=0.01)
    assert [g.canary for g in p.groups] == ["p2", "n1"] and p.groups[0].batches == (("p1", "p3"),)
    assert p.order() == ["p2", "p1", "p3", "n1"]
    assert p.budget.canaries == 2 and p.budget.smoke_hosts == 2 and p.budget.total == pytest.approx(0.02)
    text = p.render()
    assert "canary p2 (named in the inventory)" in text and "at most 2.00%" in text and "smoke-gate" in text


def test_plan_bad_input() -> None:
    with pytest.raises(UsageError, match="more than one host has rollout_canary"):
        build(_inv(p1={"rollout_canary": True}, p2={"rollout_canary": True}), ["p1", "p2"], "r/x:1")
    with pytest.raises(UsageError, match="different routers"):
        build(_inv(p1={"rollout_router_url": "http://a:1"}, p2={"rollout_router_url": "http://b:1"}),
              ["p1", "p2"], "r/x:1")


def test_check_prints_the_plan_with_the_registry_down(tmp_path) -> None:
    from sglfleet.rollout import collections

    if collections.missing():
        pytest.skip("needs the Ansible collections (make setup installs them)")
    r = subprocess.run([sys.executable, "-m", "sglfleet.flow", "deploy", "--hosts", "pcie", "--check",
                        "--image", "127.0.0.1:9/sglang-fleet:rc7"], capture_output=True, text=True, cwd=REPO_ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "plan: 127.0.0.1:9/sglang-fleet:rc7 to 2 host(s), order pcie-01 -> pcie-02" in r.stderr
    assert "canary pcie-01" in r.stderr and "NOT VERIFIED: registry 127.0.0.1:9" in r.stderr


def test_smoke_gate_config_reduces_suite_and_baseline_under_their_names(tmp_path) -> None:
    """The smoke gate's suite keeps the suite's file name (a baseline names it) and its baseline only the smoke
    prompts (lossless_t0 compares every prompt a baseline holds): the gate accepts both, nothing else runs."""
    import json

    from sglfleet.flow.plan import SMOKE_PROMPTS, smoke_gate_config
    from sglfleet.validation.config import load_gate_config
    from sglfleet.validation.gate import Gate
    from sglfleet.validation.suite import load_suite

    cfg = load_gate_config(REPO_ROOT / "testbed/fixtures/gate-embedded-lean.yaml")
    ids = [p.id for p in load_suite(cfg.suite).prompts]
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps({"model": "m", "suite": Path(str(cfg.suite)).name, "max_tokens": cfg.max_tokens,
                                "answers": dict.fromkeys(ids, "a"), "logprobs": {i: [] for i in ids},
                                "samples": [{"prompt": ids[0]}]}))
    cfg = cfg.model_copy(update={"lossless": cfg.lossless.model_copy(update={"baseline": str(base)})})
    smoke = smoke_gate_config(cfg, tmp_path / "smoke")
    assert Path(smoke.suite).name == Path(str(cfg.suite)).name and smoke.temperatures == [0.0]
    doc = json.loads(Path(smoke.lossless.baseline).read_text())
    assert sorted(doc["answers"]) == sorted(SMOKE_PROMPTS) == sorted(doc["logprobs"]) and doc["samples"] == []
    assert not smoke.determinism.enabled and not smoke.variation.enabled
    g = Gate("http://127.0.0.1:9", smoke)  # its own checks of the config pass (no request is sent)
    assert sorted(p.id for p in g.suite.prompts) == sorted(SMOKE_PROMPTS)


@pytest.mark.parametrize(("profile", "alpha"), [("sglang-ddtree.yaml", 0.001), ("embedded.yaml", 0.01)])
def test_the_plans_budget_is_the_gate_profiles_own_alpha_per_canary(profile: str, alpha: float) -> None:
    """flow/promote.make_plan reads the gate config's likelihood.alpha: the production profile ships 0.001, so a
    rollout over both fleet groups (two canaries fully gated, the rest smoke-gated) risks at most 0.2 %."""
    from sglfleet.flow.promote import make_plan
    from sglfleet.rollout.config import RolloutConfig
    from sglfleet.validation.config import load_gate_config

    gc = load_gate_config(REPO_ROOT / "src" / "sglfleet" / "validation" / "profiles" / profile)
    p = make_plan(RolloutConfig(), _inv(), ["p1", "p2", "p3", "n1"], "r/x:1", gc)
    assert p.budget.canaries == 2 and p.budget.total == pytest.approx(2 * alpha)
    assert f"at most {2 * alpha:.2%}" in p.render()
