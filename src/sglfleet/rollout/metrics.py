"""Prometheus metrics, both ways: read the servers' and the router's `/metrics` (prometheus_client's text
parser) into the gate and load-test stages' reports, and write the rollout's verdicts in Prometheus text
format (prometheus_client's registry + write_to_textfile: a file for node-exporter's textfile collector).

SGLang (`--enable-metrics`) and llama.cpp (the embedded CPU engine) name the same things differently:

    what                       SGLang 0.5.23                      llama.cpp server
    requests running           sglang:num_running_reqs            llamacpp:requests_processing
    requests waiting           sglang:num_queue_reqs              llamacpp:requests_deferred
    KV-cache usage (0..1)      sglang:token_usage                 llamacpp:kv_cache_usage_ratio (older builds)
    accept length              sglang:spec_accept_length          1 + accepted / drafts (spec_decode_* counters)
    queue time                 sglang:queue_time_seconds (hist.)  -
    prompt / generated tokens  sglang:prompt_tokens_total, ...    llamacpp:prompt_tokens_total, tokens_predicted_total

sglang-router (0.3.2) exports smg_* families: per-worker health and circuit-breaker state, requests and their
durations, upstream responses by status.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# normalised name -> (SGLang metric, llama.cpp metric); a gauge is read as is, summed over its label sets.
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("sglang:num_running_reqs", "llamacpp:requests_processing"),
    "waiting": ("sglang:num_queue_reqs", "llamacpp:requests_deferred"),
    "kv_cache_usage": ("sglang:token_usage", "llamacpp:kv_cache_usage_ratio"),
    "accept_length": ("sglang:spec_accept_length",),
    "gen_throughput_tok_s": ("sglang:gen_throughput", "llamacpp:predicted_tokens_seconds"),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": ("sglang:prompt_tokens_total", "llamacpp:prompt_tokens_total"),
    "generation_tokens": ("sglang:generation_tokens_total", "llamacpp:tokens_predicted_total"),
    "requests": ("sglang:num_requests_total",),
    "spec_drafts": ("llamacpp:spec_decode_num_drafts_total",),
    "spec_accepted": ("llamacpp:spec_decode_num_accepted_tokens_total",),
    "queue_time_s_sum": ("sglang:queue_time_seconds_sum",),
    "queue_time_s_count": ("sglang:queue_time_seconds_count",),
}
ROUTER_PREFIX = "smg_"


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text -> {sample name: [(labels, value), ...]} through prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _total(samples: dict[str, list[tuple[dict[str, str], float]]], names: Iterable[str]) -> tuple[str, float] | None:
    for n in names:
        if n in samples:
            return n, sum(v for _, v in samples[n])
    return None


@dataclass
class Snapshot:
    url: str
    ok: bool
    engine: str  # sglang | llamacpp | router | unknown
    values: dict[str, float] = field(default_factory=dict)  # normalised names
    sources: dict[str, str] = field(default_factory=dict)  # normalised name -> metric it came from
    error: str | None = None
    workers: dict[str, dict[str, float]] = field(default_factory=dict)  # router: per-worker gauges

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"url": self.url, "ok": self.ok, "engine": self.engine, "values": self.values,
                             "sources": self.sources}
        if self.error:
            d["error"] = self.error
        if self.workers:
            d["workers"] = self.workers
        return d


def normalise(url: str, samples: dict[str, list[tuple[dict[str, str], float]]]) -> Snapshot:
    """The server's (or the router's) metrics under the names of GAUGES / COUNTERS, whichever engine it is."""
    names = set(samples)
    if any(n.startswith("sglang:") for n in names):
        engine = "sglang"
    elif any(n.startswith("llamacpp:") for n in names):
        engine = "llamacpp"
    elif any(n.startswith(ROUTER_PREFIX) for n in names):
        engine = "router"
    else:
        engine = "unknown"
    snap = Snapshot(url, True, engine)
    for key, cands in (*GAUGES.items(), *COUNTERS.items()):
        got = _total(samples, cands)
        if got is not None:
            snap.sources[key], snap.values[key] = got
    if "accept_length" not in snap.values and snap.values.get("spec_drafts"):  # llama.cpp: from its counters
        snap.values["accept_length"] = 1.0 + snap.values.get("spec_accepted", 0.0) / snap.values["spec_drafts"]
        snap.sources["accept_length"] = "1 + llamacpp:spec_decode_num_accepted_tokens_total / drafts_total"
    if engine == "router":
        for name, key in (("smg_worker_health", "healthy"), ("smg_worker_cb_state", "circuit_state"),
                          ("smg_worker_requests_active", "active"),
                          ("smg_worker_cb_consecutive_failures", "consecutive_failures")):
            for labels, v in samples.get(name, []):
                w = labels.get("worker") or labels.get("url") or labels.get("worker_url")
                if w:
                    snap.workers.setdefault(w, {})[key] = v
        for labels, v in samples.get("smg_worker_cb_outcomes_total", []):  # per-worker request outcomes
            w = labels.get("worker")
            if w:
                key = f"outcomes_{labels.get('outcome') or 'unknown'}"
                snap.workers.setdefault(w, {})[key] = snap.workers.get(w, {}).get(key, 0.0) + v
        for name, key in (("smg_router_requests_total", "requests"), ("smg_http_requests_total", "http_requests")):
            got = _total(samples, (name,))
            if got is not None:
                snap.sources[key], snap.values[key] = got
        errs = [v for labels, v in samples.get("smg_router_upstream_responses_total", [])
                if str(labels.get("status_code") or labels.get("status") or "").startswith("5")]
        snap.values["upstream_5xx"] = sum(errs)
        snap.sources["upstream_5xx"] = "smg_router_upstream_responses_total{status 5xx}"
    return snap


def scrape(url: str, timeout_s: float = 5.0) -> Snapshot:
    """GET url (a /metrics URL, or a server base URL: /metrics is appended); a failure is a Snapshot, not raised."""
    target = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    try:
        r = httpx.get(target, timeout=timeout_s)
        if r.status_code != 200:
            return Snapshot(target, False, "unknown", error=f"HTTP {r.status_code}")
        return normalise(target, parse(r.text))
    except (httpx.HTTPError, ValueError) as exc:
        return Snapshot(target, False, "unknown", error=f"{type(exc).__name__}: {exc}"[:200])


class Sampler:
    """Scrape some /metrics URLs every `period_s` while a stage runs: the peaks of the gauges (running, waiting,
    KV-cache usage) and the counters' growth over the stage. `with Sampler({...}) as s: ...; s.summary()`."""

    def __init__(self, urls: dict[str, str], period_s: float = 1.0) -> None:
        self.urls, self.period_s = urls, period_s
        self.first: dict[str, Snapshot] = {}
        self.last: dict[str, Snapshot] = {}
        self.peak: dict[str, dict[str, float]] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-sampler", daemon=True)

    def _once(self) -> None:
        for label, url in self.urls.items():
            snap = scrape(url)
            if not snap.ok:
                self.last.setdefault(label, snap)
                continue
            self.first.setdefault(label, snap)
            self.last[label] = snap
            pk = self.peak.setdefault(label, {})
            for k in ("running", "waiting", "kv_cache_usage"):
                if k in snap.values:
                    pk[k] = max(pk.get(k, 0.0), snap.values[k])
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._once()
            self._stop.wait(self.period_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._once()  # the counters at the end of the stage

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, url in self.urls.items():
            last = self.last.get(label)
            first = self.first.get(label)
            if last is None or not last.ok or first is None:
                out[label] = {"url": url, "ok": False, "error": last.error if last else "never scraped"}
                continue
            growth = {k: round(last.values[k] - first.values.get(k, 0.0), 3) for k in COUNTERS
                      if k in last.values}
            for k in ("requests", "http_requests", "upstream_5xx"):
                if k in last.values:
                    growth[k] = round(last.values[k] - first.values.get(k, 0.0), 3)
            d = {"url": last.url, "ok": True, "engine": last.engine, "samples": self.samples,
                 "peak": self.peak.get(label, {}), "growth": growth,
                 "last": {k: v for k, v in last.values.items() if k in GAUGES}, "sources": last.sources}
            q_n, q_s = growth.get("queue_time_s_count"), growth.get("queue_time_s_sum")
            if q_n and q_s is not None:
                d["queue_time_mean_s"] = round(q_s / q_n, 4)
            if "accept_length" in last.values:
                d["accept_length"] = round(last.values["accept_length"], 3)
            if last.workers:
                d["workers"] = last.workers
            out[label] = d
        return out


def summary_line(summary: dict[str, Any]) -> str:
    """One line for a stage: peak running / waiting and KV usage per server, the router's 5xx count."""
    parts = []
    for label, d in summary.items():
        if not d.get("ok"):
            parts.append(f"{label}: metrics unreadable ({d.get('error')})")
            continue
        pk = d.get("peak", {})
        bits = [f"peak running {pk['running']:g}" if "running" in pk else "",
                f"waiting {pk['waiting']:g}" if "waiting" in pk else "",
                f"KV {pk['kv_cache_usage']:.0%}" if "kv_cache_usage" in pk else "",
                f"accept length {d['accept_length']:.2f}" if "accept_length" in d else "",
                f"queue {d['queue_time_mean_s'] * 1000:.0f} ms" if "queue_time_mean_s" in d else "",
                f"upstream 5xx {d['growth'].get('upstream_5xx', 0):g}" if d.get("engine") == "router" else ""]
        parts.append(f"{label} ({d['engine']}): " + ", ".join(b for b in bits if b))
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------- the verdicts
# The names the rollout exports (the Grafana dashboard's panels are checked against them).
PREFIX = "sglang_fleet_rollout"


def export(record: dict[str, Any], path: Path) -> list[str]:
    """The rollout's verdicts in Prometheus text format at `path` (atomically, for node-exporter's textfile
    collector): result, per-stage outcome, gates, client failures, time out of the router, retries. Returns
    the metric family names written."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    reg = CollectorRegistry()
    image = str(record.get("image") or "")
    result = str(record.get("result") or "unknown")
    g = Gauge(f"{PREFIX}_success", "1 when the last rollout promoted or deployed its image, else 0",
              ["image", "result"], registry=reg)
    g.labels(image, result).set(1 if record.get("exit_code", 1) == 0 else 0)
    Gauge(f"{PREFIX}_timestamp_seconds", "when the last rollout ended (unix time)", registry=reg).set(
        float(record.get("ended_at") or time.time()))
    Gauge(f"{PREFIX}_duration_seconds", "wall time of the last rollout", registry=reg).set(
        float(record.get("wall_s") or 0.0))
    st = Gauge(f"{PREFIX}_stage_ok", "1 when the stage passed, 0 when it failed", ["stage", "hosts"], registry=reg)
    sec = Gauge(f"{PREFIX}_stage_seconds", "wall time of the stage", ["stage", "hosts"], registry=reg)
    for s in record.get("steps") or []:
        hosts = ",".join(s.get("hosts") or ())
        st.labels(s["kind"], hosts).set(1 if s.get("ok") else 0)
        sec.labels(s["kind"], hosts).set(float(s.get("seconds") or 0.0))
    gate = Gauge(f"{PREFIX}_gate_pass", "1 when the host's gate (full or smoke) passed", ["host", "gate"],
                 registry=reg)
    for s in record.get("steps") or []:
        if s["kind"] in ("gate", "smoke-gate") and s.get("hosts"):
            gate.labels(s["hosts"][0], "full" if s["kind"] == "gate" else "smoke").set(1 if s.get("ok") else 0)
    sent = Gauge(f"{PREFIX}_client_requests", "client requests sent through the router during the stage",
                 ["stage"], registry=reg)
    failed = Gauge(f"{PREFIX}_client_requests_failed", "client requests through the router that failed",
                   ["stage"], registry=reg)
    for t in record.get("traffic") or []:
        sent.labels(t["stage"]).set(t["sent"])
        failed.labels(t["stage"]).set(t["failed"])
    out = Gauge(f"{PREFIX}_host_out_of_router_seconds", "seconds the host was out of the router", ["host"],
                registry=reg)
    for o in record.get("out_of_router") or []:
        out.labels(o["host"]).set(float(o["seconds"]))
    rb = Gauge(f"{PREFIX}_rolled_back_hosts", "hosts the rollout put back on their previous version", registry=reg)
    rb.set(len(record.get("rolled_back_hosts") or []))
    rt = Gauge(f"{PREFIX}_retries", "retries of transient failures (registry HTTP, SSH) during the rollout",
               ["what"], registry=reg)
    counts: dict[str, int] = {}
    for r in record.get("retries") or []:
        counts[r["what"]] = counts.get(r["what"], 0) + 1
    for what, n in counts.items():
        rt.labels(what).set(n)
    cap = Gauge(f"{PREFIX}_loadtest_capacity_users", "users meeting the SLOs in the stage's load test", ["stage"],
                registry=reg)
    for s in record.get("steps") or []:
        if s["kind"] in ("loadtest", "fleet-loadtest") and s.get("data", {}).get("capacity") is not None:
            cap.labels(f"{s['kind']} {','.join(s.get('hosts') or ())}").set(float(s["data"]["capacity"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), reg)
    return sorted({m.name for m in reg.collect()})
