"""The registry client against a real registry (Debian docker-registry, distribution 2.8) that uses the
distribution token flow: a token server (testbed/tokenserver.py) checks the login and signs scoped
JWTs. Covers login, labels, the registry-side retag with digest check, evidence attached to the digest,
and the bad inputs: wrong password, no login, token server down."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from sglfleet.pipeline.errors import TargetError, UsageError
from sglfleet.pipeline.procs import free_port as _free_port
from sglfleet.rollout import registry as reglib
from testbed.tokenserver import TokenServer

pytestmark = [pytest.mark.docker, pytest.mark.integration]
USER, PASSWORD = "deployer", "tok3n-Pa55-do-not-print"


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory):
    if not Path("/usr/bin/docker-registry").exists():
        pytest.skip("needs docker-registry (make test prepares it as root)")
    d = tmp_path_factory.mktemp("tokenreg")
    ts = TokenServer(d, {USER: PASSWORD}).start()
    addr = f"127.0.0.1:{_free_port()}"
    cfg = d / "registry.yml"
    cfg.write_text(ts.registry_config(addr, d / "storage"))
    log = (d / "registry.log").open("w")
    proc = subprocess.Popen(["/usr/bin/docker-registry", "serve", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            try:
                if httpx.get(f"http://{addr}/v2/", timeout=1).status_code == 401:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail(f"token registry did not start: {(d / 'registry.log').read_text()[-1500:]}")
        yield {"addr": addr, "ts": ts}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        ts.stop()


def _client(addr: str, password: str | None = PASSWORD) -> reglib.Registry:
    creds = reglib.Credentials(USER, password) if password else None
    return reglib.Registry(addr, creds, reglib.Transport(tls=False, timeout_s=5))


def _push_tiny(reg: reglib.Registry, name: str, tag: str, labels: dict[str, str]) -> str:
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": labels},
                      "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    layer = b"not-a-real-layer"
    c, lyr = reg.put_blob(name, cfg), reg.put_blob(name, layer)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": reglib.OCI_MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **c},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **lyr}]}).encode()
    return reg.put_manifest(name, tag, manifest, reglib.OCI_MANIFEST)


def test_token_flow_login_labels_retag_and_evidence(token_registry, tmp_path):
    addr, ts = token_registry["addr"], token_registry["ts"]
    with _client(addr) as reg:
        reg.check()
        digest = _push_tiny(reg, "fleet/tiny", "rc1", {"org.fleet.target": "pcie"})
        ref = reglib.parse_image(f"{addr}/fleet/tiny:rc1")
        assert reg.labels(ref) == {"org.fleet.target": "pcie"}
        (tmp_path / "gate").mkdir()
        (tmp_path / "gate" / "report.json").write_text('{"verdict": "PASS"}')
        info = reglib.promote(reg, ref, "promoted", digest, {"gate": tmp_path / "gate"},
                              {"org.sglang-fleet.gate.verdict": "PASS"})
        assert info["promoted_digest"] == digest == reg.digest(ref.with_tag("promoted"))
        art = json.loads(reg.manifest(info["evidence_digest"], name="fleet/tiny")[0])
        assert art["subject"]["digest"] == digest
        raw = reg.manifest(f"sha256-{digest.split(':')[1]}", name="fleet/tiny")[0]
        assert info["evidence_digest"] in [e["digest"] for e in json.loads(raw)["manifests"]]
        assert "sha256:" + hashlib.sha256(reg.manifest(ref.with_tag("promoted"))[0]).hexdigest() == digest
    # the token server saw scoped requests (pull and push on the repository), never a password in them
    scopes = " ".join(r["scope"] for r in ts.requests)
    assert "repository:fleet/tiny:" in scopes and "push" in scopes and PASSWORD not in scopes


def test_credentials_from_docker_config_file(token_registry, tmp_path, monkeypatch):
    """No ROLLOUT_REGISTRY_* in the environment: the login comes from $DOCKER_CONFIG/config.json (what
    `docker login` writes), and is never in the Credentials' repr or str."""
    import base64

    addr = token_registry["addr"]
    (tmp_path / "config.json").write_text(json.dumps(
        {"auths": {addr: {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}))
    monkeypatch.delenv("ROLLOUT_REGISTRY_USER", raising=False)
    monkeypatch.delenv("ROLLOUT_REGISTRY_PASSWORD", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    creds = reglib.credentials(addr, required=True)
    assert creds is not None and creds.username == USER and "docker config" in creds.source
    assert PASSWORD not in repr(creds) + str(creds)
    with reglib.Registry(addr, creds, reglib.Transport(tls=False, timeout_s=5)) as reg:
        reg.check()
        assert reg.digest(reglib.parse_image(f"{addr}/fleet/tiny:rc1")) is not None
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "empty"))
    with pytest.raises(UsageError, match="registry credentials missing"):
        reglib.credentials(addr, required=True)


def test_token_flow_bad_inputs(token_registry):
    addr, ts = token_registry["addr"], token_registry["ts"]
    with pytest.raises(UsageError, match="refused the credentials of deployer") as e1:
        _client(addr, "wrong").check()
    assert "wrong" not in str(e1.value)
    with pytest.raises(UsageError, match="registry credentials missing"):
        _client(addr, None).check()
    # the token server goes away (last test of the module): one clear error naming it
    ts.stop()
    with pytest.raises(TargetError, match=r"token server .* unreachable"):
        _client(addr).check()

