"""Unit tests of the load-test pieces that need no Locust: wire parsing, config, datasets, summary."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sglfleet.loadtests.config import LoadTestConfig, load_loadtest_config
from sglfleet.loadtests.runner import summarize
from sglfleet.loadtests.stream import (
    ERR_CUT,
    ERR_EMPTY,
    ERR_MALFORMED,
    ERR_NOT_STREAMING,
    ERR_TIMEOUT,
    Endpoint,
    StreamResult,
    _Chunked,
    build_request,
    stream_chat,
)
from sglfleet.loadtests.workload import build_requests, read_jsonl
from sglfleet.pipeline.errors import UsageError


def test_chunked_decoder_any_split_equals_whole() -> None:
    payload = [b"data: {\"a\":1}\n\n", b"data: [DONE]\n\n", b"x" * 300]
    wire = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in payload) + b"0\r\n\r\n"
    whole = _Chunked()
    assert whole.feed(wire) == b"".join(payload) and whole.done
    dec = _Chunked()
    out = b"".join(dec.feed(wire[i : i + 1]) for i in range(len(wire)))
    assert out == b"".join(payload) and dec.done
    rng = random.Random(7)
    for _ in range(200):  # random chunk contents and random read boundaries
        parts = [rng.randbytes(rng.randrange(1, 40)) for _ in range(rng.randrange(1, 8))]
        wire = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        dec, got, pos = _Chunked(), b"", 0
        while pos < len(wire):
            step = rng.randrange(1, 12)
            got += dec.feed(wire[pos : pos + step])
            pos += step
        assert got == b"".join(parts) and dec.done


def test_endpoint_parse() -> None:
    ep = Endpoint.parse("http://127.0.0.1:30000/v1/")
    assert (ep.host, ep.port, ep.path) == ("127.0.0.1", 30000, "/v1/chat/completions")
    assert Endpoint.parse("https://example.test").port == 443
    with pytest.raises(UsageError):
        Endpoint.parse("127.0.0.1:30000")


def test_request_bytes_close_connection_and_carry_body() -> None:
    ep = Endpoint.parse("http://h:1")
    raw = build_request(ep, {"stream": True}, api_key="k")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Connection: close" in head and b"Authorization: Bearer k" in head
    assert json.loads(body) == {"stream": True} and f"Content-Length: {len(body)}".encode() in head


def test_tpot_and_output_tokens() -> None:
    r = StreamResult(ok=True, ttft=0.1, e2e=1.1, chunks=5, usage_tokens=11)
    assert r.output_tokens == 11 and r.tpot == pytest.approx(0.1)
    assert StreamResult(ok=True, ttft=0.1, e2e=1.1, chunks=5).output_tokens == 5
    assert StreamResult(ok=True, ttft=0.1, e2e=0.1, chunks=1).tpot is None


@pytest.mark.parametrize("override, key", [
    ({"slo": {"ttft_p95_ms": -5}}, "slo.ttft_p95_ms"),
    ({"slo": {"itl_p95_ms": 0}}, "slo.itl_p95_ms"),
    ({"slo": {"max_error_rate": 1.5}}, "slo.max_error_rate"),
    ({"slo": {"ttft_p95_ms": float("nan")}}, "slo.ttft_p95_ms"),
    ({"capacity": {"warmup_s": 30, "step_duration_s": 10}}, "warmup_s"),
    ({"capacity": {"start": 64, "max_load": 8}}, "start"),
    ({"duration_s": 0}, "duration_s"),
    ({"users": 3, "bogus": 1}, "bogus"),
    ({"host": "localhost:8000"}, "host"),
])
def test_nonsense_config_is_a_usage_error(override: dict, key: str) -> None:
    with pytest.raises(UsageError, match=key):
        load_loadtest_config(None, override)


def test_yaml_section_and_defaults(tmp_path: Path) -> None:
    f = tmp_path / "deploy.yaml"
    f.write_text("embedded: {port: 1}\nloadtest:\n  users: 7\n  slo: {ttft_p95_ms: 500}\n")
    cfg = load_loadtest_config(f, {"host": "http://127.0.0.1:9"})
    assert cfg.users == 7 and cfg.slo.ttft_p95_ms == 500 and cfg.slo.itl_p95_ms == LoadTestConfig().slo.itl_p95_ms
    assert LoadTestConfig().host is None  # no default target
    assert LoadTestConfig().max_requests > 0 and LoadTestConfig().duration_s > 0  # always bounded


def test_jsonl_dataset(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "hi"}\n\n{"messages": [{"role": "user", "content": "yo"}], "max_tokens": 7}\n')
    assert read_jsonl(good, 5) == [([{"role": "user", "content": "hi"}], 5), ([{"role": "user", "content": "yo"}], 7)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": "broken"\n')
    with pytest.raises(UsageError, match=r"bad.jsonl:2: not valid JSON"):
        read_jsonl(bad, 5)
    for text, msg in (('{"text": 1}\n', "needs a non-empty"), ('[1]\n', "JSON object"), ("", "no requests"),
                      ('{"prompt": "a", "max_tokens": -1}\n', "max_tokens")):
        bad.write_text(text)
        with pytest.raises(UsageError, match=msg):
            read_jsonl(bad, 5)


def test_synthetic_requests_ask_for_exact_lengths() -> None:
    cfg = load_loadtest_config(None, {"host": "http://h:1", "workload": {"kind": "synthetic", "input_tokens": 100,
                                                                         "output_tokens": 33}})
    specs = build_requests(cfg, "m", words_per_token=1.0, overhead_tokens=10, pool=4)
    bodies = [json.loads(s.raw.partition(b"\r\n\r\n")[2]) for s in specs]
    assert len({b["messages"][0]["content"] for b in bodies}) == 4  # distinct prompts
    for b, s in zip(bodies, specs, strict=True):
        assert b["max_tokens"] == 33 and b["min_tokens"] == 33 and b["ignore_eos"] is True and b["stream"] is True
        assert len(b["messages"][0]["content"].split()) == 90 + 2  # words + "Request N:"
        assert (s.asked_input, s.asked_output, s.exact_output) == (100, 33, True)


def _rec(t: float, ok: bool = True, ttft: float = 10, itl: tuple = (5, 5), n: int = 3, **kw: object) -> dict:
    r = {"t": t, "ok": ok, "e2e": ttft + sum(itl) if ok else 50.0, "n": n if ok else 0, "src": "usage",
         "chunks": n, "aout": 3, "exact": False}
    r.update({"ttft": ttft, "itl": list(itl)} if ok else {"err": "http_503"})
    r.update(kw)
    return r


def test_summary_goodput_errors_warmup_and_lengths() -> None:
    cfg = load_loadtest_config(None, {"host": "http://h:1", "warmup_s": 1, "duration_s": 10,
                                      "slo": {"ttft_p95_ms": 100, "itl_p95_ms": 20, "max_error_rate": 0.2}})
    recs = [
        _rec(1000.0, ttft=999),                      # warm-up: left out
        _rec(1001.0), _rec(1002.0), _rec(1003.0, ttft=500),  # one misses the TTFT objective
        _rec(1004.0, itl=(5, 90)),                   # misses ITL objective
        _rec(1005.0, ok=False),                      # an error
        _rec(1006.0, n=9),                           # received more than asked: a length mismatch
        _rec(1009.9, ttft=10, itl=(5, 5)),           # still running at stop (ends after 1010.0): left out
    ]
    recs[-1]["e2e"] = 500.0
    # killed by Locust mid-request at the stop (locustfile): counted apart, neither failed nor dropped
    recs.append({"t": 1009.0, "ok": False, "running_at_stop": True, "e2e": 1000.0, "n": 0, "aout": 8, "exact": True})
    s = summarize(recs, cfg, stop_at=1010.0)
    assert s["requests"] == {"total": 6, "ok": 5, "failed": 1, "errors": {"http_503": 1}, "warmup_excluded": 1,
                             "after_stop_excluded": 1, "in_flight_at_stop": 1}
    assert s["error_rate"] == pytest.approx(1 / 6, abs=1e-3)
    assert s["throughput"]["good_requests"] == 3
    assert s["itl_ms"]["count"] == 10 and s["itl_ms"]["max"] == 90
    assert s["lengths"]["output_mismatches"] == 1
    assert s["tpot_ms"]["count"] == 5
    assert s["slo"]["checks"]["ttft_p95"]["ok"] is False and s["slo"]["met"] is False


def test_stream_error_classes_without_locust(sim) -> None:
    srv = sim("--mode", "mixed", "--tokens", "6", "--itl-ms", "1")
    ep = Endpoint.parse(srv.url)
    raw = build_request(ep, {"model": "sim", "messages": [], "max_tokens": 6, "stream": True,
                             "stream_options": {"include_usage": True}})
    got = [stream_chat(ep, raw, timeout_s=0.5) for _ in range(6)]  # ok, 503, cut, malformed, empty, stall
    assert got[0].ok and got[0].output_tokens == 6 and got[0].usage_tokens == 6 and len(got[0].itl) == 5
    assert [g.error for g in got[1:]] == ["http_503", ERR_CUT, ERR_MALFORMED, ERR_EMPTY, ERR_TIMEOUT]
    assert not any(g.ok for g in got[1:])
    js = sim("--mode", "json")
    assert stream_chat(Endpoint.parse(js.url), raw).error == ERR_NOT_STREAMING


def test_latency_registry_percentiles_and_worker_merge() -> None:
    from sglfleet.loadtests.latency import MetricRegistry, bucket

    assert bucket(0.01234) == 0.0123 and bucket(1234.5) == 1230 and bucket(0) == 0
    rng = random.Random(3)
    values = [rng.uniform(1, 50) for _ in range(2000)]
    whole, w1, w2 = MetricRegistry(), MetricRegistry(), MetricRegistry()
    whole.add_many("ITL", values)
    w1.add_many("ITL", values[:700])
    w2.add_many("ITL", values[700:])
    master = MetricRegistry()
    for w in (w1, w2):  # what report_to_master sends and worker_report merges
        master.merge(json.loads(json.dumps(w.serialize())))
    a, b = whole.get("ITL"), master.get("ITL")
    assert (a.count, a.min, a.max) == (b.count, b.min, b.max) == (2000, min(values), max(values))
    assert b.mean == pytest.approx(sum(values) / 2000)
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.95, 0.99):
        assert a.percentile(q) == b.percentile(q)
        assert b.percentile(q) == pytest.approx(ordered[int(q * 2000) - 1], rel=0.01)
    assert master.get("TTFT").count == 0 and master.get("TTFT").row()["p95"] is None
    assert [r["name"] for r in master.rows()][:3] == ["TTFT", "ITL", "TPOT"]


def test_metric_definitions_are_shared() -> None:
    from sglfleet.pipeline import metrics
    from sglfleet.pipeline.client import ChatResult

    r = StreamResult(ok=True, ttft=0.1, e2e=1.1, chunks=11)
    assert r.tpot == pytest.approx(metrics.tpot(1.1, 0.1, 11)) == pytest.approx(0.1)
    assert r.decode_tokens_per_s == pytest.approx(10.0) and r.tokens_per_s == pytest.approx(10.0)
    assert ChatResult("x", "stop", 1, 11, latency_s=1.1, ttft_s=0.1).tokens_per_s == pytest.approx(10.0)
    assert metrics.inter_token_gaps([0.0, 0.5, 0.75]) == [0.5, 0.25]
    assert metrics.decode_tokens_per_s(1.0, 1.0, 5) is None and metrics.tpot(1.0, None, 5) is None


def test_explicit_flags_win_over_the_quick_preset() -> None:
    """`capacity --quick --max-tokens 64` asks for 64 tokens: the H200 run of 2026-12-01 asked for 64 and
    got the preset's 8 (docs/results/loadtest-sglang-h200-2026-12-01.json.xz, output_asked_mean 8.0)."""
    from sglfleet.loadtests.__main__ import build_parser, capacity_config
    from sglfleet.loadtests.capacity import QUICK

    args = build_parser().parse_args(["capacity", "--host", "http://127.0.0.1:9", "--quick", "--max-tokens", "64",
                                      "--output-tokens", "64", "--max-load", "64", "--slo-itl-ms", "40"])
    cfg = capacity_config(args)
    assert (cfg.workload.max_tokens, cfg.workload.output_tokens) == (64, 64)
    assert cfg.capacity.max_load == 64 and cfg.slo.itl_p95_ms == 40
    # what the flags leave alone comes from the preset
    assert cfg.workload.input_tokens == QUICK["workload"]["input_tokens"]
    assert cfg.capacity.step_duration_s == QUICK["capacity"]["step_duration_s"]
    plain = capacity_config(build_parser().parse_args(["capacity", "--host", "http://127.0.0.1:9", "--quick"]))
    assert plain.workload.max_tokens == QUICK["workload"]["max_tokens"]
