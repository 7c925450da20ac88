"""Locust users for OpenAI-compatible streaming chat completions.

Headless through `python -m sglfleet.loadtests run ...` / `make loadtest`, or with Locust's web UI:

    locust -f loadtests/locustfile.py --host http://127.0.0.1:30000      # + LOADTEST_CONFIG=cfg.json

Per request this fires exactly one Locust request event, so Locust's stats, CSV, HTML and web UI
count real requests only ("Aggregated" = the chat request rate):

* `POST chat`        response_time = end-to-end latency (ms), response_length = output tokens;
                     failures carry the error class (http_503, timeout, stream_cut, ...)

The latency metrics (TTFT, ITL, TPOT, decode tok/s, request tok/s, output tokens; definitions and
units in `pipeline.metrics`) go into their own statistics (`loadtests.latency.MetricRegistry`), never
into Locust's request stats: workers send them with every stats report (`report_to_master`), the
master merges them (`worker_report`). They are shown in a "Latency metrics" tab of the web UI (CSV
download there too) and written at the end to `$LOADTEST_OUT/locust_metrics.csv` / `.json`.
`itl_events`: `each` records every gap, `mean` one mean per request, `off` none.

Every process also appends one JSON line per request to `$LOADTEST_OUT/records/<pid>.jsonl`; the
summary (percentiles over every ITL gap, goodput, length mismatches) is computed from those.

Settings come from the JSON file in `$LOADTEST_CONFIG` (written by `python -m sglfleet.loadtests`), else the
defaults of `LoadTestConfig`. A watchdog bounds every run by duration and request count, web UI too.
"""

from __future__ import annotations

import atexit
import csv
import itertools
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import gevent
import gevent.lock
import gevent.pool
import locust.runners
from locust import LoadTestShape, User, constant, events, task
from locust.env import Environment
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

from sglfleet.loadtests.config import LoadTestConfig
from sglfleet.loadtests.latency import CSV_HEADER, MetricRegistry
from sglfleet.loadtests.stream import Endpoint, StreamResult, get_json, stream_chat
from sglfleet.loadtests.workload import RequestSpec, build_requests

# Workers report stats to the master every second (default 3 s) so the watchdog reacts quickly.
locust.runners.WORKER_REPORT_INTERVAL = 1.0


def _load_settings() -> dict[str, Any]:
    path = os.environ.get("LOADTEST_CONFIG")
    if path:
        return json.loads(Path(path).read_text())
    return {"config": {}}


SETTINGS = _load_settings()
CFG = LoadTestConfig.model_validate(SETTINGS["config"])
if os.environ.get("LOADTEST_API_KEY"):
    CFG = CFG.model_copy(update={"api_key": os.environ["LOADTEST_API_KEY"]})
OUT = Path(os.environ.get("LOADTEST_OUT", "runs/locust-ui"))


class RequestError(Exception):
    """A failed request; str() is the error class only, so Locust groups failures by class."""

    def __init__(self, error_class: str, detail: str = "") -> None:
        super().__init__(error_class)
        self.error_class = error_class
        self.detail = detail

    def __str__(self) -> str:
        return self.error_class

    def __repr__(self) -> str:
        return self.error_class


