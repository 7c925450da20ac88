"""The gate's SGLang speculative-metric readers on shapes a real sglang 0.5.23 server returned:
/server_info's internal_states and the Prometheus spec lines recorded from a DDTree server on the
H200 (docs/results/ddtree-serve-smoke-tiny-2026-12-01.json.xz, server patched-b16-graph, after its
requests), served back by a local HTTP peer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglfleet.pipeline.client import OpenAIClient
from sglfleet.validation.spec import parse_prometheus, read_spec_metrics

RAW = Path(__file__).resolve().parents[2] / "docs" / "results" / "ddtree-serve-smoke-tiny-2026-12-01.json.xz"


@pytest.fixture(scope="module")
def recorded() -> dict:
    from bench.history import raw_text  # the project's reader of a committed raw, gzip or xz

    doc = json.loads(raw_text(RAW))
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


def test_target_only_server_reads_as_not_speculative(recorded: dict, http_peer) -> None:
    """sglang 0.5.23 exports sglang:spec_accept_length on every server, 0.0 until a verify step ran
    (metrics_collector.py: the stats field defaults to 0.0). A target-only server declares
    speculative_algorithm null in /server_info: no reading, so record-baseline does not take it for a
    speculative deployment (found on the H200, 2026-12-03: the baseline was refused)."""
    states = [{**st, "speculative_algorithm": None} for st in recorded["info"]["server_info"]]
    for st in states:
        st.pop("avg_spec_accept_length", None)
    gauge0 = [ln.rsplit(" ", 1)[0] + " 0.0" for ln in recorded["info"]["metrics"]
              if ln.startswith("sglang:spec_accept_length{")]
    http_peer.routes["/server_info"] = (200, "application/json", json.dumps({"internal_states": states}).encode())
    http_peer.routes["/metrics"] = (200, "text/plain", ("\n".join(gauge0) + "\n").encode())
    assert read_spec_metrics(OpenAIClient(http_peer.url, model="m"), "sglang") is None
    # the speculative server's own states still give its reading
    spec_states = recorded["info"]["server_info"]
    assert spec_states[0].get("speculative_algorithm")
    http_peer.routes["/server_info"] = (200, "application/json", json.dumps({"internal_states": spec_states}).encode())
    assert read_spec_metrics(OpenAIClient(http_peer.url, model="m"), "sglang") is not None
    # a gauge at its default is no reading on its own either
    assert parse_prometheus("\n".join(gauge0) + "\n") is None
