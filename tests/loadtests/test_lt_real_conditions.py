"""Load tests under real conditions (issue 28): stalls, API keys, prompts unique per run, Locust's totals
against summary.json, requests still running at the stop. Real Locust runs (subprocesses) against the
simulated streaming server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sglfleet.loadtests.config import LoadTestConfig
from sglfleet.loadtests.stream import ERR_STALL, ERR_TIMEOUT, Endpoint, build_request, stream_chat
from sglfleet.loadtests.workload import build_requests
from tests.loadtests.conftest import read_json, records, run_cli

SECRET = "sk-lt-test-2b8e61f0c4"


def _body(n: int) -> dict:
    return {"model": "sim", "messages": [{"role": "user", "content": "x"}], "max_tokens": n, "stream": True}


def test_mid_stream_stall_is_its_own_error_class(sim) -> None:
    srv = sim("--tokens", "6", "--itl-ms", "1", "--stall-after", "2", "--stall-s", "5")
    ep = Endpoint.parse(srv.url)
    res = stream_chat(ep, build_request(ep, _body(6)), timeout_s=30.0, stall_s=0.4)
    assert res.error == ERR_STALL and "mid-stream after 2 content chunks" in res.detail
    assert res.e2e < 5  # ended by the stall limit, not by the server resuming
    slow = sim("--tokens", "30", "--itl-ms", "100")  # never silent for 0.4 s, but longer than 1 s in all
    ep = Endpoint.parse(slow.url)
    res = stream_chat(ep, build_request(ep, _body(30)), timeout_s=1.0, stall_s=0.4)
    assert res.error == ERR_TIMEOUT


def _prompts(cfg: LoadTestConfig, nonce: str) -> list[str]:
    return [json.loads(s.raw.split(b"\r\n\r\n", 1)[1])["messages"][0]["content"]
            for s in build_requests(cfg, "m", pool=16, nonce=nonce)]


def test_synthetic_prompts_are_new_each_run_unless_reused() -> None:
    cfg = LoadTestConfig(host="http://127.0.0.1:1", workload={"kind": "synthetic", "input_tokens": 32})
    a, b = _prompts(cfg, "run1"), _prompts(cfg, "run2")
    assert len(set(a)) == 16 and not set(a) & set(b)
    # not even a shared word sequence after the head: the nonce seeds the words too
    assert not {p.split(": ", 1)[1] for p in a} & {p.split(": ", 1)[1] for p in b}
    reuse = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"reuse_prompts": True})})
    assert _prompts(reuse, "run1") == _prompts(reuse, "run2")
    pc = LoadTestConfig(host="http://127.0.0.1:1", workload={"kind": "prefix-cache", "prefix_pool": 3})
    fixed = _prompts(pc, "run1")
    assert fixed == _prompts(pc, "run2") and len(fixed) == 3


def test_each_run_gets_its_own_prompt_nonce(sim, tmp_path: Path) -> None:
    srv = sim("--tokens", "4", "--itl-ms", "1")
    nonces = []
    for i in range(2):
        out = tmp_path / f"r{i}"
        cp = run_cli("run", "--host", srv.url, "--users", "1", "--duration", "1", "--workload", "synthetic",
                     "--input-tokens", "16", "--output-tokens", "4", "--out", str(out))
        assert cp.returncode == 0, cp.stderr
        nonces.append(read_json(out / "loadtest-settings.json")["prompt_nonce"])
    assert nonces[0] != nonces[1]


def test_locust_totals_agree_and_running_requests_are_reported(sim, tmp_path: Path) -> None:
    # each request takes ~1.5 s; the run stops at 4 s with no stop timeout: both users are mid-request then
    srv = sim("--tokens", "15", "--itl-ms", "100")
    cfg = tmp_path / "lt.yaml"
    cfg.write_text("loadtest:\n  stop_timeout_s: 0\n")
    out = tmp_path / "run"
    cp = run_cli("run", "--host", srv.url, "--users", "2", "--duration", "4", "--config", str(cfg), "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    s = read_json(out / "summary.json")
    req = s["requests"]
    assert req["in_flight_at_stop"] == 2, req
    assert req["failed"] == 0 and req["ok"] == req["total"] > 0, req
    running = [r for r in records(out) if r.get("running_at_stop")]
    assert len(running) == 2 and all(r["e2e"] > 0 for r in running)
    agree = s["locust_agreement"]
    assert agree["agree"] is True, agree
    # Locust's count is every request that ended: the summary's total plus those that ended while stopping
    assert agree["locust_requests"] == req["total"] + req["after_stop_excluded"] + req["warmup_excluded"]
    assert "still running at the stop" in cp.stdout


def test_load_test_sends_the_key_from_env_and_never_writes_it(sim, tmp_path: Path) -> None:
    srv = sim("--api-key", SECRET, "--tokens", "4", "--itl-ms", "1")
    out = tmp_path / "bad"
    cp = run_cli("run", "--host", srv.url, "--users", "1", "--duration", "1", "--out", str(out))
    assert cp.returncode == 2 and cp.stderr.strip().startswith("error: the target needs an API key:"), cp.stderr
    out = tmp_path / "ok"
    os.environ["LT_TEST_KEY"] = SECRET
    try:
        cp = run_cli("run", "--host", srv.url, "--users", "2", "--duration", "2", "--api-key-env", "LT_TEST_KEY",
                     "--out", str(out))
    finally:
        os.environ.pop("LT_TEST_KEY")
    assert cp.returncode == 0, cp.stderr
    s = read_json(out / "summary.json")
    assert s["requests"]["ok"] > 0 and s["requests"]["failed"] == 0, s["requests"]
    for f in out.rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f
    assert SECRET not in cp.stdout + cp.stderr


def test_key_file_for_the_load_test(sim, tmp_path: Path) -> None:
    srv = sim("--api-key", SECRET, "--tokens", "4", "--itl-ms", "1")
    key = tmp_path / "key"
    key.write_text(SECRET)
    out = tmp_path / "ok"
    cp = run_cli("run", "--host", srv.url, "--users", "1", "--duration", "1", "--api-key-file", str(key),
                 "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    assert read_json(out / "summary.json")["requests"]["ok"] > 0


@pytest.mark.parametrize("flag", ["--api-key-file", "--api-key-env"])
def test_missing_key_source_is_exit_2(tmp_path: Path, flag: str) -> None:
    value = str(tmp_path / "nope") if flag == "--api-key-file" else "SURELY_UNSET_LT_KEY"
    cp = run_cli("run", "--host", "http://127.0.0.1:9", flag, value)
    assert cp.returncode == 2 and cp.stderr.startswith("error: ")
