"""The promotion flow (`python -m sglfleet.flow deploy`, what `make deploy` runs) through real SSH hosts (network
namespaces), a real Docker engine, a real registry with TLS (private CA) and htpasswd logins, the real
embedded model in the CPU serving image, the real validation gate and the real load test. The tests run in
file order and share one fleet of 2 hosts (H1 = rt1 in pcie, H2 = rt2 in nvlink): each starts from the state
the previous one left and checks that every host still serves the expected version.

GPU facts are RECORDED nvidia-smi outputs (no GPU here). All test hosts share this machine's Docker
engine, so each has its own container name and port (see docs/rollout.md)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import httpx
import pytest

from sglfleet.rollout import registry as reglib
from testbed import REPO_ROOT
from testbed.testbed import REGISTRY_CA, TEST_HOSTS, TEST_REGISTRY, registry_env, write_inventory
from testbed.testbed import TEST_BASE_PORT as BASE_PORT
from testbed.testbed import TEST_REPO as REPO
from testbed.testbed import run_cli as rollout
from testbed.testbed import testhosts_sh as hosts_sh

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.slow]
GATE = "testbed/fixtures/gate-embedded-lean.yaml"
LEAN = "tests/rollout/fixtures/deployment-lean.yaml"
REGISTRY_LOG = Path("/var/log/fleet-services/tlsregistry.log")
H1, H2 = TEST_HOSTS  # H1 in pcie, H2 in nvlink
PORT = {H1: BASE_PORT + 1, H2: BASE_PORT + 2}


def inventory(path: Path, testhosts: Path, **kw) -> Path:
    """The fleet's inventory, or a variant of it: every variant shares the fleet's state dir and
    weights cache (fixed paths on a real host), so what one records the others see."""
    data = testhosts.parent / "fleet-data"
    kw.setdefault("startup_budget_s", 120)
    return write_inventory(path, testhosts, base_port=BASE_PORT, data_dir=data, **kw)


@pytest.fixture(scope="module")
def fleet(images, testhosts, tmp_path_factory, services):
    inv = inventory(tmp_path_factory.mktemp("inv") / "inventory", testhosts, startup_budget_s=120)
    # Baseline: rc1 everywhere (gate skipped for the baseline only).
    r = rollout("deploy", "--hosts", "all", "--inventory", str(inv), "--image", images["rc1"], "--no-gate")
    assert r.returncode == 0, r.stderr[-3000:]
    return {"inv": inv, "docker": services, "images": images, "testhosts": testhosts}


def serving(fleet) -> dict[str, tuple[str, str]]:
    """host -> (image of its running container, container id); asserts it answers /health and generates."""
    out = {}
    for h in (H1, H2):
        c = fleet["docker"].containers.get(f"rollout-test-{h}")
        assert c.status == "running", (h, c.status)
        port = PORT[h]
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
            "model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
        assert r.json()["usage"]["completion_tokens"] > 0
        out[h] = (c.attrs["Config"]["Image"], c.id)
    return out


def registry_client() -> reglib.Registry:
    env = registry_env()
    reg = reglib.Registry(TEST_REGISTRY, reglib.Credentials(env["ROLLOUT_REGISTRY_USER"],
                                                            env["ROLLOUT_REGISTRY_PASSWORD"]),
                          reglib.Transport(tls=True, ca_bundle=str(REGISTRY_CA)))
    reg.check()
    return reg


def report_of(proc: subprocess.CompletedProcess) -> dict:
    line = [ln for ln in proc.stderr.splitlines() if "(report " in ln][-1]
    return json.loads(Path(line.rsplit("(report ", 1)[1].rstrip(")")).read_text())


def test_bad_input_changes_nothing(fleet, tmp_path):
    before = serving(fleet)
    inv, img = str(fleet["inv"]), fleet["images"]["rc2"]
    empty_docker_config = tmp_path / "docker-config"
    empty_docker_config.mkdir()
    no_creds = {"ROLLOUT_REGISTRY_USER": "", "ROLLOUT_REGISTRY_PASSWORD": "", "DOCKER_CONFIG": str(empty_docker_config)}
    cases = {
        "unknown HOST": (["--hosts", "nosuchhost", "--inventory", inv, "--image", img], "unknown HOST 'nosuchhost'",
                         None),
        "missing tag": (["--hosts", "all", "--inventory", inv, "--image", f"{REPO}"], "has no tag", None),
        "tag not in registry": (["--hosts", "all", "--inventory", inv, "--image", f"{REPO}:nope"],
                                "image tag not found", None),
        "registry down": (["--hosts", "all", "--inventory", inv, "--image", "127.0.0.1:5999/x:rc1"],
                          "registry 127.0.0.1:5999 unreachable", None),
        "credentials missing": (["--hosts", "all", "--inventory", inv, "--image", img], "registry credentials missing",
                                no_creds),
        "wrong password (401)": (["--hosts", "all", "--inventory", inv, "--image", img], "rejected the credentials",
                                 {"ROLLOUT_REGISTRY_PASSWORD": "wrong-password"}),
        "image built for the other fleet": (["--hosts", "all", "--inventory", inv, "--image",
                                             fleet["images"]["nvlink-only"]],
                                            f"does not fit the fleet, nothing was changed: {H1}: built for nvlink, "
                                            "the host group is pcie", None),
        "collections missing": (["--hosts", "all", "--inventory", inv, "--image", img],
                                "Ansible collections missing", {"ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "none")}),
    }
    bad_inv = tmp_path / "malformed"
    bad_inv.mkdir()
    (bad_inv / "hosts.yml").write_text("all:\n  children:\n    pcie:\n      hosts: [oops\n")
    cases["malformed inventory"] = (["--hosts", "all", "--inventory", str(bad_inv), "--image", img],
                                    "malformed inventory", None)
    nofleet = inventory(tmp_path / "nofleet", fleet["testhosts"], fabrics=["pcie", "none"])
    cases["host in no fleet group"] = (["--hosts", "all", "--inventory", str(nofleet), "--image", img],
                                       f"{H2} (in no fleet group)", None)
    no_ca = inventory(tmp_path / "no-ca", fleet["testhosts"], extra_all={"rollout_registry_ca_bundle": ""})
    cases["TLS error (CA not given)"] = (["--hosts", "all", "--inventory", str(no_ca), "--image", img],
                                         "TLS error (certificate verify failed", None)
    secret = registry_env()["ROLLOUT_REGISTRY_PASSWORD"]
    for name, (args, expect, env) in cases.items():
        r = rollout("deploy", *args, env=env, timeout=120)
        assert r.returncode == 2, (name, r.returncode, r.stderr[-800:])
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and expect in errors[0], (name, r.stderr[-800:])
        assert "Traceback" not in r.stderr and secret not in r.stderr + r.stdout
    assert serving(fleet) == before


def _foreign_listener() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen(8)
    threading.Thread(target=lambda: [s.accept()[0].close() for _ in range(1000)], daemon=True).start()
    return s, s.getsockname()[1]


def test_preflight_faults_change_nothing(fleet, tmp_path):
    """Wrong GPU model on one host, a busy port on another: preflight stops the rollout before any
    server is touched; every host keeps serving rc1 and the report names no changed host."""
    before = serving(fleet)
    img = fleet["images"]["rc2"]
    wrong = inventory(tmp_path / "wrong-gpu", fleet["testhosts"], gpu_override={H2: "wrong"})
    r = rollout("deploy", "--hosts", "all", "--inventory", str(wrong), "--image", img, "--no-gate")
    assert r.returncode == 1, r.stderr[-2000:]
    assert "H100" in r.stderr and "compute capability 10.3" in r.stderr and "RECORDED nvidia-smi" in r.stderr
    assert report_of(r)["changed_hosts"] == []
    assert serving(fleet) == before

    sock, port = _foreign_listener()
    try:
        busy = inventory(tmp_path / "busy", fleet["testhosts"])
        hv = busy / "host_vars" / f"{H2}.yml"
        hv.write_text(hv.read_text().replace(f"serve_container_name: rollout-test-{H2}",
                                             f"serve_container_name: rollout-test-{H2}-new")
                      .replace(f"serve_port: {PORT[H2]}", f"serve_port: {port}"))
        r = rollout("deploy", "--hosts", "all", "--inventory", str(busy), "--image", img, "--no-gate")
    finally:
        sock.close()
    assert r.returncode == 1, r.stderr[-2000:]
    assert f"port {port} is busy" in r.stderr
    assert report_of(r)["changed_hosts"] == []
    assert serving(fleet) == before


def _layer_digests(reg: reglib.Registry, ref: str) -> set[str]:
    raw = reg.manifest(reglib.parse_image(ref))
    assert raw is not None
    return {layer["digest"] for layer in json.loads(raw[0])["layers"]}


def test_deploy_gate_loadtest_promote_and_second_deploy_is_a_noop(fleet):
    """rc2: deploy -> gate both endpoints -> load test against the SLOs -> promote (a registry-side retag, no
    layer read by anyone during the run) with the gate and load-test reports attached to the digest."""
    img = fleet["images"]["rc2"]
    inv = fleet["inv"]
    reg = registry_client()
    layers = _layer_digests(reg, img)
    log_start = REGISTRY_LOG.stat().st_size
    r = rollout("deploy", "--hosts", "pcie,nvlink", "--inventory", str(inv), "--image", img, "--gate-config", GATE,
                "--config", LEAN)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = report_of(r)
    assert rep["result"] == "promoted" and sorted(rep["changed_hosts"]) == [H1, H2]
    names = [s["name"] for s in rep["stages"]]
    assert names == ["serve-args", "image-fit", "deploy", f"gate {H1}", f"gate {H2}", "loadtest", "promote"], names
    assert all(g["rc"] == 0 for g in rep["gate"].values()) and len(rep["gate"]) == 2
    assert rep["loadtest"]["ok"] and rep["loadtest"]["capacity"] >= 1
    promo = rep["promotion"]
    assert promo["promoted"] == f"{REPO}:promoted" and promo["promoted_digest"] == rep["digest"]
    assert reg.digest(reglib.parse_image(f"{REPO}:promoted")) == rep["digest"]
    # No layer went through anyone during the run (hosts already had rc1's layers; promotion is a retag).
    with REGISTRY_LOG.open("rb") as fh:
        fh.seek(log_start)
        during = fh.read().decode(errors="replace")
    pulled = [ln for ln in during.splitlines() if "GET" in ln and any(f"blobs/{d}" in ln for d in layers)]
    assert not pulled, pulled
    # Evidence: an OCI artifact whose subject is the promoted digest, listed under the referrers tag schema.
    idx = reg.manifest(f"sha256-{rep['digest'].split(':')[1]}", name="rollout-test-cpu")
    assert idx is not None
    entries = json.loads(idx[0])["manifests"]
    ev = next(e for e in entries if e["digest"] == promo["evidence_digest"])
    assert ev["annotations"]["org.sglang-fleet.gate.verdict"] == "PASS"
    assert ev["annotations"]["org.sglang-fleet.loadtest.capacity_users"] == str(rep["loadtest"]["capacity"])
    art = json.loads(reg.manifest(promo["evidence_digest"], name="rollout-test-cpu")[0])
    assert art["subject"]["digest"] == rep["digest"] and art["artifactType"].startswith("application/vnd.sglang")
    assert {h: v[0] for h, v in serving(fleet).items()} == {H1: img, H2: img}
    # One page links the stages' reports, and they exist.
    run_dir = Path(rep["run_dir"])
    page = (run_dir / "index.html").read_text()
    for link in (f"gate/{H1}/report.html", "loadtest/capacity.html"):
        assert link in page and (run_dir / link).is_file(), link
    secret = registry_env()["ROLLOUT_REGISTRY_PASSWORD"]
    assert secret not in r.stdout + r.stderr
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    # The 0600 credentials file the login task read is gone with the run.
    assert not [p for p in Path(tempfile.gettempdir()).glob("rollout-cred-*") if p.stat().st_uid == os.getuid()]

    # Recorded state: current rc2, previous rc1, on both hosts.
    st = rollout("status", "--hosts", "all", "--inventory", str(inv), "--json")
    assert st.returncode == 0, st.stderr[-2000:]
    status = json.loads(st.stdout)
    for h in (H1, H2):
        assert status[h]["current"] == img and status[h]["previous"] == fleet["images"]["rc1"]
        assert status[h]["healthy"] is True and status[h]["running_image"] == img

    # Same image again: no host changes, no container is recreated, nothing to promote.
    before = serving(fleet)
    r = rollout("deploy", "--hosts", "all", "--inventory", str(inv), "--image", img, "--gate-config", GATE,
                "--config", LEAN)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = report_of(r)
    assert rep["changed_hosts"] == [] and rep["result"] == "unchanged", rep
    assert "gate" not in rep
    assert "loadtest" not in rep
    assert all(v["outcome"] == "unchanged" for v in rep["deploy"]["hosts"].values())
    assert serving(fleet) == before

    # Check/diff mode (make deploy CHECK=1): names the hosts that would change, changes nothing.
    r = rollout("deploy", "--hosts", "all", "--inventory", str(inv), "--image", fleet["images"]["rc1"], "--check")
    assert r.returncode == 0, r.stderr[-3000:]
    rep = report_of(r)
    assert rep["result"] == "check" and sorted(rep["would_change"]) == [H1, H2] and rep["changed_hosts"] == [], rep
    assert serving(fleet) == before


def test_loadtest_misses_slo_rolls_back_nothing_promoted(fleet):
    """The gate passes, the load test misses the deployment's SLOs: no promotion, the host goes back."""
    before = serving(fleet)
    reg = registry_client()
    promoted_before = reg.digest(reglib.parse_image(f"{REPO}:promoted"))
    r = rollout("deploy", "--hosts", H1, "--inventory", str(fleet["inv"]), "--image", fleet["images"]["rc1"],
                "--gate-config", GATE, "--config", LEAN,
                "--loadtest-config", "tests/rollout/fixtures/loadtest-impossible-slo.yaml")
    assert r.returncode == 1, r.stderr[-3000:]
    rep = report_of(r)
    assert rep["result"] == "loadtest-failed", rep["result"]
    assert [s["name"] for s in rep["stages"]][-2:] == ["loadtest", "rollback"]
    assert rep["rolled_back_hosts"] == [H1] and "promotion" not in rep
    assert reg.digest(reglib.parse_image(f"{REPO}:promoted")) == promoted_before
    assert {h: v[0] for h, v in serving(fleet).items()} == {h: v[0] for h, v in before.items()}


