"""Short real load tests against the embedded model (SmolLM2-135M on llama.cpp, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglfleet.loadtests import quick_capacity
from tests.loadtests.conftest import assert_locust_counts_only_chat_requests, metrics_csv, read_json, run_cli

pytestmark = pytest.mark.integration


def test_builtin_prompts_closed_loop(embedded_target, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cp = run_cli("run", "--host", embedded_target.url, "--users", "2", "--duration", "60", "--max-requests", "4",
                 "--max-tokens", "6",
                 "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    s = read_json(out / "summary.json")
    assert s["complete"] and s["model"] == "smollm2-135m-instruct" and s["requests"]["ok"] >= 1
    assert s["requests"]["failed"] == 0
    assert s["length_source"]["usage"] == s["requests"]["ok"]  # llama.cpp sends usage: server count used
    assert s["ttft_ms"]["p50"] > 0 and s["itl_ms"]["count"] >= 1 and s["output_len"]["max"] <= 6
    # Against the real model too: Locust's Aggregated row is the chat requests, metrics in their own table.
    recs = assert_locust_counts_only_chat_requests(out)
    assert len(recs) >= s["requests"]["total"]
    m = metrics_csv(out)
    assert 0 < float(m["decode tok/s"]["Mean"]) < 10_000 and float(m["TTFT"]["Mean"]) > 0
    assert (out / "locust.html").is_file() and (out / "summary.html").is_file()


def test_synthetic_lengths_asked_vs_received(embedded_target, tmp_path: Path) -> None:
    out = tmp_path / "synth"
    cp = run_cli("run", "--host", embedded_target.url, "--users", "2", "--duration", "60", "--max-requests", "4",
                 "--workload", "synthetic",
                 "--input-tokens", "48", "--output-tokens", "6", "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    s = read_json(out / "summary.json")
    assert s["calibration"]["calibrated"] is True
    lengths = s["lengths"]
    assert lengths["output_asked_mean"] == 6
    assert lengths["output_received_mean"] == 6 and lengths["output_mismatches"] == 0  # ignore_eos honoured
    assert abs(lengths["input_received_mean"] - 48) <= 0.25 * 48


def test_quick_capacity_api(embedded_target, tmp_path: Path) -> None:
    r = quick_capacity(embedded_target.url, tmp_path / "cap", max_load=2, ttft_p95_ms=60000, itl_p95_ms=10000,
                       max_error_rate=0.5)
    assert r["complete"] is True and r["mode"] == "users" and r["steps"]
    assert r["steps"][0]["load"] == 1 and all(s["phase"] == "bracket" for s in r["steps"])
    assert (tmp_path / "cap" / "capacity.html").is_file() and (tmp_path / "cap" / "latency.png").is_file()
    assert read_json(tmp_path / "cap" / "capacity.json")["complete"] is True
    # A quick capacity step against the real model: Locust's Aggregated row is the chat request rate
    # (metric events once made it 107.7 req/s for 8.98 real chat requests/s).
    for step in r["steps"]:
        assert_locust_counts_only_chat_requests(tmp_path / "cap" / step["dir"])
    assert (tmp_path / "cap" / "junit.xml").is_file()
