"""The staged rollout (flow/plan.py + flow/canary.py) against a REAL sglang-router in front of real HTTP
workers (testbed/routerworker.py), with a constant client load through the router the whole time. The deploy,
the gates and the rollback are stand-ins that restart the worker processes (the Ansible + gate path is
tests/rollout); what is real here is the order of the stages, the drain / add-back through the router's API,
the rollback of exactly what changed, and the client-side failure count. The fault matrix:
canary fails its gate; a later batch fails its smoke gate; the router dies mid-rollout."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from sglfleet.flow.canary import CheckResult, DeployResult, Executor, Hooks, RestoreResult
from sglfleet.flow.plan import build
from sglfleet.flow.traffic import ClientLoad
from sglfleet.rollout.inventory import Inventory
from sglfleet.rollout.router import RouterClient, RouterProcess
from testbed.routerworker import RouterWorker

pytestmark = [pytest.mark.integration]
HOSTS = ["h1", "h2", "h3"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fleet:
    """Three workers (one pcie group) behind a real router; `version` is what each one 'runs'."""

    def __init__(self, tmp: Path) -> None:
        self.workers = {h: RouterWorker(_port(), delay_s=0.4, name=h) for h in HOSTS}
        self.version = dict.fromkeys(HOSTS, "rc1")
        self.previous: dict[str, str] = {}
        self.router = RouterProcess(_port(), [w.url for w in self.workers.values()], prometheus_port=_port(),
                                    log=tmp / "router.log")
        self.inv = Inventory(tmp / "inv", {"pcie": set(HOSTS), "all": set(HOSTS)},
                             {h: {"serve_endpoint_host": "127.0.0.1", "serve_port": w.port,
                                  "rollout_router_url": self.router.url} for h, w in self.workers.items()})
        self.events: list[str] = []

    def start(self) -> Fleet:
        for w in self.workers.values():
            w.start()
        self.router.start()
        c = RouterClient(self.router.url)
        deadline = time.monotonic() + 60
        while len([w for w in c.workers() if w.healthy]) < len(HOSTS):
            assert time.monotonic() < deadline
            time.sleep(0.25)
        c.close()
        return self

    def stop(self) -> None:
        self.router.stop()
        for w in self.workers.values():
            w.stop()

    def _restart(self, h: str, version: str) -> None:
        w = self.workers[h]
        w.stop()
        w.start()
        self.previous[h], self.version[h] = self.version[h], version

    def hooks(self, *, bad_gate: set[str] = frozenset(), bad_smoke: set[str] = frozenset(),
              kill_router_after_deploy_of: str | None = None) -> Hooks:
        def deploy(batch):
            for h in batch:
                self.events.append(f"deploy {h}")
                self._restart(h, "rc2")
            if kill_router_after_deploy_of in batch:
                self.router.stop()
            return DeployResult(True, tuple(batch), (), (), f"switched {', '.join(batch)}")

        def gate(h, url):
            self.events.append(f"gate {h}")
            return CheckResult(h not in bad_gate, f"gate {h}")

        def smoke(h, url):
            self.events.append(f"smoke {h}")
            return CheckResult(h not in bad_smoke, f"smoke {h}")

        def loadtest(label, url):
            self.events.append(f"loadtest {label}")
            return CheckResult(True, f"load test {label}")

        def rollback(hosts, to):
            for h in hosts:
                self.events.append(f"rollback {h}")
                self._restart(h, self.previous[h])
            return RestoreResult(True, tuple(hosts), f"rolled back {', '.join(hosts)}")

        return Hooks(deploy, gate, smoke, loadtest, rollback, promote=lambda: CheckResult(True, "promoted"))


@pytest.fixture()
def fleet(tmp_path):
    pytest.importorskip("sglang_router")
    f = Fleet(tmp_path).start()
    yield f
    f.stop()


def _run(fleet: Fleet, **faults):
    plan = build(fleet.inv, HOSTS, "reg/x:rc2", serial=1, gate="lean", gate_alpha=0.01)
    with ClientLoad(fleet.router.url, rate_per_s=4) as load:
        time.sleep(0.5)
        rec = Executor(plan, fleet.hooks(**faults), load=load, drain_timeout_s=20, grace_s=1).run()
    return plan, rec


def _failed(rec) -> dict[str, int]:
    return {t["stage"]: t["failed"] for t in rec.traffic if t["failed"]}


def test_plan_orders_canary_then_batches_and_states_the_budget(fleet):
    plan = build(fleet.inv, HOSTS, "reg/x:rc2", serial=1, gate="lean", gate_alpha=0.01)
    assert plan.order() == HOSTS and plan.groups[0].canary == "h1" and plan.groups[0].batches == (("h2",), ("h3",))
    kinds = [s.kind for s in plan.steps]
    assert kinds[:7] == ["preflight", "drain", "deploy", "gate", "loadtest", "add-back", "drain"]
    assert kinds[-2:] == ["fleet-loadtest", "promote"] and kinds.count("smoke-gate") == 2
    text = plan.render()
    assert "canary h1" in text and "at most 1.00%" in text


def test_success_canary_first_no_failed_request(fleet):
    _, rec = _run(fleet)
    assert rec.ok and rec.result == "promoted", rec.failed_at
    assert fleet.events == ["deploy h1", "gate h1", "loadtest canary h1", "deploy h2", "smoke h2", "deploy h3",
                            "smoke h3", "loadtest fleet pcie"]
    assert fleet.version == dict.fromkeys(HOSTS, "rc2")
    assert _failed(rec) == {} and sum(t["sent"] for t in rec.traffic) > 10
    assert {o.host for o in rec.out_of_router} == set(HOSTS) and all(o.seconds > 0 for o in rec.out_of_router)


def test_canary_fails_gate_nothing_else_changes(fleet):
    _, rec = _run(fleet, bad_gate={"h1"})
    assert not rec.ok and rec.result == "gate-failed" and rec.rolled_back == ("h1",)
    assert fleet.events == ["deploy h1", "gate h1", "rollback h1"]
    assert fleet.version == dict.fromkeys(HOSTS, "rc1")
    assert _failed(rec) == {}
    assert len([w for w in RouterClient(fleet.router.url).workers() if w.healthy]) == 3  # canary back in


def test_later_batch_fails_smoke_rolls_back_newest_first(fleet):
    _, rec = _run(fleet, bad_smoke={"h3"})
    assert rec.result == "smoke-failed" and rec.rolled_back == ("h3", "h2", "h1")
    assert fleet.events[-3:] == ["rollback h3", "rollback h2", "rollback h1"]
    assert fleet.version == dict.fromkeys(HOSTS, "rc1")
    assert _failed(rec) == {}


def test_router_dies_mid_rollout_clear_error_hosts_restored(fleet):
    _, rec = _run(fleet, kill_router_after_deploy_of="h2")
    assert rec.result == "router-failed" and "did not answer" in rec.failed_at, rec.failed_at
    assert set(rec.rolled_back) == {"h1", "h2"} and fleet.version == dict.fromkeys(HOSTS, "rc1")
    assert any(s.kind == "rollback-drain" and not s.ok and "router unreachable" in s.summary for s in rec.steps)
