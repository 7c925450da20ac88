"""The fleet's front door: a typed client for sglang-router's worker API, and drain / add-back with bounds.

What sglang-router 0.3.2 does (tried here against real workers, docs/rollout.md "Router"):
- `GET /workers` lists the workers it routes to: id, url, is_healthy, load;
- `DELETE /workers/{id}` answers 202 and the worker is gone from the list at once; requests already proxied
  to it are NOT cut: they run to their end on the worker (a 3 s request in flight answered 200 after removal);
- `POST /workers {"url": URL}` answers 202 and registers the worker in the background: it is listed only
  after its `/health` answered (a worker that never answers is never listed), healthy from then on;
- its per-worker `smg_worker_requests_active` gauge stays 0 under the round_robin policy, so the drain waits
  on the worker's OWN count of requests in flight, read from the worker's Prometheus `/metrics` (SGLang with
  `--enable-metrics`: `sglang:num_running_reqs` + `sglang:num_queue_reqs`; llama.cpp: `requests_processing`
  + `requests_deferred`). A worker without those metrics is given a fixed grace instead, said so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sglfleet.pipeline.errors import TargetError

# The worker metrics whose sum is "requests this server still holds".
INFLIGHT_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs",
                    "llamacpp:requests_processing", "llamacpp:requests_deferred")


class RouterError(TargetError):
    """The router did not answer or refused a change: the rollout stops and restores what it changed."""


def _norm(url: str) -> str:
    return url.rstrip("/")


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    healthy: bool
    load: int = 0


@dataclass(frozen=True)
class DrainResult:
    host: str
    url: str
    removed: bool  # it was in the router and is not any more
    waited_s: float  # from the removal until its in-flight count reached 0 (or the bound)
    inflight_left: int | None  # None: the worker reports no in-flight metric (grace waited instead)
    how: str  # one line: what was waited on


@dataclass(frozen=True)
class AddResult:
    host: str
    url: str
    healthy: bool
    waited_s: float


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name or name{labels}: value}, through prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())) + "}"
                            if s.labels else "")
            out[key] = float(s.value)
    return out


def metric_sum(metrics: dict[str, float], name: str) -> float | None:
    vals = [v for k, v in metrics.items() if k == name or k.startswith(name + "{")]
    return sum(vals) if vals else None


def worker_inflight(url: str, timeout_s: float = 5.0) -> int | None:
    """Requests the worker still holds (running + queued), from its /metrics; None if it reports none."""
    try:
        r = httpx.get(_norm(url) + "/metrics", timeout=timeout_s)
        if r.status_code != 200:
            return None
        m = parse_metrics(r.text)
    except (httpx.HTTPError, ValueError):
        return None
    vals = [metric_sum(m, n) for n in INFLIGHT_METRICS]
    found = [v for v in vals if v is not None]
    return int(sum(found)) if found else None


class RouterClient:
    """sglang-router's worker API. Every failure to reach it is one RouterError naming the router."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, metrics_url: str | None = None) -> None:
        self.url = _norm(url)
        self.metrics_url = metrics_url
        self.http = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def _req(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self.http.request(method, self.url + path, **kw)
        except httpx.HTTPError as exc:
            raise RouterError(f"router {self.url} did not answer {method} {path}: {type(exc).__name__}: {exc}") \
                from None
        if r.status_code >= 400:
            raise RouterError(f"router {self.url} refused {method} {path}: HTTP {r.status_code} {r.text[:200]}")
        return r

    def workers(self) -> list[Worker]:
        data = self._req("GET", "/workers").json()
        return [Worker(w["id"], _norm(w["url"]), bool(w.get("is_healthy")), int(w.get("load") or 0))
                for w in data.get("workers", [])]

    def find(self, url: str) -> Worker | None:
        return next((w for w in self.workers() if w.url == _norm(url)), None)

    def alive(self) -> bool:
        try:
            self.workers()
            return True
        except RouterError:
            return False

    def remove(self, url: str, *, timeout_s: float = 30.0) -> bool:
        """Take the worker out; True once it is no longer listed, False if it was not listed."""
        w = self.find(url)
        if w is None:
            return False
        self._req("DELETE", f"/workers/{w.id}")
        deadline = time.monotonic() + timeout_s
        while self.find(url) is not None:
            if time.monotonic() > deadline:
                raise RouterError(f"router {self.url} still lists {url} {timeout_s:.0f} s after its removal")
            time.sleep(0.2)
        return True

    def add(self, url: str, *, timeout_s: float = 120.0) -> float:
        """Put the worker (back) in and wait until the router lists it healthy; returns the seconds waited."""
        t0 = time.monotonic()
        w = self.find(url)
        if w is None:
            self._req("POST", "/workers", json={"url": _norm(url)})
        deadline = t0 + timeout_s
        while True:
            w = self.find(url)
            if w is not None and w.healthy:
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                raise RouterError(f"router {self.url} did not report {url} healthy within {timeout_s:.0f} s")
            time.sleep(0.25)

    def metrics(self) -> dict[str, float]:
        """The router's own Prometheus metrics (per-worker health, circuit breaker, requests); {} if none."""
        if not self.metrics_url:
            return {}
        try:
            r = self.http.get(self.metrics_url)
            return parse_metrics(r.text) if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}


