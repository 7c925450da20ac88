"""The canary rollout's fault matrix through the REAL path: `python -m sglfleet.flow deploy` (what `make deploy` runs)
over real SSH to the netns test hosts (both in group pcie here), the CPU serving image from the TLS registry,
sglang-router on the controller deployed by the router role (ansible/roles/router) from the inventory, a
constant client load through that router for the whole run, the real gate (lean config + a recorded lossless
baseline) and the real rollback playbook.

    the canary fails its gate        -> no other host changed, the canary restored, 0 failed client requests
    a later batch fails its smoke    -> that batch and the earlier ones rolled back (newest first, canary
                                        included), 0 failed client requests
    the router dies mid-rollout      -> a clear error naming the router, every changed host restored

The hosts share the state dir and weights cache of tests/rollout/test_rollout.py's fleet (fixed paths on a real
host), so each module starts from what the other left and records it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from sglfleet.rollout.router import RouterClient
from testbed import REPO_ROOT
from testbed.testbed import TEST_BASE_PORT as BASE_PORT
from testbed.testbed import TEST_HOSTS, registry_env, write_inventory
from testbed.testbed import run_cli as cli

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.slow]
GATE = "testbed/fixtures/gate-embedded-lean.yaml"
H1, H2 = TEST_HOSTS
PORT = {H1: BASE_PORT + 1, H2: BASE_PORT + 2}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report_of(stderr: str) -> dict:
    line = [ln for ln in stderr.splitlines() if "(report " in ln][-1]
    return json.loads(Path(line.rsplit("(report ", 1)[1].rstrip(")")).read_text())


@pytest.fixture(scope="module")
def canary(images, testhosts, tmp_path_factory, services):
    """Both hosts in pcie on rc1, a lossless baseline recorded from H1, the router role's router in front."""
    tmp = tmp_path_factory.mktemp("canary")
    data = testhosts.parent / "fleet-data"  # the fleet's state dir and weights cache, shared with test_rollout
    router = {"port": _port(), "prometheus_port": _port()}
    inv = write_inventory(tmp / "inventory", testhosts, base_port=BASE_PORT, data_dir=data, fabrics=["pcie", "pcie"],
                          startup_budget_s=120, router=router)
    r = cli("deploy", "--hosts", "all", "--inventory", str(inv), "--image", images["rc1"], "--no-gate")
    assert r.returncode == 0, r.stderr[-3000:]
    baseline = tmp / "baseline.json"
    rb = subprocess.run([sys.executable, "-m", "sglfleet.validation", "record-baseline", "--target",
                         f"http://127.0.0.1:{PORT[H1]}", "--config", GATE, "--out", str(baseline)],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert rb.returncode == 0, rb.stderr[-3000:]
    cfg = tmp / "deployment.yaml"
    cfg.write_text(yaml.safe_dump({"rollout": {"client_load_rate": 1.0, "loadtest": False, "drain_timeout_s": 30,
                                               "runs_dir": str(tmp / "runs")}}))
    up = subprocess.run([sys.executable, "-m", "sglfleet.rollout", "router", "--inventory", str(inv), "--config",
                         str(cfg),
                         "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    info = json.loads(up.stdout)["routers"]["controller"]
    yield {"inv": inv, "cfg": cfg, "baseline": baseline, "router": info, "images": images, "docker": services,
           "pidfile": data / "router" / "router.pid", "tmp": tmp}
    subprocess.run([sys.executable, "-m", "sglfleet.rollout", "router", "--inventory", str(inv), "--config", str(cfg),
                    "--stop"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def serving(c) -> dict[str, tuple[str, str, list[str]]]:
    """host -> (image, container id, args); each answers /health and generates."""
    out = {}
    for h in (H1, H2):
        ct = c["docker"].containers.get(f"rollout-test-{h}")
        assert ct.status == "running", (h, ct.status)
        assert httpx.get(f"http://127.0.0.1:{PORT[h]}/health", timeout=30).status_code == 200
        out[h] = (ct.attrs["Config"]["Image"], ct.id, list(ct.attrs["Args"]))
    return out


def both_in_router(c) -> None:
    rc = RouterClient(c["router"]["url"])
    try:
        assert sorted(w.url for w in rc.workers() if w.healthy) == sorted(
            f"http://127.0.0.1:{PORT[h]}" for h in (H1, H2)), rc.workers()
    finally:
        rc.close()


def deploy(c, *extra: str, inv: Path | None = None) -> subprocess.CompletedProcess:
    return cli("deploy", "--hosts", "pcie", "--inventory", str(inv or c["inv"]), "--image", c["images"]["rc2"],
               "--gate-config", GATE, "--baseline", str(c["baseline"]), "--config", str(c["cfg"]), *extra)


def failed_requests(rep: dict) -> dict[str, int]:
    return {t["stage"]: t["failed"] for t in rep["traffic"] if t["failed"]}


def test_canary_fails_its_gate_nothing_else_changes(canary, scrambled_model):
    before = serving(canary)
    r = deploy(canary, "-e", "weights_name=smollm2-scrambled", "-e", f"weights_source={scrambled_model}")
    assert r.returncode == 1, r.stderr[-3000:]
    rep = report_of(r.stderr)
    assert rep["result"] == "gate-failed" and rep["gate_failed_hosts"] == [H1], rep["failed_at"]
    assert rep["change_order"] == [H1] and rep["rolled_back_hosts"] == [H1]
    kinds = [(s["kind"], s["hosts"]) for s in rep["steps"]]
    assert kinds[:4] == [("preflight", [H1, H2]), ("drain", [H1]), ("deploy", [H1]), ("gate", [H1])], kinds
    assert not any(k in ("drain", "deploy") and hs == [H2] for k, hs in kinds)  # H2 never touched
    after = serving(canary)
    assert after[H2][1] == before[H2][1]  # the same container: not restarted
    assert {h: v[0] for h, v in after.items()} == {h: v[0] for h, v in before.items()}
    assert not any("smollm2-scrambled" in a for a in after[H1][2])  # good weights again
    assert sum(t["sent"] for t in rep["traffic"]) >= 20 and failed_requests(rep) == {}, rep["traffic"]
    assert [o["host"] for o in rep["out_of_router"]] == [H1]
    both_in_router(canary)
    gate = next(s for s in rep["steps"] if s["kind"] == "gate")
    assert gate["data"]["metrics"][H1]["engine"] == "llamacpp", gate["data"].get("metrics")
    prom = Path(rep["run_dir"]) / "rollout.prom"
    assert f'sglang_fleet_rollout_gate_pass{{gate="full",host="{H1}"}} 0.0' in prom.read_text()


def test_later_batch_fails_its_smoke_gate_rolls_back_newest_first(canary, scrambled_model, tmp_path):
    before = serving(canary)
    # H2 alone gets the corrupted checkpoint: the canary passes its full gate, H2 fails its smoke gate.
    inv = tmp_path / "inventory"
    subprocess.run(["cp", "-r", str(canary["inv"]), str(inv)], check=True)
    hv = yaml.safe_load((inv / "host_vars" / f"{H2}.yml").read_text())
    hv.update({"weights_name": "smollm2-scrambled", "weights_source": str(scrambled_model)})
    (inv / "host_vars" / f"{H2}.yml").write_text(yaml.safe_dump(hv))
    r = deploy(canary, inv=inv)
    assert r.returncode == 1, r.stderr[-3000:]
    rep = report_of(r.stderr)
    assert rep["result"] == "smoke-failed" and rep["gate_failed_hosts"] == [H2], rep["failed_at"]
    assert rep["change_order"] == [H1, H2] and rep["rolled_back_hosts"] == [H2, H1]
    kinds = [s["kind"] for s in rep["steps"]]
    assert kinds.index("gate") < kinds.index("add-back") < kinds.index("smoke-gate"), kinds
    rb = [s["hosts"] for s in rep["steps"] if s["kind"] == "rollback"]
    assert rb == [[H2], [H1]], rb
    after = serving(canary)
    assert {h: v[0] for h, v in after.items()} == {h: v[0] for h, v in before.items()}
    assert not any("smollm2-scrambled" in a for v in after.values() for a in v[2])
    assert sum(t["sent"] for t in rep["traffic"]) >= 30 and failed_requests(rep) == {}, rep["traffic"]
    assert {o["host"] for o in rep["out_of_router"]} == {H1, H2}
    both_in_router(canary)


def test_router_dies_mid_rollout_clear_error_hosts_restored(canary):
    before = serving(canary)
    proc = subprocess.Popen([sys.executable, "-m", "sglfleet.flow", "deploy", "--hosts", "pcie", "--inventory",
                             str(canary["inv"]), "--image", canary["images"]["rc2"], "--gate-config", GATE,
                             "--baseline", str(canary["baseline"]), "--config", str(canary["cfg"])],
                            stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env={**os.environ, **registry_env()})
    lines, killed = [], False
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            lines.append(line)
            if not killed and line.startswith(f"stage: gate pcie {H1}"):  # the canary changed, H2 not yet
                os.kill(json.loads(canary["pidfile"].read_text())["pid"], signal.SIGKILL)
                killed = True
        rc = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(lines)
    try:
        assert killed and rc == 1, err[-3000:]
        rep = report_of(err)
        assert rep["result"] == "router-failed", rep["result"]
        assert f"router {canary['router']['url']} did not answer" in rep["failed_at"], rep["failed_at"]
        assert rep["change_order"] == [H1] and rep["rolled_back_hosts"] == [H1]
        after = serving(canary)
        assert {h: v[0] for h, v in after.items()} == {h: v[0] for h, v in before.items()}
        assert after[H2][1] == before[H2][1]
        assert any(s["kind"] == "rollback-drain" and not s["ok"] and "router unreachable" in s["summary"]
                   for s in rep["steps"])
    finally:  # the router back for whatever runs next
        up = subprocess.run([sys.executable, "-m", "sglfleet.rollout", "router", "--inventory", str(canary["inv"]),
                             "--config", str(canary["cfg"])], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=300)
        assert up.returncode == 0, up.stderr[-2000:]