class _Process:
    """Per-process state (created lazily, after Locust's --processes fork)."""

    def __init__(self, env: Environment) -> None:
        host = CFG.host or env.host
        if not host:
            raise RuntimeError("no target: pass --host (there is no default target)")
        cfg = CFG if CFG.host else CFG.model_copy(update={"host": host.rstrip("/")})
        self.cfg = cfg
        self.ep = Endpoint.parse(cfg.host or host, cfg.path)
        model = SETTINGS.get("model") or cfg.model
        if not model:
            status, data = get_json(host, "/v1/models", api_key=cfg.api_key)
            model = data["data"][0]["id"] if status == 200 and data and data.get("data") else "default"
        cal = SETTINGS.get("calibration") or {}
        self.specs: list[RequestSpec] = build_requests(cfg, model, cal.get("words_per_tok", 1.0),
                                                       cal.get("overhead_toks", 0),
                                                       nonce=SETTINGS.get("prompt_nonce") or "")
        self.counter = itertools.count()
        n_proc = max(1, cfg.processes)
        self.budget = -(-cfg.max_requests // n_proc)  # ceil: per-process share of the request bound
        self.issued = 0
        self.inflight = 0
        self.max_inflight = max(1, cfg.max_inflight // n_proc)
        rec_dir = OUT / "records"
        rec_dir.mkdir(parents=True, exist_ok=True)
        self.records = open(rec_dir / f"{os.getpid()}.jsonl", "a", buffering=1 << 16)  # noqa: SIM115
        atexit.register(self.records.close)

    def next_spec(self) -> RequestSpec | None:
        if self.issued >= self.budget:
            return None
        self.issued += 1
        return self.specs[next(self.counter) % len(self.specs)]

    def write(self, rec: dict[str, Any]) -> None:
        self.records.write(json.dumps(rec, separators=(",", ":")) + "\n")


_STATE: _Process | None = None
_STATE_LOCK = gevent.lock.Semaphore()


def _state(env: Environment) -> _Process:
    global _STATE
    with _STATE_LOCK:
        if _STATE is None:
            _STATE = _Process(env)
    return _STATE


# This process's latency metrics (workers: since the last report to the master).
METRICS = MetricRegistry()


def report(env: Environment, res: StreamResult, spec: RequestSpec, itl_events: str = "each") -> dict[str, Any]:
    """Fire the one Locust request event for this request, record its latency metrics, return its record."""
    fire = env.events.request.fire
    e2e_ms = res.e2e * 1000.0
    n = res.output_tokens
    if res.ok:
        fire(request_type="POST", name="chat", response_time=e2e_ms, response_length=n, exception=None, context={})
        METRICS.add("TTFT", (res.ttft or 0.0) * 1000.0)
        if res.itl and itl_events == "each":
            METRICS.add_many("ITL", (gap * 1000.0 for gap in res.itl))
        elif res.itl and itl_events == "mean":
            METRICS.add("ITL", sum(res.itl) * 1000.0 / len(res.itl))
        tpot = res.tpot
        METRICS.add("TPOT", tpot * 1000.0 if tpot is not None else None)
        METRICS.add("decode tok/s", res.decode_tokens_per_s)
        METRICS.add("request tok/s", res.tokens_per_s)
        METRICS.add("output tokens", n)
    else:
        fire(request_type="POST", name="chat", response_time=e2e_ms, response_length=0,
             exception=RequestError(res.error or "error", res.detail), context={})
    rec: dict[str, Any] = {
        "t": round(res.t_start, 6),
        "ok": res.ok,
        "e2e": round(e2e_ms, 4),
        "n": n,
        "src": "usage" if res.usage_tokens is not None else "chunks",
        "chunks": res.chunks,
        "aout": spec.asked_output,
        "exact": spec.exact_output,
    }
    if res.ok:
        rec["ttft"] = round((res.ttft or 0.0) * 1000.0, 4)
        rec["hdr"] = round((res.t_headers or 0.0) * 1000.0, 4)
        rec["itl"] = [round(g * 1000.0, 4) for g in res.itl]
        rec["fin"] = res.finish_reason
    else:
        rec["err"] = res.error
        rec["detail"] = res.detail[:200]
    if res.prompt_tokens is not None:
        rec["pin"] = res.prompt_tokens
    if spec.asked_input is not None:
        rec["ain"] = spec.asked_input
    return rec


class ChatStreamUser(User):
    """Closed loop (default): one streaming request after another. Rate mode: an arrival generator."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.st = _state(self.environment)
        self.pool = gevent.pool.Pool()

    def on_stop(self) -> None:
        self.pool.kill(block=False)

    def _one(self, spec: RequestSpec) -> None:
        st = self.st
        st.inflight += 1
        t_start = time.time()
        try:
            res = stream_chat(st.ep, spec.raw, st.cfg.request_timeout_s, stall_s=st.cfg.request_stall_s)
        except gevent.GreenletExit:
            # Locust stops this user while its request runs (after --stop-timeout): neither a success nor a
            # failure of the target. Recorded as running at the stop; no Locust event (Locust never counts it).
            st.write({"t": round(t_start, 6), "ok": False, "running_at_stop": True,
                      "e2e": round((time.time() - t_start) * 1000.0, 4), "n": 0, "aout": spec.asked_output,
                      "exact": spec.exact_output})
            st.records.flush()
            raise
        finally:
            st.inflight -= 1
        st.write(report(self.environment, res, spec, st.cfg.itl_events))

    def _exhausted(self) -> None:
        runner = self.environment.runner
        if isinstance(runner, LocalRunner) and self.environment.parsed_options is not None \
                and self.environment.parsed_options.headless:
            _stop(self.environment, "max_requests")
        gevent.sleep(1.0)

    @task
    def chat(self) -> None:
        st = self.st
        if st.cfg.rate is None:
            spec = st.next_spec()
            if spec is None:
                self._exhausted()
                return
            self._one(spec)
            return
        # Open loop: this user generates rate/users arrivals per second (sum over users = rate).
        per_user = st.cfg.rate / st.cfg.users  # users are spread over workers; the sum stays `rate`
        poisson = st.cfg.arrival == "poisson"
        rng = random.Random()
        now = time.perf_counter()
        nxt = now + (rng.expovariate(per_user) if poisson else rng.uniform(0, 1.0 / per_user))
        while True:
            delay = nxt - time.perf_counter()
            if delay > 0:
                gevent.sleep(delay)
            spec = st.next_spec()
            if spec is None:
                self._exhausted()
                continue
            if st.inflight >= st.max_inflight:
                res = StreamResult(error="dropped", detail="max_inflight reached: arrival not sent",
                                   t_start=time.time())
                st.write(report(self.environment, res, spec))
            else:
                self.pool.spawn(self._one, spec)
            nxt += rng.expovariate(per_user) if poisson else 1.0 / per_user


def _stop(env: Environment, reason: str) -> None:
    """Write why the run ended and stop it (headless: quit; web UI: stop the test, keep the UI)."""
    if env.runner is None or getattr(env, "_lt_stopping", False):
        return
    env._lt_stopping = True  # type: ignore[attr-defined]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "stop_reason.json").write_text(json.dumps({"reason": reason, "at": time.time()}))
    headless = env.parsed_options is None or env.parsed_options.headless
    gevent.spawn(env.runner.quit if headless else env.runner.stop)


def _watchdog(env: Environment) -> None:
    cfg = CFG
    t0 = time.monotonic()
    # The run's length is enforced here, on time.monotonic(): Locust's own --run-time timer runs on
    # gevent's cached loop clock and fires early by however long start-up blocked the loop.
    hard = cfg.capacity.max_step_s if cfg.step_control else cfg.total_duration_s + (1.0 if cfg.steps else 0.0)
    warm_n: int | None = None
    reset_done = cfg.warmup_s <= 0
    while True:
        gevent.sleep(0.2)
        el = time.monotonic() - t0
        if not reset_done and el >= cfg.warmup_s:
            # Warm-up over: Locust's own stats (CSV, HTML, early-stop checks) start afresh, like ours.
            env.stats.reset_all()
            METRICS.reset()
            reset_done = True
            OUT.mkdir(parents=True, exist_ok=True)
            (OUT / "stats_reset.json").write_text(json.dumps({"at": time.time(), "reason": "warmup"}))
        chat = env.stats.get("chat", "POST")
        n = chat.num_requests
        if n >= cfg.max_requests:
            return _stop(env, "max_requests")
        if el >= hard:
            return _stop(env, "duration")
        if not cfg.step_control:
            continue
        cap, slo = cfg.capacity, cfg.slo
        if el >= cfg.warmup_s and warm_n is None:
            warm_n = 0  # stats were just reset
        measured = n if warm_n is not None else 0
        # Locust counts completions; our summary counts requests *started* after warm-up: keep a margin.
        margin = cfg.users + (int(cfg.rate) + 1 if cfg.rate else 0)
        if el >= cfg.duration_s and measured >= cap.min_samples + margin:
            return _stop(env, "step_complete")
        if el >= cfg.duration_s + 0.5 and el >= cap.max_step_s - 0.5:
            return _stop(env, "max_step_time")
        ttft = METRICS.get("TTFT")
        early_n = max(5, min(cap.min_samples, 20))
        if el >= cfg.warmup_s and ttft.count >= early_n \
                and (ttft.percentile(0.95) or 0.0) > cap.early_stop_factor * slo.ttft_p95_ms:
            return _stop(env, "saturated_ttft")
        if n >= early_n and chat.num_failures / n > max(0.5, 2 * slo.max_error_rate):
            return _stop(env, "saturated_errors")


# ---------------------------------------------------------------------------- latency metrics plumbing
@events.report_to_master.add_listener
def _on_report_to_master(client_id: str, data: dict[str, Any], **_: Any) -> None:
    data["lt_metrics"] = METRICS.serialize()
    METRICS.reset()


@events.worker_report.add_listener
def _on_worker_report(client_id: str, data: dict[str, Any], **_: Any) -> None:
    METRICS.merge(data.get("lt_metrics"))


@events.reset_stats.add_listener
def _on_reset_stats(**_: Any) -> None:
    METRICS.reset()


_ENV: list[Environment] = []
_TAB = "latency-metrics"


@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    _ENV[:] = [environment]
    web = environment.web_ui
    if web is None:
        return
    from flask import Response, request

    from sglfleet.loadtests.latency import PERCENTILES

    keys = ["name", "unit", "count", "mean", "min", "max", *(f"p{round(q * 100)}" for q in PERCENTILES)]
    web.template_args["extended_tabs"] = [{"title": "Latency metrics", "key": _TAB}]
    web.template_args["extended_tables"] = [{"key": _TAB, "structure": [{"key": k, "title": t}
                                                                         for k, t in zip(keys, CSV_HEADER,
                                                                                         strict=True)]}]
    web.template_args["extended_csv_files"] = [{"href": "./latency-metrics/csv",
                                                "title": "Download latency metrics CSV"}]

    app = web.app
    assert app is not None  # a WebUI always carries its Flask app

    @app.route("/latency-metrics")
    def _latency_metrics() -> dict[str, Any]:
        return {"metrics": METRICS.rows()}

    @app.route("/latency-metrics/csv")
    def _latency_metrics_csv() -> Response:
        import io

        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(CSV_HEADER)
        for r in METRICS.rows():
            w.writerow(["" if r[k] is None else r[k] for k in keys])
        return Response(buf.getvalue(), mimetype="text/csv",
                        headers={"Content-disposition": "attachment;filename=latency_metrics.csv"})

    @app.after_request
    def _extend_stats(response: Response) -> Response:
        # The web UI's extended tab reads its rows from /stats/requests' `extended_stats`.
        if request.path == "/stats/requests" and response.is_json:
            body = response.get_json()
            body["extended_stats"] = [{"key": _TAB, "data": METRICS.rows()}]
            response.set_data(json.dumps(body))
        return response


def write_metrics(out: Path) -> None:
    """locust_metrics.csv + .json: the run's latency metrics (master / local process)."""
    out.mkdir(parents=True, exist_ok=True)
    METRICS.write_csv(out / "locust_metrics.csv")
    (out / "locust_metrics.json").write_text(json.dumps({"metrics": METRICS.rows()}, indent=1))


@events.quit.add_listener
def _on_quit(**_: Any) -> None:
    env = _ENV[0] if _ENV else None
    if env is not None and not isinstance(env.runner, WorkerRunner):
        write_metrics(OUT)


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_: Any) -> None:
    METRICS.reset()
    if isinstance(environment.runner, MasterRunner | LocalRunner) and not isinstance(environment.runner, WorkerRunner):
        environment._lt_stopping = False  # type: ignore[attr-defined]
        gevent.spawn(_watchdog, environment)


@events.test_stopping.add_listener
def _on_test_stopping(environment: Environment, **_: Any) -> None:
    """Mark the end of the measurement: requests still running now finish during the stop timeout
    while Locust shuts down (which can stall this process), so the summary leaves them out."""
    if not isinstance(environment.runner, WorkerRunner):
        OUT.mkdir(parents=True, exist_ok=True)
        stop_at = OUT / "stop_at.json"
        if not stop_at.exists():
            stop_at.write_text(json.dumps({"at": time.time()}))


@events.quitting.add_listener
def _on_quitting(environment: Environment, **_: Any) -> None:
    if _STATE is not None:
        _STATE.records.flush()


if CFG.steps:

    class StepShape(LoadTestShape):
        """Step ramp from the config's `steps`: hold each user count for its duration, then stop."""

        def tick(self) -> tuple[int, float] | None:
            t = self.get_run_time()
            acc = 0.0
            for s in CFG.steps:
                acc += s.duration_s
                if t < acc:
                    return s.users, s.spawn_rate or CFG.spawn_rate
            return None
