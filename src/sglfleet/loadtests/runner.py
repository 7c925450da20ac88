"""Run Locust headless in a subprocess and turn its per-request records into our summary.

Locust always runs in a child process (`python -m locust -f loadtests/locustfile.py ...`): importing
locust monkey-patches the importing process with gevent, and the caller (CLI, tests, the main job)
must stay clean. The child gets its settings through a JSON file in the run directory.
"""

from __future__ import annotations

import json
import math
import os
import random
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sglfleet import paths
from sglfleet.loadtests.config import LoadTestConfig
from sglfleet.loadtests.stream import ERR_NOT_STREAMING, Endpoint, build_request, get_json, stream_chat
from sglfleet.loadtests.workload import build_requests, synthetic_prompt
from sglfleet.pipeline import metrics
from sglfleet.pipeline.client import auth_error
from sglfleet.pipeline.errors import PipelineError, TargetError, UsageError

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
SRC_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds sglfleet/
PERCENTILES = (50, 90, 95, 99)


class RunFailed(PipelineError):
    """The Locust run itself failed (crash, no results): the report is marked incomplete."""

    exit_code = 2


def validate_workload(cfg: LoadTestConfig) -> None:
    """Build the request pool once with a placeholder model: catches unparseable datasets early."""
    build_requests(cfg.model_copy(update={"host": cfg.host or "http://127.0.0.1:1"}), "probe", pool=1)


def preflight(cfg: LoadTestConfig) -> dict[str, Any]:
    """Check the target speaks streaming OpenAI chat; return the model and (synthetic) length calibration."""
    if not cfg.host:
        raise UsageError("no target: pass --host URL (there is no default target)")
    try:
        status, data = get_json(cfg.host, "/v1/models", timeout_s=min(10.0, cfg.request_stall_s), api_key=cfg.api_key)
    except OSError as exc:
        raise TargetError(f"cannot reach {cfg.host}: {type(exc).__name__}: {exc}") from None
    if status in (401, 403):
        raise auth_error(f"{cfg.host}/v1/models", status, cfg.api_key is not None)
    if status != 200 or not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise TargetError(f"{cfg.host}/v1/models answered HTTP {status} without a model list: not OpenAI-compatible")
    ids = [str(m.get("id")) for m in data["data"] if isinstance(m, dict)]
    model = cfg.model or (ids[0] if ids else None)
    if not model:
        raise TargetError(f"{cfg.host}/v1/models lists no models")
    ep = Endpoint.parse(cfg.host, cfg.path)
    probe_cfg = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"max_tokens": 4,
                                                                                   "output_tokens": 4})})
    spec = build_requests(probe_cfg, model, pool=1)[0]
    res = stream_chat(ep, spec.raw, timeout_s=min(cfg.request_timeout_s, 60.0), stall_s=cfg.request_stall_s)
    if res.error in ("http_401", "http_403"):
        raise auth_error(f"{cfg.host}{cfg.path}", res.status, cfg.api_key is not None)
    if res.error == ERR_NOT_STREAMING:
        raise TargetError(f"{cfg.host} does not stream chat completions ({res.detail}); the load test needs SSE")
    if not res.ok:
        raise TargetError(f"{cfg.host}: streaming probe request failed: {res.error}: {res.detail[:200]}")
    info: dict[str, Any] = {"model": model, "models": ids, "probe_usage": res.usage_tokens is not None}
    if cfg.workload.kind == "synthetic":
        info["calibration"] = _calibrate(cfg, ep, model)
    return info


def _calibrate(cfg: LoadTestConfig, ep: Endpoint, model: str) -> dict[str, Any]:
    """Prompt tokens per word and fixed overhead (chat template), from two probes' usage.prompt_tokens."""
    counts = []
    for n_words in (16, 256):
        prompt = synthetic_prompt(random.Random(1), n_words, 0)
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 1,
                "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
        res = stream_chat(ep, build_request(ep, body, cfg.api_key), timeout_s=60.0)
        if res.prompt_tokens is None:
            return {"words_per_tok": 1.0, "overhead_toks": 0, "calibrated": False,
                    "why": "server sends no usage.prompt_tokens"}
        counts.append(res.prompt_tokens)
    tpw = max(0.2, (counts[1] - counts[0]) / 240.0)
    overhead = max(0, round(counts[0] - 16 * tpw))
    return {"words_per_tok": 1.0 / tpw, "overhead_toks": overhead, "calibrated": True}


@dataclass
class LocustOutcome:
    rc: int
    stop_reason: str | None
    wall_s: float
    log: Path


