"""SGLang's server-side speculative metrics. SGLang cannot run on this CPU-only machine, so the
shapes come from sglang 0.5.23's own definitions: the Prometheus gauge `sglang:spec_accept_length`
(labelled per model / engine) rendered by the real prometheus_client exposition code, and
/server_info's `internal_states[i].avg_spec_accept_length`, served by a local HTTP peer."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import prometheus_client
import pytest

from pipeline.client import OpenAIClient
from validation.spec import parse_prometheus, read_spec_metrics


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


class _SGLangLike(BaseHTTPRequestHandler):
    info: ClassVar[dict] = {}
    metrics = ""

    def do_GET(self) -> None:
        body, ctype = (json.dumps(self.info).encode(), "application/json") if self.path == "/server_info" else (
            (self.metrics.encode(), "text/plain") if self.path == "/metrics" else (b"", ""))
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", ctype or "text/plain")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def peer() -> Iterator[tuple[str, type[_SGLangLike]]]:
    h = type("H", (_SGLangLike,), {})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), h)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", h
    srv.shutdown()


def test_server_info_preferred_then_metrics(peer: tuple[str, type[_SGLangLike]]) -> None:
    url, h = peer
    h.info = {"internal_states": [{"avg_spec_accept_length": 5.1}, {"avg_spec_accept_length": 4.9}]}
    h.metrics = _exposition({"unified": 2.0})
    r = read_spec_metrics(OpenAIClient(url, model="m"), "sglang")
    assert r is not None and r.source == "/server_info" and r.accept_length == pytest.approx(5.0)
    h.info = {"internal_states": [{}]}
    r = read_spec_metrics(OpenAIClient(url, model="m"), "sglang")
    assert r is not None and r.source == "/metrics" and r.accept_length == pytest.approx(2.0)
    assert read_spec_metrics(OpenAIClient(url, model="m"), "llamacpp") is None
