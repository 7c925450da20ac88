"""SGLang's server-side speculative metrics. SGLang cannot run on this CPU-only machine, so the
shapes come from sglang 0.5.23's own definitions: the Prometheus gauge `sglang:spec_accept_length`
(labelled per model / engine) rendered by the real prometheus_client exposition code, and
/server_info's `internal_states[i].avg_spec_accept_length`, served by a local HTTP peer."""

from __future__ import annotations

import json

import prometheus_client
import pytest

from sglfleet.pipeline.client import OpenAIClient
from sglfleet.validation.spec import parse_prometheus, read_spec_metrics


def _exposition(values: dict[str, float]) -> str:
    reg = prometheus_client.CollectorRegistry()
    g = prometheus_client.Gauge("sglang:spec_accept_length", "Mean acceptance length", ["model_name", "engine_type"],
                                registry=reg)
    r = prometheus_client.Gauge("sglang:spec_accept_rate", "acceptance rate", ["model_name", "engine_type"],
                                registry=reg)
    for engine, v in values.items():
        g.labels("kimi-k2.6", engine).set(v)
        r.labels("kimi-k2.6", engine).set(v / 8)
    return prometheus_client.generate_latest(reg).decode()


def test_parse_prometheus_mean_over_label_sets() -> None:
    reading = parse_prometheus(_exposition({"unified": 4.0, "other": 5.0}) + "sglang:num_running_reqs 3.0\n")
    assert reading is not None and reading.accept_length == pytest.approx(4.5)
    assert reading.accept_rate == pytest.approx(4.5 / 8)


def test_parse_prometheus_absent() -> None:
    assert parse_prometheus("llamacpp:tokens_predicted_total 60\n") is None


def test_server_info_preferred_then_metrics(http_peer) -> None:
    url = http_peer.url

    def serve(info: dict, metrics: str) -> None:
        http_peer.routes["/server_info"] = (200, "application/json", json.dumps(info).encode())
        http_peer.routes["/metrics"] = (200, "text/plain", metrics.encode())

    serve({"internal_states": [{"avg_spec_accept_length": 5.1}, {"avg_spec_accept_length": 4.9}]},
          _exposition({"unified": 2.0}))
    r = read_spec_metrics(OpenAIClient(url, model="m"), "sglang")
    assert r is not None and r.source == "/server_info" and r.accept_length == pytest.approx(5.0)
    serve({"internal_states": [{}]}, _exposition({"unified": 2.0}))
    r = read_spec_metrics(OpenAIClient(url, model="m"), "sglang")
    assert r is not None and r.source == "/metrics" and r.accept_length == pytest.approx(2.0)
    assert read_spec_metrics(OpenAIClient(url, model="m"), "llamacpp") is None
