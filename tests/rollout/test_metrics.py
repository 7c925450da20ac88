"""Observability (rollout/metrics.py): servers' and the router's Prometheus metrics read with prometheus_client's
parser under one set of names whichever engine it is (SGLang or llama.cpp), sampled while a stage runs; the
rollout's verdicts written as a node-exporter textfile; the Grafana dashboard shipped with the router role,
whose every panel expression must name a metric the product exports.

The recorded scrapes in fixtures/metrics/ are this machine's: the embedded llama.cpp server of the CPU image and
sglang-router 0.3.2 during `make demo`. SGLang's names come from its 0.5.23 source (no sglang server runs
here): fixtures/metrics/sglang-0.5.23-families.txt says so."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from sglfleet.rollout import ANSIBLE_DIR, metrics
from sglfleet.rollout.metrics import Sampler, normalise, parse

FIX = Path(__file__).parent / "fixtures" / "metrics"
DASHBOARD = ANSIBLE_DIR / "roles" / "router" / "files" / "grafana-dashboard.json"

SGLANG_TEXT = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0"} 3.0
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="1"} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0"} 4.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",engine_type="unified",tp_rank="0"} 0.42
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m",engine_type="unified",tp_rank="0"} 3.25
# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_bucket{model_name="m",le="0.1"} 3.0
sglang:queue_time_seconds_bucket{model_name="m",le="+Inf"} 4.0
sglang:queue_time_seconds_sum{model_name="m"} 0.6
sglang:queue_time_seconds_count{model_name="m"} 4.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 1000.0
"""


def test_sglang_and_llamacpp_names_read_under_one_set_of_names():
    s = normalise("http://s/metrics", parse(SGLANG_TEXT))
    assert s.engine == "sglang"
    assert s.values["running"] == 5 and s.values["waiting"] == 4 and s.values["kv_cache_usage"] == 0.42
    assert s.values["accept_length"] == 3.25 and s.values["queue_time_s_sum"] == 0.6
    assert s.sources["running"] == "sglang:num_running_reqs"
    ll = normalise("http://l/metrics", parse((FIX / "llamacpp-embedded.txt").read_text()))
    assert ll.engine == "llamacpp" and ll.sources["running"] == "llamacpp:requests_processing"
    assert {"running", "waiting", "generation_tokens", "prompt_tokens"} <= set(ll.values)
    assert "kv_cache_usage" not in ll.values  # this llama.cpp build does not export it: absent, not 0
    with_spec = (FIX / "llamacpp-embedded.txt").read_text().replace(
        "llamacpp:spec_decode_num_drafts_total 0", "llamacpp:spec_decode_num_drafts_total 10").replace(
        "llamacpp:spec_decode_num_accepted_tokens_total 0", "llamacpp:spec_decode_num_accepted_tokens_total 25")
    assert normalise("l", parse(with_spec)).values["accept_length"] == 3.5
    rt = normalise("http://r/metrics", parse((FIX / "router-0.3.2.txt").read_text()))
    assert rt.engine == "router" and rt.workers and all("healthy" in w for w in rt.workers.values())
    assert sum(w.get("outcomes_success", 0) for w in rt.workers.values()) == 16  # the recorded scrape: 8 + 8
    assert "requests" in rt.values and "upstream_5xx" in rt.values


