"""Load tests and capacity search against an OpenAI-compatible streaming endpoint.

    python -m sglfleet.loadtests run      --host URL [--users N | --rate R] [--duration S] [--out DIR] ...
    python -m sglfleet.loadtests capacity --host URL [--slo-ttft-ms MS --slo-itl-ms MS --max-error-rate F] [--quick]
    python -m sglfleet.loadtests ui       --host URL          # Locust web UI with the same locustfile

Exit codes: 0 ok (capacity: a load meeting the SLOs was found), 1 SLOs not met (run with
--check-slo; capacity: not even the smallest load meets them), 2 bad input / unreachable target /
incomplete run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from sglfleet.loadtests.config import LoadTestConfig, Step, load_loadtest_config
from sglfleet.pipeline.errors import EXIT_FAIL, EXIT_OK, UsageError, cli_main
from sglfleet.pipeline.reports import new_run_dir


def _steps(text: str) -> list[dict[str, Any]]:
    """'2:10,4:10' -> [{'users': 2, 'duration_s': 10}, ...]."""
    steps = []
    for part in text.split(","):
        try:
            users, dur = part.split(":")
            steps.append(Step(users=int(users), duration_s=float(dur)).model_dump(exclude_none=True))
        except ValueError:
            raise UsageError(f"--steps: expected USERS:SECONDS[,USERS:SECONDS...], got '{part}'") from None
    return steps


def _add_common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--host", help="target base URL, e.g. http://127.0.0.1:30000 (required; no default)")
    ap.add_argument("--config", help="YAML file with a `loadtest:` section")
    ap.add_argument("--out", help="run directory (default runs/<stage>-<timestamp>)")
    ap.add_argument("--model")
    ap.add_argument("--processes", type=int, help="Locust worker processes (master/worker mode when > 1)")
    ap.add_argument("--workload", choices=["builtin", "synthetic", "jsonl", "prefix-cache"])
    ap.add_argument("--dataset", help="JSONL file (implies --workload jsonl)")
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--input-tokens", type=int, help="synthetic prompt length (tokens)")
    ap.add_argument("--output-tokens", type=int, help="synthetic output length (tokens)")
    ap.add_argument("--max-requests", type=int)
    ap.add_argument("--timeout", type=float, help="per-request timeout (s)")
    ap.add_argument("--slo-ttft-ms", type=float)
    ap.add_argument("--slo-itl-ms", type=float)
    ap.add_argument("--max-error-rate", type=float)
    ap.add_argument("--itl-events", choices=["each", "mean", "off"])
    ap.add_argument("--stall-timeout", type=float, help="no bytes for this many seconds fails a request (stall)")
    ap.add_argument("--reuse-prompts", action="store_true", help="synthetic: the same prompts as every run with "
                    "this seed (default: new prompts each run, so the prefix cache of an earlier run does not help)")
    key = ap.add_mutually_exclusive_group()
    key.add_argument("--api-key-file", help="file holding the target's API key (Locust users send it)")
    key.add_argument("--api-key-env", help="environment variable holding the target's API key")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    wl = {k: v for k, v in {"kind": args.workload or ("jsonl" if args.dataset else None), "dataset": args.dataset,
                            "max_tokens": args.max_tokens, "input_tokens": args.input_tokens,
                            "output_tokens": args.output_tokens,
                            "reuse_prompts": True if args.reuse_prompts else None}.items() if v is not None}
    slo = {k: v for k, v in {"ttft_p95_ms": args.slo_ttft_ms, "itl_p95_ms": args.slo_itl_ms,
                             "max_error_rate": args.max_error_rate}.items() if v is not None}
    ov: dict[str, Any] = {k: v for k, v in {
        "host": args.host, "model": args.model, "processes": args.processes, "max_requests": args.max_requests,
        "request_timeout_s": args.timeout, "itl_events": args.itl_events, "request_stall_s": args.stall_timeout,
        }.items() if v is not None}
    if args.api_key_file or args.api_key_env:  # one source: the command line's replaces the config file's
        ov["api_key_file"], ov["api_key_env"] = args.api_key_file, args.api_key_env
    if wl:
        ov["workload"] = wl
    if slo:
        ov["slo"] = slo
    return ov


def _config(args: argparse.Namespace, extra: dict[str, Any], preset: dict[str, Any] | None = None) -> LoadTestConfig:
    """Defaults <- --config file <- `preset` (--quick) <- the command line's own flags (`extra` and the
    common ones): a flag given explicitly always wins over the preset."""
    from sglfleet.loadtests.config import with_api_key
    from sglfleet.pipeline.config import deep_merge

    cfg = with_api_key(load_loadtest_config(args.config, deep_merge(preset or {}, deep_merge(_overrides(args),
                                                                                           extra))))
    if not cfg.host:
        raise UsageError("no target: pass --host URL (or HOST=... to make); there is no default target")
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    from sglfleet.loadtests.report import write_run_report
    from sglfleet.loadtests.runner import run_loadtest

    extra: dict[str, Any] = {k: v for k, v in {"users": args.users, "duration_s": args.duration,
                                               "rate": args.rate, "arrival": args.arrival,
                                               "warmup_s": args.warmup, "spawn_rate": args.spawn_rate}.items()
                             if v is not None}
    if args.steps:
        extra["steps"] = _steps(args.steps)
    cfg = _config(args, extra)
    out = Path(args.out) if args.out else new_run_dir("runs", "loadtest")
    out.mkdir(parents=True, exist_ok=True)
    summary = run_loadtest(cfg, out)
    write_run_report(out, summary)
    t, i = summary["ttft_ms"], summary["itl_ms"]
    running = summary["requests"].get("in_flight_at_stop") or 0
    print(f"loadtest: {summary['requests']['ok']}/{summary['requests']['total']} ok"
          f"{f' ({running} still running at the stop, not counted)' if running else ''}, "
          f"{summary['throughput']['requests_per_s']:.2f} req/s, "
          f"{summary['throughput']['output_tok_per_s']:.1f} tok/s, TTFT p95 {t['p95']} ms, "
          f"ITL p95 {i['p95']} ms, SLO {'met' if summary['slo']['met'] else 'NOT met'} -> {out}/summary.json")
    if args.check_slo and not summary["slo"]["met"]:
        return EXIT_FAIL
    return EXIT_OK


def capacity_config(args: argparse.Namespace) -> LoadTestConfig:
    """The capacity search's config: `--quick` is a preset under the explicit flags."""
    from sglfleet.loadtests.capacity import QUICK

    cap = {k: v for k, v in {"mode": args.mode, "start": args.start, "max_load": args.max_load,
                             "step_duration_s": args.step_duration, "warmup_s": args.warmup,
                             "min_samples": args.min_samples, "max_step_s": args.max_step_s}.items()
           if v is not None}
    return _config(args, {"capacity": cap} if cap else {}, preset=QUICK if args.quick else None)


