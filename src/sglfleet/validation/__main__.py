"""Command line of the gate.

  python -m sglfleet.validation run --target URL [--config FILE] [--out DIR] [--model NAME] [--temperatures 0,0.8]
  python -m sglfleet.validation check-text FILE.jsonl [--config FILE]
  python -m sglfleet.validation record-baseline --target URL --out FILE.json [--config FILE]
  python -m sglfleet.validation sweep --grid GRID.yaml [--host embedded|BASELINE_URL] [--out DIR]

Exit codes: 0 pass, 1 fail, 2 usage error or unreachable target.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

from sglfleet.pipeline.errors import EXIT_FAIL, EXIT_OK, UsageError, cli_main
from sglfleet.pipeline.reports import new_run_dir, utc_now, write_json
from sglfleet.textscore.detectors import score_text
from sglfleet.validation.config import GateConfig, load_gate_config


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
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
    if getattr(args, "reanchor_url", None):
        o.setdefault("lossless", {})["reanchor_url"] = args.reanchor_url
    if getattr(args, "scorer", None):
        o["likelihood"] = {"scorer": args.scorer}
    if getattr(args, "speculative", False):
        o["spec"] = {"enabled": "on"}
    if getattr(args, "no_judge", False):
        o["judge"] = {"enabled": False}
    if getattr(args, "api_key_file", None):  # the file's path, never the key, goes into the config
        o["api_key_file"], o["api_key_env"] = args.api_key_file, None
    if getattr(args, "api_key_env", None):
        o["api_key_env"], o["api_key_file"] = args.api_key_env, None
    return o


def _add_api_key(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--api-key-file", help="file holding the target's API key (one line); the key itself is never "
                   "taken on the command line nor written to a report")
    g.add_argument("--api-key-env", help="environment variable holding the target's API key (api_key_env)")


def cmd_run(args: argparse.Namespace) -> int:
    from sglfleet.validation.gate import run_gate

    cfg = load_gate_config(args.config, _overrides(args))
    out = Path(args.out) if args.out else new_run_dir("runs", "gate")
    console = Console(stderr=True)
    result = run_gate(args.target, cfg, out_dir=out, console=console)
    print(f"reports: {out}/report.json  {out}/junit.xml  {out}/report.html", file=sys.stderr)
    print(json.dumps({"verdict": result.summary.verdict, "out": str(out),
                      "failed_checks": result.summary.failed_checks}))
    return EXIT_OK if result.passed else EXIT_FAIL


MAX_TEXT_CHARS = 200_000


def _read_items(path: Path) -> list[dict[str, Any]]:
    """One item per non-blank line; a bad line becomes an item with an `error` (never an exception)."""
    items: list[dict[str, Any]] = []
    for n, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            items.append({"line": n, "id": None, "error": f"line {n}: invalid UTF-8 at byte {exc.start}"})
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            items.append({"line": n, "id": None, "error": f"line {n}: not a JSON object"})
            continue
        if not isinstance(obj, dict):
            items.append({"line": n, "id": None, "error": f"line {n}: not a JSON object"})
            continue
        item_id = obj.get("id", f"line-{n}")
        if "id" not in obj:
            items.append({"line": n, "id": None, "error": f"line {n}: no \"id\""})
        elif not isinstance(obj.get("text"), str):
            items.append({"line": n, "id": item_id, "error": f"line {n}: no string \"text\""})
        elif "temperature" in obj and (isinstance(obj["temperature"], bool)
                                       or not isinstance(obj["temperature"], int | float) or obj["temperature"] < 0):
            items.append({"line": n, "id": item_id, "error": f"line {n}: \"temperature\" must be a number >= 0, "
                          f"not {obj['temperature']!r}"})
        elif len(obj["text"]) > MAX_TEXT_CHARS:
            items.append({"line": n, "id": item_id, "error": f"line {n}: text of {len(obj['text'])} characters is "
                          f"over the {MAX_TEXT_CHARS}-character limit of one answer: not scored"})
        else:
            items.append({"line": n, **obj})
    return items


def cmd_check_text(args: argparse.Namespace) -> int:
    cfg = load_gate_config(args.config) if args.config else GateConfig()
    if args.no_judge:
        cfg = cfg.model_copy(update={"judge": cfg.judge.model_copy(update={"enabled": False})})
    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"file not found: {path}")
    items = _read_items(path)
    if not items:
        raise UsageError(f"{path} has no texts to score (empty, or only blank lines): one JSON object per line, "
                         '{"id": ..., "text": ...}')
    judge = None
    if cfg.judge.enabled and any("error" not in it for it in items):
        from sglfleet.textscore.judge import FluencyJudge

        judge = FluencyJudge(cfg.judge).start()
    any_bad, errors = False, []
    try:
        for it in items:
            if "error" in it:
                errors.append(it["error"])
                print(json.dumps({"id": it["id"], "ok": False, "reasons": [], "error": it["error"]},
                                 ensure_ascii=False))
                continue
            findings = score_text(it["text"], cfg.thresholds)
            row: dict[str, Any] = {"id": it["id"], "ok": True, "reasons": []}
            if judge is not None:
                from sglfleet.textscore.judge import judge_verdict, threshold_for

                sc = judge.score(it["text"], it.get("prompt"))
                cls = it.get("prompt_class") or it.get("category")
                limit = threshold_for(cfg.judge, cls if isinstance(cls, str) else None,
                                      prompted=isinstance(it.get("prompt"), str) and bool(it.get("prompt")))
                t = it.get("temperature")
                v = judge_verdict(findings, sc, limit, cfg.judge, float(t) if isinstance(t, int | float) else None)
                findings = v.findings
                if v.excuse:
                    row["excused"] = {"reasons": [f"{f.check}: {f.reason}" for f in v.excused], "why": v.excuse}
                if args.scores:
                    row["fluency"] = {**sc.as_dict(), "limit": limit}
            any_bad |= bool(findings)
            row["ok"] = not findings
            row["reasons"] = [f"{f.check}: {f.reason}" for f in findings]
            print(json.dumps(row, ensure_ascii=False))
    finally:
        if judge is not None:
            judge.stop()
    if errors:
        raise UsageError(f"{len(errors)} bad input line(s) in {path} (reported per item above); first: {errors[0]}")
    return EXIT_FAIL if any_bad else EXIT_OK


def cmd_record_baseline(args: argparse.Namespace) -> int:
    """Record what the gate compares a speculative build against, from the non-speculative deployment: its
    T=0 answers with their token log-probs (lossless_t0) and, for every T>0 of the profile, its sampled
    answers with `likelihood.baseline_seeds` (the likelihood verdict; texts only, scored at gate time)."""
    from sglfleet.validation.baseline import SEED_STREAMS, hot_temperatures, samples_record
    from sglfleet.validation.gate import Gate

    profile = load_gate_config(args.config, _overrides(args))
    hot = hot_temperatures(profile) if profile.likelihood.enabled else []
    cfg = load_gate_config(args.config, {**_overrides(args), "temperatures": [0.0, *hot]})
    # the baseline is the non-speculative deployment: the profile it shares with the speculative one
    # may say `spec.enabled: on` and ask for a lossless baseline; neither applies to the baseline itself
    cfg = cfg.model_copy(update={"determinism": cfg.determinism.model_copy(update={"enabled": False}),
                                 "variation": cfg.variation.model_copy(update={"enabled": False}),
                                 "spec": cfg.spec.model_copy(update={"enabled": "off"}),
                                 "lossless": cfg.lossless.model_copy(update={"enabled": False, "baseline": None}),
                                 "baseline_url": None})
    gate = Gate(args.target, cfg, Console(stderr=True), recording_baseline=True)
    gate.t0_logprobs = cfg.lossless.top_logprobs  # the lossless check's near-ties (validation/lossless.py)
    result = gate.run()
    errors = [s for s in result.samples if s.error]
    if errors:
        raise UsageError(f"baseline target failed {len(errors)} requests: {errors[0].error}")
    # what a correct engine never emits refuses the recording at any temperature; the T>0 detector hits of the
    # target's own samples are what it is: the target's distribution, recorded, not refused
    failed_cases = [c for c in result.failed_cases if not _hot_case(c.name) or c.name.startswith("backstop@")]
    if failed_cases:
        failed = ", ".join(c.name for c in failed_cases)
        raise UsageError(f"baseline answers fail the gate's own checks ({failed}): refusing to record them")
    t0 = [s for s in result.samples if s.purpose == "suite" and s.temperature == 0]
    answers = {s.prompt_id: s.text for s in t0}
    doc: dict[str, Any] = {"model": result.model, "target": result.target, "server_kind": result.server_kind,
                           "suite": Path(cfg.suite).name, "max_tokens": cfg.max_tokens, "recorded": utc_now(),
                           "answers": answers, "logprobs": {s.prompt_id: s.logprobs for s in t0 if s.logprobs},
                           "samples": samples_record(result.samples), "seed_streams": SEED_STREAMS}
    if result.server_kind == "sglang" and doc["samples"]:
        # the baseline server's own prefill log-probs of its T>0 answers: a gate without a live target-only
        # server lets the candidate score (its non-speculative prefill) only after it reproduces these
        from sglfleet.validation.scorers import record_scores

        doc["scores"] = record_scores(args.target, cfg, result.model, gate.api_key, result.samples,
                                      {p.id: p.messages() for p in gate.suite.prompts})
    write_json(args.out, doc)
    print(json.dumps({"baseline": args.out, "model": result.model, "answers": len(answers),
                      "with_logprobs": len(doc["logprobs"]), "samples": len(doc["samples"])}))
    return EXIT_OK


def _hot_case(name: str) -> bool:
    """Whether a case judges answers at a temperature above 0 (`<check>@T<t>`, t > 0)."""
    _, sep, t = name.rpartition("@T")
    try:
        return bool(sep) and float(t) > 0
    except ValueError:
        return False


def cmd_sweep(args: argparse.Namespace) -> int:
    from sglfleet.flow.sweep import load_sweep_config, run_sweep, sweep_overrides

    cfg = load_sweep_config(args.grid, sweep_overrides(args.host))
    out = Path(args.out) if args.out else new_run_dir("runs", "sweep")
    summary = run_sweep(cfg, out, Console(stderr=True))
    best = summary["recommendation"]
    print(json.dumps({"recommendation": best["cell"] if best else None, "settings": best["settings"] if best else None,
                      "passed": summary["passed"], "cells": summary["cells"], "advice": summary["advice"],
                      "out": str(out)}))
    return EXIT_OK if best else EXIT_FAIL


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m sglfleet.validation", description="Pre-promotion validation gate.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="gate a live OpenAI-compatible target")
    r.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:30000")
    r.add_argument("--config", help="YAML with a `gate:` section (see validation/profiles/)")
    r.add_argument("--out", help="report directory (default runs/gate-<timestamp>)")
    r.add_argument("--model", help="model name (default: the first from /v1/models)")
    r.add_argument("--temperatures", help="comma-separated, overrides the config")
    r.add_argument("--baseline", help="baseline JSON for the lossless T=0 check")
    r.add_argument("--reanchor-url", help="target-only server (sglang) to continue from the candidate's text at each "
                   "near-tie, so the lossless check covers the whole answer (lossless.reanchor_url)")
    r.add_argument("--scorer", help="likelihood scorer of the T>0 verdict: 'reference' or the target-only "
                   "SGLang server's URL (likelihood.scorer; default: baseline_url or --reanchor-url when it is SGLang)")
    r.add_argument("--no-judge", action="store_true", help="skip the fluency judge (reported as skipped)")
    r.add_argument("--speculative", action="store_true",
                   help="the deployment uses speculative decoding (spec.enabled: on): lossless baseline required")
    _add_api_key(r)
    c = sub.add_parser("check-text", help="score texts offline: one JSON line per input line")
    c.add_argument("file", help='JSONL: {"id", "text", optional "prompt", "prompt_class", "temperature"} per line '
                   '(a T=0 loop the reference model writes itself is excused only when the temperature is given)')
    c.add_argument("--config")
    c.add_argument("--no-judge", action="store_true", help="text detectors only (no fluency judge)")
    c.add_argument("--scores", action="store_true", help="add the judge's scores to every row")
    b = sub.add_parser("record-baseline", help="record T=0 answers (with log-probs) and T>0 samples of a "
                       "non-speculative deployment: what the gate compares a speculative build against")
    b.add_argument("--target", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--config")
    b.add_argument("--model")
    b.add_argument("--no-judge", action="store_true", help="skip the fluency judge (reported as skipped)")
    _add_api_key(b)
    w = sub.add_parser("sweep", help="gate a grid of speculative configurations and recommend one")
    w.add_argument("--grid", required=True, help="YAML with a `sweep:` section (see validation/grids/)")
    w.add_argument("--host", help="'embedded' (default) or the baseline URL for an endpoints grid")
    w.add_argument("--out")
    args = ap.parse_args(argv)
    return {"run": cmd_run, "check-text": cmd_check_text, "record-baseline": cmd_record_baseline,
            "sweep": cmd_sweep}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
