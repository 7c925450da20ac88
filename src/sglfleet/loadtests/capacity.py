"""Capacity search: the largest concurrency (or request rate) whose run meets the SLOs.

Bracket first (start, 2x, 4x, ... up to max_load) until a step misses the SLOs, then bisect between
the last passing and the first failing load down to the resolution. Each step is one bounded
headless Locust run with warm-up (requests started in it are left out), a minimum number of measured
samples, and an early stop once the step is clearly over-saturated (p95 TTFT above
early_stop_factor x SLO, or errors far above the allowed rate). Goodput is the rate of requests that
individually met the TTFT and ITL objectives.

    run_capacity(cfg, out_dir) -> dict     # also writes capacity.json, capacity.html, latency.png, throughput.png
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglfleet.loadtests.config import LoadTestConfig
from sglfleet.loadtests.report import plot_capacity, write_capacity_report
from sglfleet.loadtests.runner import RunFailed, preflight, run_loadtest, validate_workload
from sglfleet.pipeline.reports import write_json

# `--quick`: a short search for CI and the embedded CPU target (seconds per step, small loads). A step
# is extended up to max_step_s to collect min_samples, so a slow shared CPU still yields a verdict.
QUICK: dict[str, Any] = {
    "workload": {"max_tokens": 8, "output_tokens": 8, "input_tokens": 32},
    "stop_timeout_s": 10.0,
    "capacity": {"start": 1, "max_load": 8, "step_duration_s": 4, "warmup_s": 1, "min_samples": 4,
                 "max_step_s": 40, "max_steps": 6},
}


def step_config(cfg: LoadTestConfig, load: float) -> LoadTestConfig:
    """The config of one search step at `load` (users, or req/s in rate mode)."""
    cap = cfg.capacity
    upd: dict[str, Any] = {"duration_s": cap.step_duration_s, "warmup_s": cap.warmup_s, "step_control": True,
                           "steps": []}
    if cap.mode == "users":
        upd.update(users=int(load), rate=None, spawn_rate=max(cfg.spawn_rate, float(load)))
    else:
        upd.update(rate=float(load), users=min(64, max(1, math.ceil(load))))
    return cfg.model_copy(update=upd)


def _judge(summary: dict[str, Any], cfg: LoadTestConfig, stop_reason: str | None) -> tuple[bool, str]:
    if stop_reason and stop_reason.startswith("saturated"):
        return False, f"early stop: {stop_reason}"
    if not summary.get("measured"):
        return False, "no measured requests"
    n = summary["requests"]["total"]
    if n < cfg.capacity.min_samples:
        return False, f"only {n} measured requests (< min_samples {cfg.capacity.min_samples})"
    failed = [k for k, c in summary["slo"]["checks"].items() if not c["ok"]]
    if failed:
        return False, "misses " + ", ".join(failed)
    return True, "meets SLOs"


def run_capacity(cfg: LoadTestConfig, out: Path, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Bracket-then-bisect search; writes capacity.json/.html and plots into `out`; returns the result."""
    t_start = time.monotonic()
    validate_workload(cfg)
    info = preflight(cfg)
    cap = cfg.capacity
    is_users = cap.mode == "users"
    steps: list[dict[str, Any]] = []
    result: dict[str, Any] = {
        "complete": False, "host": cfg.host, "model": info["model"], "mode": cap.mode,
        "slo": cfg.slo.model_dump(), "search": cap.model_dump(), "capacity": None, "first_failing": None,
        "steps": steps, "wall_s": 0.0,
    }

    def norm(x: float) -> float:
        return float(max(1, int(x))) if is_users else round(x, 4)

    def step(load: float, phase: str) -> bool:
        idx = len(steps)
        scfg = step_config(cfg, load)
        sdir = out / "steps" / f"{idx:02d}-{cap.mode}-{load:g}"
        try:
            summary = run_loadtest(scfg, sdir, info)  # RunFailed propagates: no partial report passed as complete
        except RunFailed as exc:
            result["error"] = f"step {idx} ({cap.mode}={load:g}): {exc}"
            result["wall_s"] = round(time.monotonic() - t_start, 2)
            write_json(out / "capacity.json", result)
            write_capacity_junit(out, result)
            raise
        passed, why = _judge(summary, cfg, summary.get("stop_reason"))
        steps.append({"index": idx, "phase": phase, "load": load, "passed": passed, "why": why,
                      "stop_reason": summary.get("stop_reason"), "dir": str(sdir.relative_to(out)),
                      "summary": {k: summary.get(k) for k in ("measured", "requests", "error_rate", "ttft_ms",
                                                               "itl_ms", "tpot_ms", "e2e_ms", "throughput",
                                                               "lengths", "slo", "window_s")}})
        thr = summary.get("throughput") or {}
        ttft, itl = summary.get("ttft_ms") or {}, summary.get("itl_ms") or {}
        log(f"  step {idx} {phase:8s} {cap.mode}={load:g}: {'pass' if passed else 'FAIL'} ({why}); "
            f"TTFT p95 {ttft.get('p95')} ms, ITL p95 {itl.get('p95')} ms, {thr.get('requests_per_s')} req/s, "
            f"goodput {thr.get('goodput_requests_per_s')}")
        write_json(out / "capacity.json", result)  # progress; `complete` stays false until the end
        return passed

    lo: float | None = None
    hi: float | None = None
    load = norm(cap.start)
    while len(steps) < cap.max_steps:
        if step(load, "bracket"):
            lo = load
            if load >= cap.max_load:
                break
            load = norm(min(load * 2, cap.max_load))
        else:
            hi = load
            break
    if lo is not None and hi is not None:
        while len(steps) < cap.max_steps:
            res = max(1.0, cap.resolution * lo) if is_users else cap.resolution * lo
            if hi - lo <= res:
                break
            mid = norm((lo + hi) / 2)
            if mid <= lo or mid >= hi:
                break
            if step(mid, "bisect"):
                lo = mid
            else:
                hi = mid
    result["capacity"] = lo
    result["first_failing"] = hi
    best = next((s for s in steps if s["load"] == lo), None)
    result["goodput_at_capacity"] = best["summary"]["throughput"]["goodput_requests_per_s"] if best else None
    result["saturation_not_reached"] = hi is None and lo is not None
    result["complete"] = True
    result["wall_s"] = round(time.monotonic() - t_start, 2)
    images = plot_capacity(out, result)
    write_json(out / "capacity.json", result)
    write_capacity_report(out, result, images)
    write_capacity_junit(out, result)
    return result


def write_capacity_junit(out: Path, result: dict[str, Any]) -> Path:
    """junit.xml for a search: `capacity_found` fails when not even the smallest load meets the SLOs."""
    from sglfleet.pipeline.reports import Case, write_junit

    knee = result["capacity"]
    steps = [{k: s[k] for k in ("index", "phase", "load", "passed", "why")} for s in result["steps"]]
    msg = (f"capacity {knee:g} {result['mode']} meets the SLOs {result['slo']}" if knee is not None
           else f"not even {result['steps'][0]['load'] if result['steps'] else '?'} {result['mode']} meets the SLOs "
                f"{result['slo']}")
    cases = [Case("complete", "capacity", bool(result["complete"]), result.get("error") or "search completed",
                  time_s=result["wall_s"]),
             Case("capacity_found", "capacity", knee is not None, msg, details={"steps": steps},
                  time_s=result["wall_s"], skipped=not result["complete"])]
    return write_junit(out / "junit.xml", "capacity", cases)