def test_gate_fails_rolls_back_changed_hosts(fleet, scrambled_model):
    """rc1 with a corrupted checkpoint (token embedding rows shuffled): healthy (it loads and generates)
    but degenerate output; the gate rejects it and every changed host goes back to rc2 + good weights."""
    before = serving(fleet)
    r = rollout("deploy", "--hosts", "all", "--inventory", str(fleet["inv"]), "--image", fleet["images"]["rc1"],
                "--gate-config", GATE, "-e", "weights_name=smollm2-scrambled",
                "-e", f"weights_source={scrambled_model}")
    assert r.returncode == 1, r.stderr[-3000:]
    rep = report_of(r)
    assert rep["result"] == "gate-failed" and rep["gate_failed_hosts"] == [H1]
    assert sorted(rep["changed_hosts"]) == [H1, H2]
    assert sorted(rep["rolled_back_hosts"]) == [H1, H2]
    after = serving(fleet)
    assert {h: v[0] for h, v in after.items()} == {h: v[0] for h, v in before.items()}
    c = fleet["docker"].containers.get(f"rollout-test-{H1}")
    assert any("smollm2-135m-q4_1" in a for a in c.attrs["Args"]), c.attrs["Args"]


def test_crash_looping_container_fails_fast_with_its_error(fleet):
    """An image whose server exits at once (restart policy: it crash-loops): the health wait ends within
    seconds although the startup budget is 600 s, the error carries the container's own stderr, the host is
    restored and the rollout stops before the second host."""
    before = serving(fleet)
    r = rollout("deploy", "--hosts", "all", "--inventory", str(fleet["inv"]), "--image", fleet["images"]["crash"],
                "--no-gate", "-e", "serve_startup_budget_s=600", "-e", "serve_restore_budget_s=300")
    assert r.returncode == 1, r.stderr[-3000:]
    rep = report_of(r)
    assert rep["restored_hosts"] == [H1] and rep["changed_hosts"] == [H1]
    assert rep["deploy"]["hosts"][H2]["outcome"] == "unchanged"  # the rollout stopped before rt2
    failure = rep["deploy"]["hosts"][H1]["failure"]
    assert failure["reason"] == "container-exited", failure
    assert any("fatal: simulated CUDA init failure" in ln for ln in failure["log_tail"]), failure
    assert "simulated CUDA init failure" in r.stderr  # shown live, not only in the report
    waited = float(re.search(r"after ([0-9.]+)s, before /health", failure["msg"]).group(1))
    assert waited < 30, failure["msg"]
    assert {h: v[0] for h, v in serving(fleet).items()} == {h: v[0] for h, v in before.items()}