def locust_command(cfg: LoadTestConfig, out: Path, web_ui: bool = False) -> list[str]:
    """The Locust command line for this config (headless unless web_ui)."""
    assert cfg.host
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", cfg.host,
           "--loglevel", "WARNING", "--exit-code-on-error", "0"]
    if not web_ui:
        cmd += ["--headless", "--only-summary", "--csv", str(out / "locust"), "--html", str(out / "locust.html")]
    if cfg.stop_timeout_s:
        cmd += ["--stop-timeout", f"{math.ceil(cfg.stop_timeout_s)}s"]
    if not cfg.steps and not web_ui:  # web UI: users are chosen in the UI; the watchdog bounds each run
        # A backstop only: the locustfile's watchdog ends the run on time (see _watchdog).
        run_time = (cfg.capacity.max_step_s if cfg.step_control else cfg.duration_s) + 10
        cmd += ["-u", str(cfg.users), "-r", f"{cfg.spawn_rate:g}", "-t", f"{math.ceil(run_time)}s"]
    if cfg.processes > 1:
        cmd += ["--processes", str(cfg.processes)]
    return cmd


def write_settings(cfg: LoadTestConfig, out: Path, info: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "loadtest-settings.json"
    # The API key never goes to disk: the child gets it through LOADTEST_API_KEY (child_env).
    # prompt_nonce: this run's synthetic prompts are its own (workload.reuse_prompts keeps them across runs).
    path.write_text(json.dumps({"config": cfg.model_dump(mode="json", exclude={"api_key"}), "model": info.get("model"),
                                "calibration": info.get("calibration"), "prompt_nonce": secrets.token_hex(4)},
                               indent=2))
    return path


def child_env(settings: Path, out: Path, api_key: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if api_key:
        env["LOADTEST_API_KEY"] = api_key
    env["LOADTEST_CONFIG"] = str(settings.resolve())
    env["LOADTEST_OUT"] = str(out.resolve())
    env["PYTHONPATH"] = str(SRC_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_locust(cfg: LoadTestConfig, out: Path, info: dict[str, Any]) -> LocustOutcome:
    """One bounded headless Locust run writing CSV, HTML and per-request records into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    settings = write_settings(cfg, out, info)
    log = out / "locust.log"
    bound = (cfg.capacity.max_step_s if cfg.step_control else cfg.total_duration_s) + cfg.stop_timeout_s + 60
    t0 = time.monotonic()
    with log.open("wb") as fh:
        try:
            proc = subprocess.run(locust_command(cfg, out), env=child_env(settings, out, cfg.api_key), stdout=fh,
                                  stderr=subprocess.STDOUT, timeout=bound, cwd=paths.WORK_ROOT, check=False)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = -9
    reason_file = out / "stop_reason.json"
    reason = json.loads(reason_file.read_text())["reason"] if reason_file.is_file() else None
    if reason is None and rc == 0:
        reason = "shape_complete" if cfg.steps else "run_time_backstop"
    return LocustOutcome(rc, reason, time.monotonic() - t0, log)


# ---------------------------------------------------------------------------------------------- summary
def load_records(out: Path) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for f in sorted((out / "records").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                recs.append(json.loads(line))
    recs.sort(key=lambda r: r["t"])
    return recs


def dist(values: list[float] | np.ndarray) -> dict[str, float | int | None]:
    """count, mean, p50/p90/p95/p99, max of a sample (None when empty)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return {"count": 0, "mean": None, **{f"p{p}": None for p in PERCENTILES}, "max": None}
    out: dict[str, float | int | None] = {"count": int(arr.size), "mean": round(float(arr.mean()), 4)}
    for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES), strict=True):
        out[f"p{p}"] = round(float(v), 4)
    out["max"] = round(float(arr.max()), 4)
    return out


def stop_time(out: Path) -> float | None:
    """Wall-clock time the run began stopping (written by the locustfile), None if unknown."""
    f = out / "stop_at.json"
    return float(json.loads(f.read_text())["at"]) if f.is_file() else None


def summarize(recs: list[dict[str, Any]], cfg: LoadTestConfig, stop_at: float | None = None) -> dict[str, Any]:
    """Our summary of a run's records.

    Left out: requests started during warm-up, and requests still running when the run began to
    stop (they end during Locust's shutdown, which can stall the client and distort their timings).
    """
    running = [r for r in recs if r.get("running_at_stop")]
    recs = [r for r in recs if not r.get("running_at_stop")]
    if not recs:
        return {"requests": {"total": 0, "ok": 0, "failed": 0, "in_flight_at_stop": len(running)}, "measured": False}
    t_first = recs[0]["t"]
    in_window = [r for r in recs if stop_at is None or r["t"] + r["e2e"] / 1000.0 <= stop_at]
    measured = [r for r in in_window if r["t"] >= t_first + cfg.warmup_s]
    ok = [r for r in measured if r["ok"]]
    errors: dict[str, int] = {}
    for r in measured:
        if not r["ok"]:
            errors[r["err"]] = errors.get(r["err"], 0) + 1
    t0 = min((r["t"] for r in measured), default=t_first)
    t1 = max((r["t"] + r["e2e"] / 1000.0 for r in measured), default=t0)
    if stop_at is not None:
        t1 = max(t1, stop_at)
    window = max(t1 - t0, 1e-9)
    itl_all = [g for r in ok for g in r["itl"]]
    # Definitions: pipeline.metrics (records hold milliseconds).
    tpot = [v for r in ok if (v := metrics.tpot(r["e2e"], r["ttft"], r["n"])) is not None]
    tps = [v for r in ok if (v := metrics.request_tokens_per_s(r["e2e"] / 1000.0, r["n"])) is not None]
    dec = [v for r in ok if (v := metrics.decode_tokens_per_s(r["e2e"] / 1000.0, r["ttft"] / 1000.0, r["n"]))
           is not None]
    slo = cfg.slo

    def good(r: dict[str, Any]) -> bool:
        if not r["ok"] or r["ttft"] > slo.ttft_p95_ms:
            return False
        return not r["itl"] or float(np.percentile(r["itl"], 95)) <= slo.itl_p95_ms

    n_good = sum(1 for r in ok if good(r))
    total = len(measured)
    error_rate = (total - len(ok)) / total if total else 1.0
    ttft = dist([r["ttft"] for r in ok])
    itl = dist(itl_all)
    tol = cfg.workload.length_tolerance
    out_mismatch = [r for r in ok if (r["exact"] and abs(r["n"] - r["aout"]) > tol * r["aout"]) or r["n"] > r["aout"]]
    with_in = [r for r in ok if "ain" in r and "pin" in r]
    in_mismatch = [r for r in with_in if abs(r["pin"] - r["ain"]) > tol * r["ain"]]
    checks: dict[str, dict[str, Any]] = {
        "ttft_p95": {"value_ms": ttft["p95"], "slo_ms": slo.ttft_p95_ms,
                     "ok": ttft["p95"] is not None and ttft["p95"] <= slo.ttft_p95_ms},
        "itl_p95": {"value_ms": itl["p95"], "slo_ms": slo.itl_p95_ms,
                    "ok": itl["p95"] is None or itl["p95"] <= slo.itl_p95_ms},
        "error_rate": {"value": round(error_rate, 4), "max": slo.max_error_rate,
                       "ok": error_rate <= slo.max_error_rate},
    }
    return {
        "measured": True,
        "warmup_s": cfg.warmup_s,
        "window_s": round(window, 3),
        "requests": {"total": total, "ok": len(ok), "failed": total - len(ok), "errors": errors,
                     "warmup_excluded": len(in_window) - total, "after_stop_excluded": len(recs) - len(in_window),
                     # still running when Locust stopped its users (after the stop timeout): not failures of the
                     # target, not in `total`, never counted by Locust either
                     "in_flight_at_stop": len(running)},
        "error_rate": round(error_rate, 4),
        "ttft_ms": ttft,
        "itl_ms": itl,
        "tpot_ms": dist(tpot),
        "e2e_ms": dist([r["e2e"] for r in ok]),
        "output_len": dist([r["n"] for r in ok]),
        "request_tok_per_s": dist(tps),
        "decode_tok_per_s": dist(dec),
        "throughput": {
            "requests_per_s": round(len(ok) / window, 4),
            "output_tok_per_s": round(sum(r["n"] for r in ok) / window, 3),
            "goodput_requests_per_s": round(n_good / window, 4),
            "good_requests": n_good,
        },
        "length_source": {"usage": sum(1 for r in ok if r["src"] == "usage"),
                               "counted_chunks": sum(1 for r in ok if r["src"] == "chunks")},
        "lengths": {
            "output_asked_mean": round(float(np.mean([r["aout"] for r in ok])), 2) if ok else None,
            "output_received_mean": round(float(np.mean([r["n"] for r in ok])), 2) if ok else None,
            "output_mismatches": len(out_mismatch),
            "input_asked_mean": round(float(np.mean([r["ain"] for r in with_in])), 2) if with_in else None,
            "input_received_mean": round(float(np.mean([r["pin"] for r in with_in])), 2) if with_in else None,
            "input_mismatches": len(in_mismatch),
            "tolerance": tol,
        },
        "slo": {"met": all(c["ok"] for c in checks.values()) and len(ok) > 0, "checks": checks},
    }


def locust_agreement(out: Path, recs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Locust's own totals (locust_stats.csv, "Aggregated") against our records: every request Locust counted
    since its last stats reset is one record that ended after that reset (requests running at the stop are
    neither). None when Locust wrote no stats CSV."""
    import csv

    f = out / "locust_stats.csv"
    if not f.is_file():
        return None
    rows = {r.get("Name"): r for r in csv.DictReader(f.open(newline=""))}
    agg = rows.get("Aggregated")
    if agg is None:
        return None
    reset_file = out / "stats_reset.json"
    reset_at = float(json.loads(reset_file.read_text())["at"]) if reset_file.is_file() else None
    fired = [r for r in recs if not r.get("running_at_stop")
             and (reset_at is None or r["t"] + r["e2e"] / 1000.0 >= reset_at)]
    n, n_fail = int(agg["Request Count"]), int(agg["Failure Count"])
    mine, mine_fail = len(fired), sum(1 for r in fired if not r["ok"])
    return {"locust_requests": n, "locust_failures": n_fail, "records": mine, "record_failures": mine_fail,
            "stats_reset_at": reset_at, "agree": n == mine and n_fail == mine_fail}


def finished_ok(outcome: LocustOutcome, recs: list[dict[str, Any]]) -> str | None:
    """None when the Locust run ended normally with results; else why the report is incomplete."""
    if outcome.rc == -9:
        return f"Locust did not finish within its bound; log {outcome.log}"
    if outcome.rc != 0:
        tail = outcome.log.read_text(errors="replace").strip().splitlines()[-3:]
        return f"Locust exited with code {outcome.rc}: {' | '.join(tail)[:400]}"
    if not recs:
        return f"Locust ran but recorded no requests (target too slow for the run's duration?); log {outcome.log}"
    return None


def run_loadtest(cfg: LoadTestConfig, out: Path, info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Preflight (unless `info` given), one Locust run, summary. Raises RunFailed for an incomplete run.

    Writes into `out`: locust_stats.csv & co (Locust's CSV), locust.html, records/*.jsonl, summary.json.
    """
    from sglfleet.pipeline.reports import write_json

    validate_workload(cfg)
    info = info or preflight(cfg)
    outcome = run_locust(cfg, out, info)
    recs = load_records(out)
    problem = finished_ok(outcome, recs)
    summary: dict[str, Any] = {
        "complete": problem is None,
        "host": cfg.host,
        "model": info.get("model"),
        "load": ({"mode": "rate", "rate": cfg.rate, "arrival": cfg.arrival, "generators": cfg.users}
                 if cfg.rate is not None else
                 {"mode": "steps", "steps": [s.model_dump() for s in cfg.steps]} if cfg.steps else
                 {"mode": "users", "users": cfg.users}),
        "processes": cfg.processes,
        "duration_s": cfg.total_duration_s,
        "stop_reason": outcome.stop_reason,
        "wall_s": round(outcome.wall_s, 2),
        "calibration": info.get("calibration"),
        "files": {"locust_csv": "locust_stats.csv", "locust_html": "locust.html", "records": "records/",
                  "latency_metrics_csv": "locust_metrics.csv", "junit": "junit.xml"},
    }
    summary["latency_metrics"] = attach_latency_metrics(out)
    if problem is not None:
        summary["error"] = problem
        write_json(out / "summary.json", summary)
        write_run_junit(out, summary)
        raise RunFailed(problem)
    summary.update(summarize(recs, cfg, stop_time(out)))
    summary["locust_agreement"] = locust_agreement(out, recs)
    write_json(out / "summary.json", summary)
    write_run_junit(out, summary)
    return summary


def attach_latency_metrics(out: Path) -> list[dict[str, Any]] | None:
    """Locust-side latency metrics of the run (locust_metrics.json), also appended to locust.html."""
    from sglfleet.loadtests.latency import html_table

    f = out / "locust_metrics.json"
    if not f.is_file():
        return None
    rows: list[dict[str, Any]] = json.loads(f.read_text())["metrics"]
    page = out / "locust.html"
    if page.is_file():
        text = page.read_text(encoding="utf-8")
        if "lt-latency-metrics" not in text:
            i = text.rfind("</body>")
            section = html_table(rows)
            page.write_text(text[:i] + section + text[i:] if i >= 0 else text + section, encoding="utf-8")
    return rows


def write_run_junit(out: Path, summary: dict[str, Any]) -> Path:
    """junit.xml for one run: `complete`, then one case per SLO check (a missed SLO is a failure)."""
    from sglfleet.pipeline.reports import Case, write_junit

    cases = [Case("complete", "run", bool(summary.get("complete")), summary.get("error") or "run completed",
                  time_s=float(summary.get("wall_s") or 0.0))]
    for name, c in ((summary.get("slo") or {}).get("checks") or {}).items():
        value = c.get("value_ms", c.get("value"))
        limit = c.get("slo_ms", c.get("max"))
        cases.append(Case(name, "slo", bool(c["ok"]), f"{name} {value} (limit {limit})", details=c))
    if summary.get("complete") and not summary.get("requests", {}).get("ok"):
        cases.append(Case("ok_requests", "slo", False, "no request succeeded"))
    return write_junit(out / "junit.xml", "loadtest", cases)
