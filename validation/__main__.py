"""Command line of the gate.

  python -m validation run --target URL [--config FILE] [--out DIR] [--model NAME] [--temperatures 0,0.8]
  python -m validation check-text FILE.jsonl [--config FILE]
  python -m validation record-baseline --target URL --out FILE.json [--config FILE]
  python -m validation sweep --grid GRID.yaml [--host embedded|BASELINE_URL] [--out DIR]

Exit codes: 0 pass, 1 fail, 2 usage error or unreachable target.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeline.errors import EXIT_FAIL, EXIT_OK, UsageError, cli_main
from pipeline.reports import new_run_dir, utc_now, write_json
from validation.config import GateConfig, load_gate_config
from validation.detectors import score_text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    o: dict[str, Any] = {}
    if getattr(args, "model", None):
        o["model"] = args.model
    if getattr(args, "temperatures", None):
        try:
            o["temperatures"] = [float(x) for x in args.temperatures.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--temperatures must be comma-separated numbers, got {args.temperatures!r}") from None
    if getattr(args, "baseline", None):
        o["lossless"] = {"baseline": args.baseline}
    return o


def cmd_run(args: argparse.Namespace) -> int:
    from validation.gate import run_gate

    cfg = load_gate_config(args.config, _overrides(args))
    out = Path(args.out) if args.out else new_run_dir("runs", "gate")
    console = Console(stderr=True)
    result = run_gate(args.target, cfg, out_dir=out, console=console)
    print(f"reports: {out}/report.json  {out}/junit.xml  {out}/report.html", file=sys.stderr)
    print(json.dumps({"verdict": result.summary["verdict"], "out": str(out),
                      "failed_checks": result.summary["failed_checks"]}))
    return EXIT_OK if result.passed else EXIT_FAIL


def cmd_check_text(args: argparse.Namespace) -> int:
    cfg = load_gate_config(args.config) if args.config else GateConfig()
    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"file not found: {path}")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise UsageError(f"{path}:{n}: not a JSON object") from None
        if not isinstance(obj, dict) or "id" not in obj or not isinstance(obj.get("text"), str):
            raise UsageError(f"{path}:{n}: each line needs \"id\" and a string \"text\"")
        rows.append(obj)
    any_bad = False
    for obj in rows:
        findings = score_text(obj["text"], cfg.thresholds)
        any_bad |= bool(findings)
        print(json.dumps({"id": obj["id"], "ok": not findings,
                          "reasons": [f"{f.check}: {f.reason}" for f in findings]}, ensure_ascii=False))
    return EXIT_FAIL if any_bad else EXIT_OK


def cmd_record_baseline(args: argparse.Namespace) -> int:
    """Record T=0 answers of a non-speculative deployment for the lossless check."""
    from validation.gate import Gate

    cfg = load_gate_config(args.config, {**_overrides(args), "temperatures": [0.0]})
    cfg = cfg.model_copy(update={"determinism": cfg.determinism.model_copy(update={"enabled": False}),
                                 "variation": cfg.variation.model_copy(update={"enabled": False})})
    gate = Gate(args.target, cfg, Console(stderr=True))
    result = gate.run()
    errors = [s for s in result.samples if s.error]
    if errors:
        raise UsageError(f"baseline target failed {len(errors)} requests: {errors[0].error}")
    if not result.passed:
        failed = ", ".join(c.name for c in result.failed_cases)
        raise UsageError(f"baseline answers fail the gate's own checks ({failed}): refusing to record them")
    answers = {s.prompt_id: s.text for s in result.samples if s.purpose == "suite"}
    write_json(args.out, {"model": result.model, "target": result.target, "server_kind": result.server_kind,
                          "suite": Path(cfg.suite).name, "max_tokens": cfg.max_tokens, "recorded": utc_now(),
                          "answers": answers})
    print(json.dumps({"baseline": args.out, "model": result.model, "answers": len(answers)}))
    return EXIT_OK


def cmd_sweep(args: argparse.Namespace) -> int:
    from validation.sweep import load_sweep_config, run_sweep, sweep_overrides

    cfg = load_sweep_config(args.grid, sweep_overrides(args.host))
    out = Path(args.out) if args.out else new_run_dir("runs", "sweep")
    summary = run_sweep(cfg, out, Console(stderr=True))
    best = summary["recommendation"]
    print(json.dumps({"recommendation": best["cell"] if best else None, "settings": best["settings"] if best else None,
                      "passed": summary["passed"], "cells": summary["cells"], "out": str(out)}))
    return EXIT_OK if best else EXIT_FAIL


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m validation", description="Pre-promotion validation gate.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="gate a live OpenAI-compatible target")
    r.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:30000")
    r.add_argument("--config", help="YAML with a `gate:` section (see validation/profiles/)")
    r.add_argument("--out", help="report directory (default runs/gate-<timestamp>)")
    r.add_argument("--model", help="model name (default: the first from /v1/models)")
    r.add_argument("--temperatures", help="comma-separated, overrides the config")
    r.add_argument("--baseline", help="baseline JSON for the lossless T=0 check")
    c = sub.add_parser("check-text", help="score texts offline: one JSON line per input line")
    c.add_argument("file")
    c.add_argument("--config")
    b = sub.add_parser("record-baseline", help="record T=0 answers of a non-speculative deployment")
    b.add_argument("--target", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--config")
    b.add_argument("--model")
    w = sub.add_parser("sweep", help="gate a grid of speculative configurations and recommend one")
    w.add_argument("--grid", required=True, help="YAML with a `sweep:` section (see validation/grids/)")
    w.add_argument("--host", help="'embedded' (default) or the baseline URL for an endpoints grid")
    w.add_argument("--out")
    args = ap.parse_args(argv)
    return {"run": cmd_run, "check-text": cmd_check_text, "record-baseline": cmd_record_baseline,
            "sweep": cmd_sweep}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
