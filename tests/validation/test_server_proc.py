"""sglfleet.pipeline.server_proc.ServerProcess against real processes on CPU: the embedded llama.cpp server
(started by its own command line, as the sweep starts an SGLang server), a command that exits at
once, and a real HTTP server that never answers /health. No HTTP or process is mocked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sglfleet.pipeline.client import OpenAIClient
from sglfleet.pipeline.embedded import MODEL_ALIAS, default_model_path
from sglfleet.pipeline.errors import TargetError
from sglfleet.pipeline.procs import free_port as _free_port
from sglfleet.pipeline.procs import group_alive
from sglfleet.pipeline.server_proc import ServerProcess, port_in_use

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]


def _embedded_cmd(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sglfleet.pipeline.embedded", "serve", "--port", str(port), "--parallel", "1",
            "--threads", "1", "--ctx", "1024", *extra]


@pytest.mark.skipif(not default_model_path(), reason="the embedded model (make setup) is not installed")
def test_a_real_server_becomes_ready_and_stop_leaves_no_process(tmp_path: Path) -> None:
    port = _free_port()
    srv = ServerProcess(_embedded_cmd(port), f"http://127.0.0.1:{port}", tmp_path / "embedded.log", timeout_s=120,
                        name="embedded", cwd=REPO)
    with srv:
        assert srv.models == [MODEL_ALIAS] and srv.ready_s is not None and srv.running
        with OpenAIClient(srv.url) as c:
            assert c.health() and c.chat("Say hi.", max_tokens=4).completion_tokens
        pgid = srv.pgid
        assert pgid is not None and group_alive(pgid)
        with pytest.raises(TargetError, match="already in use"):  # a second server on the same port
            ServerProcess(_embedded_cmd(port), srv.url, tmp_path / "second.log", timeout_s=5).launch()
    assert not group_alive(pgid) and not port_in_use(srv.url) and srv.proc is None
    assert (tmp_path / "embedded.log").read_text().startswith("$ " + sys.executable)


def test_a_command_that_exits_at_once_is_an_error_with_its_log_tail(tmp_path: Path) -> None:
    port = _free_port()
    srv = ServerProcess(_embedded_cmd(port, "--model", str(tmp_path / "missing.gguf")), f"http://127.0.0.1:{port}",
                        tmp_path / "bad.log", timeout_s=120, name="cell-03", cwd=REPO)
    with pytest.raises(TargetError) as e:
        srv.start()
    msg = str(e.value)
    assert msg.startswith("cell-03: exited with 2 before it was ready; log ")
    assert "model file not found" in msg and str(tmp_path / "bad.log") in msg
    assert srv.proc is None and srv.pgid is not None and not group_alive(srv.pgid)


def test_a_server_that_never_becomes_healthy_times_out_and_its_whole_group_is_stopped(tmp_path: Path) -> None:
    """A real HTTP server (no /health: 404) started by a shell that stays the group leader: the
    timeout names the reason and the log tail, and the server child dies with the shell."""
    port = _free_port()
    cmd = ["sh", "-c", f"{sys.executable} -m http.server {port} --bind 127.0.0.1 & exec sleep 600"]
    srv = ServerProcess(cmd, f"http://127.0.0.1:{port}", tmp_path / "slow.log", timeout_s=4, name="slow",
                        poll_s=0.2)
    srv.launch()
    pgid = srv.pgid
    assert pgid is not None
    with pytest.raises(TargetError) as e:
        srv.wait_ready()
    msg = str(e.value)
    assert msg.startswith("slow: not ready after 4s (no answer on /health); log "), msg
    assert '"GET /health HTTP/1.1" 404' in msg  # the tail of what the server itself logged
    assert not group_alive(pgid) and not port_in_use(srv.url)


@pytest.mark.skipif(not default_model_path(), reason="the embedded model (make setup) is not installed")
def test_embedded_stop_without_a_port_stops_what_start_left_on_another_port(tmp_path: Path) -> None:
    """`embedded start --port P` then `embedded stop --run-dir DIR` (no port, as the module's usage reads): the
    server on P is stopped and named; it used to look only for the default port's pid file, print "not running"
    and leave the server up. A second stop finds nothing."""
    import contextlib
    import os
    import subprocess

    port = _free_port()
    run = str(tmp_path / "run")
    base = [sys.executable, "-m", "sglfleet.pipeline.embedded"]
    started = subprocess.run([*base, "start", "--port", str(port), "--run-dir", run, "--parallel", "1",
                              "--threads", "1", "--ctx", "1024"], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    pid = int((tmp_path / "run" / f"embedded-{port}.pid").read_text())
    try:
        assert port_in_use(f"http://127.0.0.1:{port}")
        out = subprocess.run([*base, "stop", "--run-dir", run], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == f"stopped (port {port})", out.stdout + out.stderr
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert not port_in_use(f"http://127.0.0.1:{port}")
        again = subprocess.run([*base, "stop", "--run-dir", run], capture_output=True, text=True, timeout=60)
        assert again.stdout.strip() == "not running"
    finally:  # a failure above must not leave the server running
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
