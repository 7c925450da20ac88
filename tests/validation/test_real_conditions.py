"""The gate's time limits and API keys against real local HTTP servers (issue 28).

A simulated OpenAI server (testbed/simserver.py) that stalls mid-stream, hangs after a few requests or
requires a key; and the real embedded model (llama.cpp) served with an API key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglfleet.pipeline.client import OpenAIClient, TargetHung, TargetTimeout
from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer
from sglfleet.pipeline.errors import UsageError
from sglfleet.pipeline.procs import free_port
from sglfleet.validation.config import GateConfig
from sglfleet.validation.gate import Gate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-test-7f3c9a1e55d04b2c"  # a made-up key: every report file is searched for it


@pytest.fixture
def server(sim):  # the simulator factory of tests/conftest.py, under this module's name for it
    return sim


def _sim_gate_cfg(**kw: object) -> GateConfig:
    """A gate that asks the simulator only what it can answer: the suite at T=0, no judge, no depth checks."""
    base: dict[str, object] = {"temperatures": [0.0], "judge": {"enabled": False}, "determinism": {"enabled": False},
                               "variation": {"enabled": False}, "quality": {"enabled": False},
                               "long_copy": {"enabled": False}, "concurrency": 2, "max_tokens": 8}
    base.update(kw)
    return GateConfig.model_validate(base)


# ---------------------------------------------------------------------------------------------- time limits
def test_a_mid_stream_stall_fails_the_request_as_stalled(server) -> None:
    srv = server("--tokens", "6", "--itl-ms", "1", "--stall-after", "3", "--stall-s", "5")
    with OpenAIClient(srv.url, timeout_s=60.0, stall_s=0.5) as c, pytest.raises(TargetTimeout) as exc:
        c.chat("hi", max_tokens=6)
    assert exc.value.kind == "stall"
    assert "mid-stream after 3 content chunks" in str(exc.value) and "0.5s" in str(exc.value)


def test_a_stall_shorter_than_the_limit_passes(server) -> None:
    srv = server("--tokens", "6", "--itl-ms", "1", "--stall-after", "3", "--stall-s", "0.3")
    with OpenAIClient(srv.url, timeout_s=60.0, stall_s=5.0) as c:
        r = c.chat("hi", max_tokens=6)
    assert r.text == "".join(f" tok{i}" for i in range(6))


def test_a_slow_trickle_is_cut_at_the_total_limit(server) -> None:
    # one chunk every 0.3 s never trips a 1 s stall limit; the total limit of 1 s ends the request
    srv = server("--tokens", "20", "--itl-ms", "300")
    with OpenAIClient(srv.url, timeout_s=1.0, stall_s=1.0) as c, pytest.raises(TargetTimeout) as exc:
        c.chat("hi", max_tokens=20)
    assert exc.value.kind == "total"


def test_a_target_that_stops_answering_is_rejected_after_k_timeouts(server, tmp_path: Path) -> None:
    # 2 answers, then every request (any path) is read and never answered
    srv = server("--tokens", "4", "--itl-ms", "1", "--hang-after", "2")
    cfg = _sim_gate_cfg(request_stall_s=0.5, request_timeout_s=5.0, request_timeouts_in_row=3)
    result = Gate(srv.url, cfg).run()
    assert not result.passed and "request_errors" in {c.name for c in result.failed_cases}
    errors = [s.error for s in result.samples if s.error]
    hung = [e for e in errors if e.startswith("target hung")]
    timed_out = [e for e in errors if "stalled" in e and e not in hung]
    # the breaker opens at the 3rd timeout in a row; with 2 in flight at most one more times out
    assert 3 <= len(timed_out) <= 3 + cfg.concurrency - 1, errors
    assert len(hung) == len(result.samples) - 2 - len(timed_out) and hung, errors


def test_a_target_that_hangs_from_the_start_is_refused_after_one_stall(server) -> None:
    srv = server("--hang-after", "0")
    with pytest.raises(Exception) as exc:  # TargetError: the CLI exits 2
        Gate(srv.url, _sim_gate_cfg(request_stall_s=0.5, request_timeout_s=5.0)).run()
    assert "stalled" in str(exc.value) and "/v1/models" in str(exc.value)


def test_stall_limit_above_the_total_is_the_total() -> None:
    cfg = GateConfig.model_validate({"request_stall_s": 200, "request_timeout_s": 100})
    c = OpenAIClient("http://127.0.0.1:9", timeout_s=cfg.request_timeout_s, stall_s=cfg.request_stall_s)
    assert c.stall_s == 100
    c.close()


# ---------------------------------------------------------------------------------------------- API keys
def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglfleet.validation", *args], cwd=REPO, capture_output=True,
                          text=True,
                          timeout=300, check=False, env={**os.environ, **(env or {})})


def _profile(tmp_path: Path, **kw: object) -> Path:
    p = tmp_path / "gate.yaml"
    cfg = {"temperatures": [0.0], "judge": {"enabled": False}, "determinism": {"enabled": False},
           "variation": {"enabled": False}, "quality": {"enabled": False}, "long_copy": {"enabled": False},
           "max_tokens": 8, **kw}
    p.write_text(json.dumps({"gate": cfg}))
    return p


def _no_secret_under(out: Path, *texts: str) -> None:
    files = [f for f in out.rglob("*") if f.is_file()]
    assert files
    for f in files:
        assert SECRET.encode() not in f.read_bytes(), f
    for t in texts:
        assert SECRET not in t


def test_gate_without_the_key_is_exit_2_with_one_line(server, tmp_path: Path) -> None:
    srv = server("--api-key", SECRET, "--tokens", "4")
    r = _cli("run", "--target", srv.url, "--config", str(_profile(tmp_path)), "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("error: the target needs an API key:"), r.stderr


def test_a_wrong_key_is_exit_2_and_not_echoed(server, tmp_path: Path) -> None:
    srv = server("--api-key", SECRET, "--tokens", "4")
    r = _cli("run", "--target", srv.url, "--config", str(_profile(tmp_path)), "--api-key-env", "GATE_KEY",
             env={"GATE_KEY": "sk-wrong-key-123456"})
    assert r.returncode == 2 and "the target needs an API key" in r.stderr
    assert "sk-wrong-key-123456" not in r.stderr + r.stdout


@pytest.mark.parametrize("how", ["env", "file", "config"])
def test_gate_sends_the_key_and_no_report_contains_it(server, tmp_path: Path, how: str) -> None:
    srv = server("--api-key", SECRET, "--tokens", "4", "--itl-ms", "1")
    keyfile = tmp_path / "key"
    keyfile.write_text(SECRET + "\n")
    out = tmp_path / "out"
    args = ["run", "--target", srv.url, "--out", str(out)]
    env = {}
    if how == "env":
        args += ["--config", str(_profile(tmp_path)), "--api-key-env", "GATE_KEY"]
        env = {"GATE_KEY": SECRET}
    elif how == "file":
        args += ["--config", str(_profile(tmp_path)), "--api-key-file", str(keyfile)]
    else:
        args += ["--config", str(_profile(tmp_path, api_key_file=str(keyfile)))]
    r = _cli(*args, env=env)
    # the simulator's " tok0 tok1" answers fail the detectors: a gate verdict (1), not a refused key (2)
    assert r.returncode in (0, 1), r.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["request_errors"] == 0, report["summary"]
    _no_secret_under(out, r.stdout, r.stderr)


def test_api_key_flag_with_the_key_itself_does_not_exist(tmp_path: Path) -> None:
    r = _cli("run", "--target", "http://127.0.0.1:9", "--api-key", SECRET)
    assert r.returncode == 2 and SECRET not in r.stderr


def test_missing_key_file_or_variable_is_exit_2_before_any_request(tmp_path: Path) -> None:
    r = _cli("run", "--target", "http://127.0.0.1:9", "--config", str(_profile(tmp_path)),
             "--api-key-file", str(tmp_path / "nope"))
    assert r.returncode == 2 and "API key file not found" in r.stderr
    r = _cli("run", "--target", "http://127.0.0.1:9", "--config", str(_profile(tmp_path)),
             "--api-key-env", "SURELY_UNSET_KEY_VAR")
    assert r.returncode == 2 and "SURELY_UNSET_KEY_VAR" in r.stderr and "not set" in r.stderr


def test_resolve_api_key_rejects_multiline_and_empty(tmp_path: Path) -> None:
    from sglfleet.pipeline.auth import resolve_api_key

    f = tmp_path / "k"
    f.write_text("a\nb\n")
    with pytest.raises(UsageError, match="one key, one line"):
        resolve_api_key(file=f)
    f.write_text("\n\n")
    with pytest.raises(UsageError, match="empty"):
        resolve_api_key(file=f)
    f.write_text("  abc  \n")
    assert resolve_api_key(file=f) == "abc"


@pytest.fixture(scope="module")
def keyed_embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """The real embedded model served with an API key (llama.cpp's api_keys)."""
    os.environ["EMBEDDED_TEST_KEY"] = SECRET
    run_dir = tmp_path_factory.mktemp("keyed")
    with EmbeddedServer(EmbeddedConfig(port=free_port(), api_key_env="EMBEDDED_TEST_KEY"), run_dir) as srv:
        yield srv
    os.environ.pop("EMBEDDED_TEST_KEY", None)


def test_record_baseline_and_gate_on_a_keyed_real_server(keyed_embedded: EmbeddedServer, tmp_path: Path) -> None:
    url = keyed_embedded.url
    prof = _profile(tmp_path, max_tokens=24)
    base = tmp_path / "baseline.json"
    r = _cli("record-baseline", "--target", url, "--out", str(base), "--config", str(prof))
    assert r.returncode == 2 and "the target needs an API key" in r.stderr, r.stderr
    assert not base.exists()
    env = {"GATE_KEY": SECRET}
    r = _cli("record-baseline", "--target", url, "--out", str(base), "--config", str(prof), "--api-key-env",
             "GATE_KEY", env=env)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "gate"
    r2 = _cli("run", "--target", url, "--config", str(prof), "--out", str(out), "--baseline", str(base),
              "--api-key-env", "GATE_KEY", env=env)
    assert r2.returncode in (0, 1), r2.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["request_errors"] == 0
    assert report["config"]["api_key_env"] == "GATE_KEY"
    assert SECRET.encode() not in base.read_bytes()
    _no_secret_under(out, r.stdout, r.stderr, r2.stdout, r2.stderr)


def test_breaker_error_is_raised_without_a_request(server) -> None:
    srv = server("--hang-after", "0")
    c = OpenAIClient(srv.url, model="sim", timeout_s=5.0, stall_s=0.3, max_timeouts_in_row=1)
    with pytest.raises(TargetTimeout):
        c.chat("hi", max_tokens=2)
    with pytest.raises(TargetHung):
        c.chat("hi", max_tokens=2)
    assert c.metrics_text() is None and c.server_info() is None
    c.close()


def test_a_slow_target_that_keeps_answering_is_not_called_hung(server) -> None:
    # every request runs past the total, but bytes keep coming: each fails as `total`, the breaker stays shut
    srv = server("--tokens", "20", "--itl-ms", "100")
    c = OpenAIClient(srv.url, model="sim", timeout_s=0.5, stall_s=0.5, max_timeouts_in_row=1)
    for _ in range(3):
        with pytest.raises(TargetTimeout) as exc:
            c.chat("hi", max_tokens=20)
        assert exc.value.kind == "total" and not isinstance(exc.value, TargetHung)
    assert c.hung is None
    c.close()


@pytest.mark.parametrize(("usable", "want"), [(1, 1), (2, 1), (3, 2), (8, 4), (64, 4)])
def test_embedded_threads_leave_a_core_free(monkeypatch: pytest.MonkeyPatch, usable: int, want: int) -> None:
    """The embedded engine's default threads: the usable CPUs less one, 1 to 4. With as many llama.cpp threads
    as cores, one busy neighbour stalls every op barrier (docs/results/embedded-threads-2026-12-03.json:
    2 threads beside one hog 0.5 tok/s, 1 thread 52)."""
    from sglfleet.pipeline import embedded

    monkeypatch.setattr(embedded.os, "sched_getaffinity", lambda _pid: set(range(usable)))
    assert embedded.default_threads() == want
    assert embedded.EmbeddedConfig(model_path=__file__).threads == want
    assert embedded.EmbeddedConfig(model_path=__file__, threads=3).threads == 3