@pytest.mark.integration
def test_sampler_sees_requests_in_flight_on_a_real_server():
    from testbed.routerworker import RouterWorker

    with RouterWorker(_port(), delay_s=1.0, name="w") as w:
        def call() -> None:
            httpx.post(w.url + "/v1/chat/completions", timeout=30,
                       json={"model": "w", "messages": [{"role": "user", "content": "hi"}]})

        with Sampler({"w": w.url, "gone": "http://127.0.0.1:9"}, period_s=0.2) as s:
            ts = [threading.Thread(target=call) for _ in range(3)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        out = s.summary()
    assert out["w"]["ok"] and out["w"]["engine"] == "sglang" and out["w"]["peak"]["running"] >= 2, out
    assert not out["gone"]["ok"] and "ConnectError" in out["gone"]["error"]
    line = metrics.summary_line(out)
    assert "w (sglang): peak running" in line and "gone: metrics unreadable" in line


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RECORD = {"image": "r/x:rc2", "result": "smoke-failed", "exit_code": 1, "wall_s": 321.5,
          "steps": [{"kind": "gate", "hosts": ["h1"], "ok": True, "seconds": 30.0, "data": {}},
                    {"kind": "loadtest", "hosts": ["h1"], "ok": True, "seconds": 12.0, "data": {"capacity": 2.0}},
                    {"kind": "smoke-gate", "hosts": ["h2"], "ok": False, "seconds": 4.0, "data": {}}],
          "traffic": [{"stage": "deploy pcie h1", "sent": 20, "ok": 20, "failed": 0, "errors": {}}],
          "out_of_router": [{"host": "h1", "seconds": 78.1, "spans": 1}], "rolled_back_hosts": ["h2", "h1"],
          "retries": [{"what": "registry"}, {"what": "registry"}, {"what": "ssh"}]}


def test_verdicts_exported_as_a_textfile_prometheus_can_read(tmp_path):
    path = tmp_path / "textfile" / "sglang_rollout.prom"
    names = metrics.export(RECORD, path)
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    assert set(names) == set(fams) and all(n.startswith("sglang_fleet_rollout_") for n in names)

    def val(name: str, **labels: str) -> float:
        return next(s.value for s in fams[name].samples if all(s.labels.get(k) == v for k, v in labels.items()))

    assert val("sglang_fleet_rollout_success", result="smoke-failed", image="r/x:rc2") == 0
    assert val("sglang_fleet_rollout_gate_pass", host="h2", gate="smoke") == 0
    assert val("sglang_fleet_rollout_gate_pass", host="h1", gate="full") == 1
    assert val("sglang_fleet_rollout_host_out_of_router_seconds", host="h1") == 78.1
    assert val("sglang_fleet_rollout_retries", what="registry") == 2
    assert val("sglang_fleet_rollout_rolled_back_hosts") == 2
    assert val("sglang_fleet_rollout_loadtest_capacity_users", stage="loadtest h1") == 2.0
    assert not list(path.parent.glob("*.tmp*"))  # written atomically (write_to_textfile renames)


# ------------------------------------------------------------------------------------------ the dashboard
PROMQL_WORDS = {"sum", "rate", "irate", "increase", "histogram_quantile", "by", "without", "avg", "max", "min",
                "count", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers outside label matchers, ranges, by()/without()
    lists and strings, that are neither functions (followed by '(') nor PromQL words nor numbers."""
    e = re.sub(r'"[^"]*"', "", expr)
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group(0) in PROMQL_WORDS:
            continue
        names.add(m.group(0))
    return names


def exported_names(tmp_path: Path) -> dict[str, set[str]]:
    """Sample names each part of the product exports."""
    from prometheus_client.parser import text_string_to_metric_families

    def samples(text: str) -> set[str]:
        return {s.name for f in text_string_to_metric_families(text) for s in f.samples}

    metrics.export(RECORD, tmp_path / "r.prom")
    sg: set[str] = set()
    for line in (FIX / "sglang-0.5.23-families.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, kind = line.split()
            sg |= ({f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind in ("histogram", "summary")
                   else {name})
    return {"rollout": samples((tmp_path / "r.prom").read_text()),
            "router": samples((FIX / "router-0.3.2.txt").read_text()),
            "llamacpp": samples((FIX / "llamacpp-embedded.txt").read_text()), "sglang": sg}


def test_metric_names_of_promql():
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(smg_x_bucket{a="b"}[5m])))') == {"smg_x_bucket"}
    assert metric_names("1 + rate(a:b_total[5m]) / rate(c_total[5m])") == {"a:b_total", "c_total"}


def test_dashboard_panels_name_only_metrics_the_product_exports(tmp_path):
    dash = json.loads(DASHBOARD.read_text())
    known = exported_names(tmp_path)
    every = set().union(*known.values())
    seen: dict[str, set[str]] = {k: set() for k in known}
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 15 and dash["uid"] == "sglang-fleet-rollout"
    for p in panels:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            names = metric_names(t["expr"])
            assert names, (p["title"], t["expr"])
            unknown = names - every
            assert not unknown, f"panel {p['title']!r}: {sorted(unknown)} exported by nothing of the product"
            for part, ns in known.items():
                seen[part] |= names & ns
    # every exporter is on the dashboard
    assert all(seen.values()), {k: sorted(v) for k, v in seen.items()}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_sampler_keeps_counters_growth_over_the_stage(monkeypatch):
    q = 'sglang:queue_time_seconds_{}{{model_name="m"}} {}'
    later = (SGLANG_TEXT.replace("1000.0", "1500.0").replace(q.format("sum", "0.6"), q.format("sum", "1.6"))
             .replace(q.format("count", "4.0"), q.format("count", "14.0")))
    texts = iter([SGLANG_TEXT, later])
    last = [SGLANG_TEXT]

    def fake_scrape(url: str, timeout_s: float = 5.0) -> metrics.Snapshot:
        last[0] = next(texts, last[0])
        return normalise(url, parse(last[0]))

    monkeypatch.setattr(metrics, "scrape", fake_scrape)
    with Sampler({"s": "http://s"}, period_s=10) as s:
        time.sleep(0.05)
    out = s.summary()["s"]
    assert out["growth"]["generation_tokens"] == 500 and out["queue_time_mean_s"] == 0.1
    assert out["peak"] == {"running": 5.0, "waiting": 4.0, "kv_cache_usage": 0.42} and out["accept_length"] == 3.25
