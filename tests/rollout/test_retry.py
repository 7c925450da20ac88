"""Retries of transient failures (rollout/retry.py) against a REAL local HTTP server that answers like a
registry and fails the first N requests (503, 429, or a dropped connection): the registry client retries with
back-off, records every retry, and gives up with its usual error; a 4xx is never retried. The preflight's
SSH retry: only when hosts were unreachable and none failed a check."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sglfleet.pipeline.errors import TargetError, UsageError
from sglfleet.rollout import deploy as ro
from sglfleet.rollout import retry
from sglfleet.rollout.registry import ImageRef, Registry, Transport
from sglfleet.rollout.runner import HostResult

pytestmark = [pytest.mark.integration]  # local HTTP peers
MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"digest": "sha256:" + "0" * 64, "size": 2}, "layers": []}).encode()
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()
FAST = retry.Policy(attempts=4, wait_s=0.01, max_wait_s=0.05)


class FlakyRegistry:
    """/v2/ and one manifest (x:rc1); the first `fail` requests get `how` (503, 429 or 'drop')."""

    def __init__(self, fail: int, how: int | str = 503) -> None:
        self.fail, self.how, self.seen = fail, how, []
        owner = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _answer(self, head: bool) -> None:
                owner.seen.append(f"{self.command} {self.path}")
                if len(owner.seen) <= owner.fail:
                    if owner.how == "drop":
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self.send_response(int(owner.how))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path == "/v2/":
                    body, ctype = b"{}", "application/json"
                elif self.path == "/v2/x/manifests/rc1":
                    body, ctype = MANIFEST, "application/vnd.oci.image.manifest.v1+json"
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Docker-Content-Digest", DIGEST if "manifests" in self.path else "")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(False)

            def do_HEAD(self) -> None:
                self._answer(True)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.host = f"127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture()
def flaky(request):
    srv = FlakyRegistry(*request.param)
    yield srv
    srv.close()


def _registry(host: str, log: retry.RetryLog) -> Registry:
    return Registry(host, None, Transport(tls=False, timeout_s=5), retry_policy=FAST, retry_log=log)


@pytest.mark.parametrize("flaky", [(2, 503), (3, 429), (2, "drop")], indirect=True)
def test_registry_calls_retry_transient_failures_and_record_each(flaky):
    log = retry.RetryLog()
    with _registry(flaky.host, log) as reg:
        reg.check()
        assert reg.digest(ImageRef(flaky.host, "x", "rc1")) == DIGEST
    assert len(log) == flaky.fail, log.entries
    assert [e["attempt"] for e in log.entries] == list(range(1, flaky.fail + 1))
    assert all(e["what"] == "registry" and e["wait_s"] > 0 for e in log.entries)
    want = "HTTP 503" if flaky.how == 503 else "HTTP 429" if flaky.how == 429 else "ConnectionError"
    assert want in log.entries[0]["reason"], log.entries[0]
    assert log.entries[0]["call"] == f"GET {flaky.host}/v2/"


@pytest.mark.parametrize("flaky", [(100, 503)], indirect=True)
def test_registry_gives_up_after_the_attempts_with_its_usual_error(flaky):
    log = retry.RetryLog()
    with pytest.raises(TargetError, match="answered HTTP 503 on /v2/"):
        _registry(flaky.host, log).check()
    assert len(flaky.seen) == FAST.attempts and len(log) == FAST.attempts - 1


@pytest.mark.parametrize("flaky", [(0, 503)], indirect=True)
def test_a_4xx_is_never_retried(flaky):
    log = retry.RetryLog()
    with _registry(flaky.host, log) as reg:
        reg.check()
        with pytest.raises(UsageError, match="image tag not found"):
            reg.require(ImageRef(flaky.host, "x", "nope"))
    assert len(log) == 0 and flaky.seen[-1] == "GET /v2/x/manifests/nope"
    assert sum(1 for s in flaky.seen if s.endswith("/nope")) == 1


def test_registry_down_is_retried_then_unreachable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    log = retry.RetryLog()
    with pytest.raises(TargetError, match="unreachable"):
        _registry(f"127.0.0.1:{port}", log).check()
    assert len(log) == FAST.attempts - 1 and "ConnectionError" in log.entries[0]["reason"]


# ---------------------------------------------------------------------------------------- the SSH preflight
def _outcome(rc: int, **hosts: HostResult) -> ro.DeployOutcome:
    return ro.DeployOutcome(rc, "failed" if rc else "successful", 1.0, dict(hosts))


def test_preflight_retries_unreachable_hosts_only(monkeypatch, tmp_path: Path):
    seq = [_outcome(4, h1=HostResult("h1", unreachable=True, messages=["ssh: connect timed out"]),
                    h2=HostResult("h2")),
           _outcome(4, h1=HostResult("h1", unreachable=True), h2=HostResult("h2")),
           _outcome(0, h1=HostResult("h1"), h2=HostResult("h2"))]
    labels: list[str] = []

    def fake_apply(cfg, inv, hosts, image, run_dir, **kw):
        labels.append(kw["label"])
        assert kw["tags"] == "preflight,image,weights"  # play 1 only: nothing on a server changes
        return seq[len(labels) - 1]

    monkeypatch.setattr(ro, "apply", fake_apply)
    log = retry.RetryLog()
    out = ro.preflight(None, None, ["h1", "h2"], "r/x:1", tmp_path, policy=FAST, log=log, sleep=lambda s: None)
    assert out.rc == 0 and labels == ["preflight", "preflight-2", "preflight-3"]
    assert [e["what"] for e in log.entries] == ["ssh", "ssh"] and "unreachable h1" in log.entries[0]["reason"]

    # A host that FAILED a check (rc 2) is a verdict: no retry, whatever else was unreachable.
    labels.clear()
    seq[:] = [_outcome(2, h1=HostResult("h1", failed=True, messages=["GPU count 7, expected 8"]),
                       h2=HostResult("h2", unreachable=True))]
    log = retry.RetryLog()
    out = ro.preflight(None, None, ["h1", "h2"], "r/x:1", tmp_path, policy=FAST, log=log, sleep=lambda s: None)
    assert out.rc == 2 and labels == ["preflight"] and len(log) == 0


def test_retry_call_reraises_the_last_exception_and_never_retries_what_is_not_transient():
    calls: list[int] = []

    def boom() -> None:
        calls.append(1)
        raise OSError("reset")

    log = retry.RetryLog()
    with pytest.raises(OSError, match="reset"):
        retry.call(boom, what="t", name="boom", policy=FAST, log=log, retry_exc=lambda e: isinstance(e, OSError),
                   sleep=lambda s: None)
    assert len(calls) == FAST.attempts and len(log) == FAST.attempts - 1
    calls.clear()
    with pytest.raises(OSError):
        retry.call(boom, what="t", name="boom", policy=FAST, log=log, retry_exc=lambda e: False,
                   sleep=lambda s: None)
    assert len(calls) == 1


def test_credentials_of_a_killed_controller_are_swept(tmp_path: Path):
    """A controller killed during a playbook never runs its `finally`: its 0600 registry credentials stay in
    /tmp. The next run removes the dirs whose pid is gone, never a live one's nor a name without a pid."""
    import subprocess
    import sys

    from sglfleet.rollout.runner import sweep_credentials

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    for name in (f"rollout-cred-{dead}-abc", f"rollout-cred-{os.getpid()}-def", "rollout-cred-_legacy"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "registry.json").write_text("{}")
    assert sweep_credentials(str(tmp_path)) == [str(tmp_path / f"rollout-cred-{dead}-abc")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"rollout-cred-{os.getpid()}-def",
                                                                 "rollout-cred-_legacy"])
