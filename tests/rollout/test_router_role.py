"""The router role (ansible/roles/router) through the real playbook (`python -m sglfleet.rollout router`): the
controller
as the inventory's sglang_router host (local connection, a pidfile-managed daemon), the workers taken from the
fleet group's hosts, in front of real HTTP workers (testbed/routerworker.py). No root, no Docker, no SSH: the
play only targets the router host."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from sglfleet.rollout.inventory import load_inventory
from sglfleet.rollout.router import RouterClient
from testbed import REPO_ROOT
from testbed.routerworker import RouterWorker
from testbed.testbed import router_vars

pytestmark = [pytest.mark.integration]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inventory(path: Path, workers: dict[str, RouterWorker], router: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    hosts = {"all": {"children": {
        "pcie": {"hosts": {h: {"ansible_host": "127.0.0.1", "serve_port": w.port} for h, w in workers.items()}},
        "sglang_router": {"hosts": {"controller": router}}}}}
    (path / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return path


def _cli(inv: Path, *args: str) -> subprocess.CompletedProcess:
    cfg = inv.parent / "deployment.yaml"
    cfg.write_text(yaml.safe_dump({"rollout": {"runs_dir": str(inv.parent / "runs")}}))
    return subprocess.run([sys.executable, "-m", "sglfleet.rollout", "router", "--inventory", str(inv), "--config",
                           str(cfg),
                           "--json", *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)


@pytest.fixture()
def workers():
    pytest.importorskip("sglang_router")
    ws = {"w1": RouterWorker(_port(), delay_s=0.2, name="w1"), "w2": RouterWorker(_port(), delay_s=0.2, name="w2")}
    for w in ws.values():
        w.start()
    yield ws
    for w in ws.values():
        w.stop()


def test_role_deploys_the_router_from_the_inventory_idempotent_then_stops_it(workers, tmp_path):
    port, prom = _port(), _port()
    rv = router_vars(tmp_path / "data", port=port, prometheus_port=prom)
    inv = _inventory(tmp_path / "inv", workers, rv)
    r = _cli(inv)
    try:
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout)["routers"]["controller"]
        assert out["url"] == f"http://127.0.0.1:{port}" and out["changed"] is True and out["version"] == "0.3.2"
        assert sorted(out["workers"]) == sorted(w.url for w in workers.values())
        c = RouterClient(out["url"])
        assert sorted(w.url for w in c.workers() if w.healthy) == sorted(w.url for w in workers.values())
        chat = httpx.post(out["url"] + "/v1/chat/completions", timeout=30,
                          json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200, chat.text
        assert httpx.get(out["metrics_url"], timeout=10).status_code == 200
        # The plan reads the same router from the inventory (url and metrics), and `all` leaves its host out.
        from sglfleet.flow.plan import build

        parsed = load_inventory(inv)
        assert parsed.resolve("all") == ["w1", "w2"]
        gp = build(parsed, ["w1", "w2"], "r/x:1").groups[0]
        assert (gp.router, gp.router_metrics) == (out["url"], out["metrics_url"])

        # Second run: same command line, the same process keeps running.
        again = _cli(inv)
        assert again.returncode == 0, again.stderr[-3000:]
        assert json.loads(again.stdout)["routers"]["controller"] == {**out, "changed": False}

        # A changed setting (the policy) restarts it with the new command line.
        _inventory(inv, workers, {**rv, "router_policy": "random"})
        changed = _cli(inv)
        assert changed.returncode == 0, changed.stderr[-3000:]
        new = json.loads(changed.stdout)["routers"]["controller"]
        assert new["changed"] is True and new["pid"] != out["pid"]
        cfg = json.loads((tmp_path / "data" / "router" / "router.json").read_text())
        assert cfg["policy"] == "random" and "random" in cfg["command"]

        # A router that died (killed; nothing reaps it here, it may linger as a zombie) is started again.
        os.kill(new["pid"], signal.SIGKILL)
        time.sleep(0.5)
        back = _cli(inv)
        assert back.returncode == 0, back.stderr[-3000:]
        assert json.loads(back.stdout)["routers"]["controller"]["pid"] not in (new["pid"], None)
    finally:
        stop = _cli(inv, "--stop")
    assert stop.returncode == 0, stop.stderr[-3000:]
    assert not RouterClient(f"http://127.0.0.1:{port}", timeout_s=2).alive()
    assert not (tmp_path / "data" / "router" / "router.pid").exists()


def test_role_refuses_a_group_without_hosts_and_reports_a_router_that_dies_at_start(workers, tmp_path):
    rv = router_vars(tmp_path / "data", port=_port(), prometheus_port=_port())
    inv = _inventory(tmp_path / "inv", workers, {**rv, "router_fleet_group": "nvlink"})
    r = _cli(inv)
    assert r.returncode == 1 and "router_fleet_group (nvlink) a group of the inventory" in r.stderr, r.stderr[-2000:]
    # The port is taken: the router exits at once and the role fails with its own last log lines.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        inv = _inventory(tmp_path / "inv2", workers, {**rv, "router_port": busy})
        r = _cli(inv)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "exited with code" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "data" / "router" / "router.pid").exists()
