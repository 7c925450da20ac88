"""Short real Locust runs (in subprocesses) against the simulated streaming server."""

from __future__ import annotations

import csv
import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.loadtests.conftest import assert_locust_counts_only_chat_requests, metrics_csv, read_json, run_cli

SUMMARY_KEYS = {"complete", "host", "model", "load", "processes", "requests", "error_rate", "ttft_ms", "itl_ms",
                "tpot_ms", "e2e_ms", "output_len", "request_tok_per_s", "throughput", "lengths", "slo",
                "stop_reason", "length_source"}


def test_error_classes_reach_summary_and_locust(sim, tmp_path: Path) -> None:
    srv = sim("--mode", "mixed", "--tokens", "6", "--itl-ms", "1")
    out = tmp_path / "mixed"
    cp = run_cli("run", "--host", srv.url, "--users", "2", "--duration", "3", "--timeout", "0.5", "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    s = read_json(out / "summary.json")
    assert s["complete"] is True
    assert set(s["requests"]["errors"]) == {"http_503", "stream_cut", "malformed_chunk", "empty_output", "timeout"}
    assert s["slo"]["met"] is False  # ~5/6 errors
    failures = {r["Error"] for r in csv.DictReader((out / "locust_failures.csv").open())}
    assert {"http_503", "stream_cut", "malformed_chunk", "empty_output"} <= failures
    recs = assert_locust_counts_only_chat_requests(out)  # real failures: one per failed chat request
    assert sum(not r["ok"] for r in recs) >= s["requests"]["failed"] > 0
    assert (out / "locust.html").stat().st_size > 1000 and (out / "summary.html").is_file()


def test_single_and_multi_process_results_have_the_same_form(sim, tmp_path: Path) -> None:
    srv = sim("--tokens", "20", "--itl-ms", "2", "--ttft-ms", "5", "--no-record")
    single, multi = tmp_path / "single", tmp_path / "multi"
    cp = run_cli("run", "--host", srv.url, "--users", "4", "--duration", "3", "--out", str(single))
    assert cp.returncode == 0, cp.stderr
    cp = run_cli("run", "--host", srv.url, "--users", "4", "--duration", "3", "--processes", "2", "--out", str(multi))
    assert cp.returncode == 0, cp.stderr
    s1, s2 = read_json(single / "summary.json"), read_json(multi / "summary.json")
    assert set(s1) >= SUMMARY_KEYS and set(s1) == set(s2)
    assert s2["processes"] == 2 and s2["complete"] and s2["requests"]["ok"] > 0 and s2["requests"]["failed"] == 0
    assert len(list((multi / "records").glob("*.jsonl"))) == 2  # one record file per worker process
    assert len(list((single / "records").glob("*.jsonl"))) == 1
    # Locust counts chat requests only, in both modes; the master merged every worker's latency metrics
    # (report_to_master / worker_report): one TTFT per request and 19 gaps per request across both workers.
    for out in (single, multi):
        recs = assert_locust_counts_only_chat_requests(out)
        m = metrics_csv(out)
        assert int(m["ITL"]["Count"]) == 19 * int(m["TTFT"]["Count"]) == 19 * len(recs)


def test_poisson_rate_mode_and_request_bound(sim, tmp_path: Path) -> None:
    srv = sim("--tokens", "4", "--itl-ms", "1", "--no-record")
    out = tmp_path / "rate"
    cp = run_cli("run", "--host", srv.url, "--rate", "20", "--arrival", "poisson", "--users", "4", "--duration", "3",
                 "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    s = read_json(out / "summary.json")
    assert s["load"] == {"mode": "rate", "rate": 20.0, "arrival": "poisson", "generators": 4}
    assert 10 <= s["requests"]["total"] <= 120  # ~60 arrivals expected in 3 s (loose: behaviour, not timing)
    bounded = tmp_path / "bounded"
    cp = run_cli("run", "--host", srv.url, "--users", "2", "--duration", "30", "--max-requests", "25",
                 "--out", str(bounded))
    assert cp.returncode == 0, cp.stderr
    b = read_json(bounded / "summary.json")
    assert b["stop_reason"] == "max_requests" and b["wall_s"] < 25
    n_records = sum(len(f.read_text().splitlines()) for f in (bounded / "records").glob("*.jsonl"))
    assert 25 <= n_records <= 27  # the bound, plus what was in flight


def test_step_ramp_shape(sim, tmp_path: Path) -> None:
    srv = sim("--tokens", "4", "--itl-ms", "2", "--no-record")
    out = tmp_path / "steps"
    cp = run_cli("run", "--host", srv.url, "--steps", "1:1.5,3:1.5", "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    s = read_json(out / "summary.json")
    assert s["load"]["mode"] == "steps" and s["stop_reason"] in ("shape_complete", "duration")
    users = [int(r["User Count"]) for r in csv.DictReader((out / "locust_stats_history.csv").open())]
    assert 1 in users and max(users) == 3


def test_capacity_search_finds_the_known_knee(sim, tmp_path: Path) -> None:
    # 4 slots: up to 4 users TTFT stays ~20 ms; the 5th user always queues behind a 220 ms stream.
    srv = sim("--ttft-ms", "20", "--itl-ms", "5", "--tokens", "40", "--slots", "4", "--no-record")
    cfg = tmp_path / "knee.yaml"
    cfg.write_text("loadtest:\n  workload: {max_tokens: 40}\n  stop_timeout_s: 2\n"
                   "  slo: {ttft_p95_ms: 45, itl_p95_ms: 50, max_error_rate: 0.01}\n"
                   "  capacity: {start: 1, max_load: 16, step_duration_s: 2.5, warmup_s: 0.5, min_samples: 10,"
                   " max_step_s: 8}\n")
    out = tmp_path / "cap"
    cp = run_cli("capacity", "--host", srv.url, "--config", str(cfg), "--out", str(out), timeout=400)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    r = read_json(out / "capacity.json")
    assert r["complete"] is True and r["capacity"] == 4 and r["first_failing"] == 5
    phases = [s["phase"] for s in r["steps"]]
    assert phases[:3] == ["bracket"] * 3 and "bisect" in phases
    assert [s["load"] for s in r["steps"] if s["phase"] == "bracket"][:4] == [1, 2, 4, 8]
    assert any(s["stop_reason"] == "saturated_ttft" for s in r["steps"])  # over-saturated steps end early
    assert r["goodput_at_capacity"] > 0
    # Each step's Locust stats count chat requests only (the Aggregated row was inflated by metric events).
    assert_locust_counts_only_chat_requests(out / r["steps"][0]["dir"])
    junit = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert junit is not None and junit.get("failures") == "0"
    assert {c.get("name") for c in junit.iter("testcase")} == {"complete", "capacity_found"}
    for f in ("capacity.html", "latency.png", "throughput.png"):
        assert (out / f).stat().st_size > 1000


def test_bad_input_gives_one_error_line_and_no_complete_report(sim, tmp_path: Path) -> None:
    js = sim("--mode", "json")
    bad_ds = tmp_path / "bad.jsonl"
    bad_ds.write_text('{"prompt": "ok"}\nnot json\n')
    ok = sim("--tokens", "2", "--no-record")
    cases = [
        (["run", "--host", "http://127.0.0.1:9"], "cannot reach"),
        (["run", "--host", js.url], "does not stream"),
        (["run", "--host", ok.url, "--slo-ttft-ms", "-1"], "slo.ttft_p95_ms"),
        (["capacity", "--host", ok.url, "--max-error-rate", "2"], "slo.max_error_rate"),
        (["run", "--host", ok.url, "--dataset", str(bad_ds)], "bad.jsonl:2: not valid JSON"),
        (["run"], "no target"),
        (["run", "--host", ok.url, "--dataset", str(tmp_path / "missing.jsonl")], "dataset file not found"),
    ]
    for i, (args, msg) in enumerate(cases):
        out = tmp_path / f"case{i}"
        cp = run_cli(*args, "--out", str(out), timeout=60)
        assert cp.returncode == 2, (args, cp.stdout, cp.stderr)
        lines = cp.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], (args, cp.stderr)
        summary = out / "summary.json"
        assert not summary.exists() or json.loads(summary.read_text())["complete"] is False


def test_web_ui_runs_the_same_locustfile(sim, tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    import httpx

    from sglfleet.pipeline.procs import free_port
    from tests.loadtests.conftest import REPO

    srv = sim("--tokens", "4", "--itl-ms", "1", "--no-record")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglfleet.loadtests", "ui", "--host", srv.url, "--web-port",
                             str(port),
                             "--duration", "30", "--out", str(tmp_path / "ui")], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        r = httpx.post(base + "/swarm", data={"user_count": 2, "spawn_rate": 10, "host": srv.url}, timeout=5)
        assert r.status_code == 200 and r.json()["success"]
        body: dict = {}
        while time.monotonic() < deadline:
            time.sleep(0.5)
            body = httpx.get(base + "/stats/requests", timeout=5).json()
            chat = [s for s in body["stats"] if s["name"] == "chat"]
            if chat and chat[0]["num_requests"] >= 5:
                break
        # Locust's request table: the chat requests and their aggregate, nothing else.
        assert {s["name"] for s in body["stats"]} == {"chat", "Aggregated"}
        agg = {s["name"]: s for s in body["stats"]}["Aggregated"]
        assert agg["num_requests"] >= 5
        # The latency metrics: the web UI's extra tab reads them from `extended_stats`.
        ext = {e["key"]: e["data"] for e in body["extended_stats"]}
        rows = {r["name"]: r for r in ext["latency-metrics"]}
        assert rows["TTFT"]["unit"] == "ms" and rows["TTFT"]["count"] >= 1 and rows["ITL"]["count"] >= 3
        page = httpx.get(base + "/", timeout=5).text
        assert "Latency metrics" in page and "latency-metrics" in page
        metrics_csv_text = httpx.get(base + "/latency-metrics/csv", timeout=5).text
        assert metrics_csv_text.splitlines()[0].startswith("Name,Unit,Count,Mean")
        assert list((tmp_path / "ui" / "records").glob("*.jsonl"))
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_missed_slo_fails_cli_and_make_with_junit(sim, tmp_path: Path) -> None:
    from tests.loadtests.conftest import REPO

    srv = sim("--ttft-ms", "30", "--tokens", "4", "--itl-ms", "1", "--no-record")
    out = tmp_path / "miss"
    cp = run_cli("run", "--host", srv.url, "--users", "1", "--duration", "2", "--slo-ttft-ms", "5", "--check-slo",
                 "--out", str(out))
    assert cp.returncode == 1, cp.stdout + cp.stderr
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    failed = {c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None}
    assert failed == {"ttft_p95"}
    # The same run through make: SLOs are checked by default; make keeps the tool's exit code (mk/exit-code.inc).
    mk = subprocess.run(["make", "--no-print-directory", "loadtest", f"TARGET={srv.url}", "USERS=1", "DURATION=2",
                         "SLO_TTFT_MS=5", f"OUT={tmp_path / 'make-miss'}"], cwd=REPO, capture_output=True, text=True,
                        timeout=120, check=False)
    assert mk.returncode == 1 and "make loadtest: FAILED (exit 1)" in mk.stderr, mk.stdout + mk.stderr
    mk = subprocess.run(["make", "--no-print-directory", "loadtest", f"TARGET={srv.url}", "USERS=1", "DURATION=2",
                         "SLO_TTFT_MS=5000", f"OUT={tmp_path / 'make-pass'}"], cwd=REPO, capture_output=True,
                        text=True, timeout=120, check=False)
    assert mk.returncode == 0, mk.stdout + mk.stderr
    mk = subprocess.run(["make", "--no-print-directory", "loadtest", f"TARGET={srv.url}", "SLO_TTFT_MS=-1",
                         f"OUT={tmp_path / 'make-bad'}"], cwd=REPO, capture_output=True, text=True, timeout=120,
                        check=False)
    assert mk.returncode == 2 and "slo.ttft_p95_ms" in mk.stderr, mk.stderr