def cmd_capacity(args: argparse.Namespace) -> int:
    from sglfleet.loadtests.capacity import run_capacity

    cfg = capacity_config(args)
    out = Path(args.out) if args.out else new_run_dir("runs", "capacity")
    out.mkdir(parents=True, exist_ok=True)
    result = run_capacity(cfg, out, log=lambda m: print(m, flush=True))
    best = result["capacity"]
    fail = result["first_failing"]
    beyond = (f"first failing {fail:g}" if fail is not None
              else f"not saturated up to max_load {cfg.capacity.max_load:g}")
    print(f"capacity: {result['mode']} = {best if best is not None else 'none'} meets the SLOs "
          f"({beyond}); report {out}/capacity.html")
    return EXIT_OK if best is not None else EXIT_FAIL


def cmd_ui(args: argparse.Namespace) -> int:
    from sglfleet.loadtests.runner import child_env, locust_command, preflight, validate_workload, write_settings

    cfg = _config(args, {k: v for k, v in {"users": args.users, "duration_s": args.duration}.items()
                         if v is not None})
    validate_workload(cfg)
    info = preflight(cfg)
    out = Path(args.out) if args.out else new_run_dir("runs", "loadtest-ui")
    settings = write_settings(cfg, out, info)
    cmd = [*locust_command(cfg, out, web_ui=True), "--web-host", args.web_host, "--web-port", str(args.web_port)]
    print(f"Locust web UI on http://{args.web_host}:{args.web_port} (runs bounded to {cfg.duration_s:g}s and "
          f"{cfg.max_requests} requests); Ctrl-C to quit", flush=True)
    return subprocess.call(cmd, env=child_env(settings, out, cfg.api_key))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglfleet.loadtests", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="one bounded headless load test")
    _add_common(run)
    run.add_argument("--users", type=int, help="concurrent users (rate mode: arrival generators)")
    run.add_argument("--spawn-rate", type=float)
    run.add_argument("--duration", type=float, help="seconds")
    run.add_argument("--rate", type=float, help="open-loop request rate (req/s)")
    run.add_argument("--arrival", choices=["constant", "poisson"])
    run.add_argument("--steps", help="step ramp USERS:SECONDS,... (LoadTestShape)")
    run.add_argument("--warmup", type=float, help="seconds left out of the summary")
    run.add_argument("--check-slo", action="store_true", help="exit 1 when the SLOs are not met")
    cap = sub.add_parser("capacity", help="largest load meeting the SLOs (bracket, then bisect)")
    _add_common(cap)
    cap.add_argument("--quick", action="store_true", help="short steps and small loads (CI / embedded target)")
    cap.add_argument("--mode", choices=["users", "rate"])
    cap.add_argument("--start", type=float)
    cap.add_argument("--max-load", type=float)
    cap.add_argument("--step-duration", type=float)
    cap.add_argument("--warmup", type=float)
    cap.add_argument("--min-samples", type=int)
    cap.add_argument("--max-step-s", type=float)
    ui = sub.add_parser("ui", help="Locust web UI with the same locustfile")
    _add_common(ui)
    ui.add_argument("--users", type=int)
    ui.add_argument("--duration", type=float)
    ui.add_argument("--web-host", default="127.0.0.1")
    ui.add_argument("--web-port", type=int, default=8089)
    return ap


@cli_main
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return {"run": cmd_run, "capacity": cmd_capacity, "ui": cmd_ui}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