def test_host_unreachable_mid_rollout(fleet):
    """H2 drops off the network after H1 switched: H1 is rolled back, H2 never changed."""
    before = serving(fleet)
    proc = subprocess.Popen([sys.executable, "-m", "sglfleet.flow", "deploy", "--hosts", "all", "--inventory",
                             str(fleet["inv"]), "--image", fleet["images"]["rc1"], "--no-gate"],
                            stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env={**os.environ, **registry_env()})
    lines, cut = [], False
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if not cut and f"{H1}: Write current and previous image" in line:
            hosts_sh("cut", H2, str(fleet["testhosts"]))
            cut = True
    rc = proc.wait(timeout=900)
    err = "".join(lines)
    try:
        assert cut, err[-3000:]
        assert rc == 1, err[-3000:]
        rep = json.loads(Path(err.rsplit("(report ", 1)[1].split(")")[0]).read_text())
        assert rep["deploy"]["hosts"][H2]["outcome"] == "unreachable"
        assert rep["changed_hosts"] == [H1] and rep["rolled_back_hosts"] == [H1]
        assert {h: v[0] for h, v in serving(fleet).items()} == {h: v[0] for h, v in before.items()}
    finally:
        hosts_sh("start", str(len(TEST_HOSTS)), str(fleet["testhosts"]), check=False)


