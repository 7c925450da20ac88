"""The gate's SGLang speculative-metric readers on shapes a real sglang 0.5.23 server returned:
/server_info's internal_states and the Prometheus spec lines recorded from a DDTree server on the
H200 (docs/results/ddtree-serve-smoke-tiny-2026-12-01.json, server patched-b16-graph, after its
requests), served back by a local HTTP peer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.client import OpenAIClient
from validation.spec import parse_prometheus, read_spec_metrics

RAW = Path(__file__).resolve().parents[2] / "docs" / "results" / "ddtree-serve-smoke-tiny-2026-12-01.json"


@pytest.fixture(scope="module")
def recorded() -> dict:
    doc = json.loads(RAW.read_text())
    return next(s for s in doc["servers"] if s["name"] == "patched-b16-graph")


def test_recorded_prometheus_lines_parse(recorded: dict) -> None:
    text = "\n".join(recorded["info"]["metrics"]) + "\n"
    r = parse_prometheus(text)
    lines = recorded["info"]["metrics"]
    want = [float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith("sglang:spec_accept_length{")]
    assert r is not None and r.source == "/metrics" and want
    assert r.accept_length == pytest.approx(sum(want) / len(want))


def test_recorded_server_info_gives_the_servers_mean_accept_length(recorded: dict, http_peer) -> None:
    states = recorded["info"]["server_info"]
    http_peer.routes["/server_info"] = (200, "application/json", json.dumps({"internal_states": states}).encode())
    http_peer.routes["/metrics"] = (200, "text/plain", b"")
    r = read_spec_metrics(OpenAIClient(http_peer.url, model="m"), "sglang")
    assert r is not None and r.source == "/server_info"
    assert r.accept_length == pytest.approx(states[0]["avg_spec_accept_length"])
    assert r.accept_length > 1.0  # the oracle requests committed several tokens per step


def test_recorded_meta_info_accept_length_is_tokens_per_verify(recorded: dict) -> None:
    for r in recorded["results"]:
        m = r["meta"]
        assert m["spec_accept_length"] == pytest.approx(m["completion_tokens"] / m["spec_verify_ct"])