def drain(router: RouterClient, host: str, url: str, *, timeout_s: float = 60.0, grace_s: float = 5.0,
          poll_s: float = 0.25, settle_s: float = 0.5) -> DrainResult:
    """Remove the worker from the router, then wait (at most timeout_s) until it holds no request."""
    removed = router.remove(url)
    t0 = time.monotonic()
    # a request the router dispatched just before it unlisted the worker may still be on its way there and not yet
    # counted by the worker: let it arrive before a zero count is trusted, and trust a zero only twice in a row
    time.sleep(min(settle_s, timeout_s))
    n = worker_inflight(url)
    if n == 0:
        time.sleep(poll_s)
        n = worker_inflight(url)
    if n is None:  # no in-flight metric (or not answering): a fixed grace, bounded by timeout_s
        time.sleep(min(grace_s, timeout_s))
        return DrainResult(host, url, removed, time.monotonic() - t0, None,
                           f"no in-flight metric on {url}: waited a {min(grace_s, timeout_s):g} s grace")
    while n and time.monotonic() - t0 < timeout_s:
        time.sleep(poll_s)
        n = worker_inflight(url)
        if n is None:
            n = 0  # stopped answering its metrics: nothing more to wait for
    waited = time.monotonic() - t0
    how = (f"in-flight 0 after {waited:.1f} s" if not n else
           f"still {n} in flight after the {timeout_s:g} s bound: they are cut by the restart")
    return DrainResult(host, url, removed, waited, n, how)


def add_back(router: RouterClient, host: str, url: str, *, timeout_s: float = 120.0) -> AddResult:
    waited = router.add(url, timeout_s=timeout_s)
    return AddResult(host, url, True, waited)


class RouterProcess:
    """sglang-router on this machine (the tests' and a controller-hosted router): start, stop, its log.
    The Ansible role `router` starts the same command on the router host of an inventory."""

    def __init__(self, port: int, worker_urls: list[str], *, prometheus_port: int, log: Path,
                 extra: list[str] | None = None) -> None:
        self.port, self.prometheus_port, self.log = port, prometheus_port, log
        self.cmd = command(port, worker_urls, prometheus_port=prometheus_port, extra=extra)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}/metrics"

    def start(self, timeout_s: float = 60.0) -> RouterProcess:
        for p in (self.port, self.prometheus_port):  # another router (a killed run's) would answer for ours
            if port_in_use(p):
                raise RouterError(f"port {p} on 127.0.0.1 is already in use: another router or server holds it")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(self.cmd, stdout=fh, stderr=subprocess.STDOUT,
                                         env={**os.environ, "NO_COLOR": "1"}, start_new_session=True)
        c = RouterClient(self.url, timeout_s=2)
        deadline = time.monotonic() + timeout_s
        try:
            while not c.alive():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RouterError(f"sglang-router did not start on {self.url} (log {self.log})")
                time.sleep(0.25)
        finally:
            c.close()
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def __enter__(self) -> RouterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def command(port: int, worker_urls: list[str], *, prometheus_port: int, host: str = "127.0.0.1",
            python: str | None = None, extra: list[str] | None = None) -> list[str]:
    """The router's command line (round robin, its Prometheus port, health checks every 2 s)."""
    return [python or sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
            "--policy", "round_robin", "--prometheus-host", host, "--prometheus-port", str(prometheus_port),
            "--health-check-interval-secs", "2", "--log-level", "warn",
            *(["--worker-urls", *worker_urls] if worker_urls else []), *(extra or [])]