def test_air_gapped_tarball_deploy(fleet, tmp_path):
    """`make deploy IMAGE_TARBALL=...`: labels are read from the tarball (a wrong-fleet one is refused before
    anything changes), the tarball is copied to the host and loaded; no registry, so nothing is promoted."""
    client = fleet["docker"]
    wrong = tmp_path / "nvlink-only.tar"
    with wrong.open("wb") as fh:
        for chunk in client.images.get(fleet["images"]["nvlink-only"]).save(named=True):
            fh.write(chunk)
    before = serving(fleet)
    r = rollout("deploy", "--hosts", H1, "--inventory", str(fleet["inv"]), "--image", fleet["images"]["nvlink-only"],
                "--image-tarball", str(wrong), "--no-gate")
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{H1}: built for nvlink, the host group is pcie" in r.stderr
    assert serving(fleet) == before

    good = tmp_path / "rc1.tar"
    with good.open("wb") as fh:
        for chunk in client.images.get(fleet["images"]["rc1"]).save(named=True):
            fh.write(chunk)
    r = rollout("deploy", "--hosts", H1, "--inventory", str(fleet["inv"]), "--image", fleet["images"]["rc1"],
                "--image-tarball", str(good), "--no-gate")
    assert r.returncode == 0, r.stderr[-3000:]
    rep = report_of(r)
    assert rep["result"] == "deployed" and rep["changed_hosts"] == [H1] and rep["digest"] is None
    assert "Load the tarball into the engine" in r.stderr
    assert serving(fleet)[H1][0] == fleet["images"]["rc1"]
