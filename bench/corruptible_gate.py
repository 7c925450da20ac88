"""The real gate against the corruptible engine: correct, and with each injected verify-pass fault.

    python bench/corruptible_gate.py [--config testbed/corruptible/gate-profile.yaml] [--baseline-url URL]
        [--modes none,mask_width,rope_offset,stale_kv,foreign_kv,row_stride] [--budget 5] [--topk 4]
        [--parallel N] [--out docs/results/corruptible-gate-DATE.json]
    python bench/corruptible_gate.py --refresh docs/results/corruptible-gate-DATE.json   # summaries from the reports

The baseline is --baseline-url, or else the same engine served target-only (started once for the whole
bench). Its answers are recorded once with `python -m sglfleet.validation record-baseline --config PROFILE`; then each
mode starts the engine (testbed/corruptible, a child process) with that fault and runs
`python -m sglfleet.validation run --target URL --config C --baseline FILE` unchanged as a whole process, C being the
profile with `baseline_url` set to the baseline server (re-anchoring near-ties, speed). `--parallel N` runs N
modes at once (each its own engine and gate process). A mode `NAME@bB` runs fault NAME at budget B (e.g.
`mask_width@b7`: w = 8, where that bug is harmless). One JSON file records, per mode, the verdict, the exit
code, the failing check names, the gate's duration and its accept length, with the command, date, machine
and commit; it is rewritten after every mode, so an interrupted bench keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.history import raw_header  # noqa: E402
from testbed.corruptible.engine import FAULTS  # noqa: E402
from testbed.corruptible.server import CorruptibleServer  # noqa: E402

DEFAULT_CONFIG = REPO / "testbed" / "corruptible" / "gate-profile.yaml"


def parse_mode(mode: str, budget: int) -> tuple[str | None, int]:
    """'none' | FAULT | FAULT@bB -> (fault or None, budget); ValueError for anything else."""
    name, _, b = mode.partition("@b")
    if name != "none" and name not in FAULTS:
        raise ValueError(f"unknown mode {mode!r}: none or one of {', '.join(FAULTS)} (optionally @b<budget>)")
    if b and not b.isdigit():
        raise ValueError(f"mode {mode!r}: the budget after @b must be a number")
    return (None if name == "none" else name), int(b) if b else budget


def likelihood_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """Per T>0 temperature of a gate report: the likelihood verdict's p-values, support and sample counts."""
    out: dict[str, Any] = {}
    for c in doc.get("cases", []):
        if not c["name"].startswith("likelihood@"):
            continue
        d = c.get("details") or {}
        st = d.get("statistic") or {}
        out[c["name"].split("@", 1)[1]] = {
            "ok": c["ok"], "p_value": d.get("p_value"), "alpha_per_statistic": st.get("alpha_per_statistic"),
            "mean_nll_p": (st.get("mean_nll") or {}).get("p_value"), "mean_nll_z": (st.get("mean_nll") or {}).get("z"),
            "worst_window_p": (st.get("worst_window_nll") or {}).get("p_value"),
            "pit_lag1_p": (st.get("pit_lag1") or {}).get("p_value"), "pit_lag1_z": (st.get("pit_lag1") or {}).get("z"),
            "min_log_p_T": (d.get("support") or {}).get("min_log_p_T"),
            "n_candidate": d.get("n_candidate"), "n_baseline": d.get("n_baseline"), "on_ids": d.get("on_ids"),
            "message": c["message"][:300], **_per_token(d.get("per_token"))}
    return out


def _per_token(tok: Any) -> dict[str, Any]:
    """The per-token test's numbers (validation/tokenlaw.py) of one likelihood verdict, where it ran."""
    if not isinstance(tok, dict):
        return {}
    pw = tok.get("power") or {}
    return {"per_token": {
        "ok": tok.get("ok"), "tokens": tok.get("n_candidate"), "ks_p": tok.get("ks_p"), "mean_u": tok.get("mean_u"),
        "mean_p": tok.get("mean_p"), "outside": tok.get("outside_candidate"),
        "outside_baseline": tok.get("outside_baseline"), "outside_p": tok.get("outside_p"),
        "noise_allowance": tok.get("noise_allowance"),
        "dispersion": tok.get("dispersion"), "dispersion_p": tok.get("dispersion_p"),
        "edge": tok.get("edge_candidate"), "edge_expected": tok.get("edge_expected_candidate"),
        "edge_baseline": tok.get("edge_baseline"), "edge_expected_baseline": tok.get("edge_expected_baseline"),
        "edge_p": tok.get("edge_p") if tok.get("alpha_edge") else None,
        "serial_z": tok.get("serial_z") if tok.get("alpha_serial") else None,
        "serial_p": tok.get("serial_p") if tok.get("alpha_serial") else None,
        "min_rate": {f: v.get("min_rate") for f, v in (pw.get("families") or {}).items()},
        "min_mean_tv": pw.get("min_mean_tv_all_families")}}


def refresh(raw_path: Path) -> int:
    """Re-read every run's report.json (its `out` folder) into an existing raw file's summaries."""
    raw = json.loads(raw_path.read_text())
    for row in raw["runs"]:
        rep = Path(row.get("out", "")) / "report.json"
        if not rep.is_file():
            print(f"error: {rep} is gone: cannot refresh {raw_path}", file=sys.stderr)
            return 2
        row["likelihood"] = likelihood_summary(json.loads(rep.read_text()))
    raw["refreshed"] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "what": "likelihood (from each report.json)"}
    raw_path.write_text(json.dumps(raw, indent=2) + "\n")
    return 0


def run_gate(url: str, config: Path, baseline: Path, out: Path, env: dict[str, str]) -> dict[str, Any]:
    """One whole `python -m sglfleet.validation run`; its verdict line and report, summarised."""
    t0 = time.perf_counter()
    with open(out / "gate.stderr.log", "w") as err:  # the gate's progress, readable while it runs
        p = subprocess.run([sys.executable, "-m", "sglfleet.validation", "run", "--target", url, "--config",
                            str(config),
                            "--baseline", str(baseline), "--out", str(out)], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=err, text=True)
    wall = time.perf_counter() - t0
    stderr = (out / "gate.stderr.log").read_text(errors="replace")
    row: dict[str, Any] = {"rc": p.returncode, "wall_s": round(wall, 1)}
    line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("{")), None)
    if line is None:
        row["error"] = (stderr.strip().splitlines() or ["no output"])[-1][:400]
        return row
    row.update(json.loads(line))
    rep = out / "report.json"
    if rep.is_file():
        doc = json.loads(rep.read_text())
        s = doc["summary"]
        row.update({"duration_s": s.get("duration_s"), "requests": s.get("requests"),
                    "request_errors": s.get("request_errors"), "judge_s": s.get("judge_s"),
                    "skipped_checks": [c["name"] for c in s.get("skipped_checks") or []]})
        row["failed"] = {c["name"]: c["message"][:300] for c in doc["cases"] if not c["ok"] and not c.get("skipped")}
        spec = next((c for c in doc["cases"] if c["name"] == "spec_accept_length"), None)
        if spec:
            row["spec_accept_length"] = spec["message"]
        row["likelihood"] = likelihood_summary(doc)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="gate profile (YAML with a `gate:` section)")
    ap.add_argument("--baseline-url", help="target-only server of the same model (default: the engine, target-only)")
    ap.add_argument("--modes", default=",".join(["none", *FAULTS]))
    ap.add_argument("--budget", type=int, default=None, help="engine budget (default: the engine's)")
    ap.add_argument("--topk", type=int, default=None)
    ap.add_argument("--out", default=str(REPO / "docs" / "results" /
                                         f"corruptible-gate-{time.strftime('%Y-%m-%d')}.json"))
    ap.add_argument("--parallel", type=int, default=1, help="modes run at once")
    ap.add_argument("--runs-dir", default=str(REPO / "runs" / "corruptible-gate"))
    ap.add_argument("--production", action="store_true",
                    help="the README's production sequence: each gate gets the recorded baseline file and nothing "
                         "else (no live target-only server: the reference scorer, re-anchoring on the candidate)")
    ap.add_argument("--refresh", metavar="RAW", help="only re-read the runs' reports into this raw file's summaries")
    args = ap.parse_args()
    if args.refresh:
        return refresh(Path(args.refresh))
    from testbed.corruptible.engine import EngineConfig

    budget = args.budget or EngineConfig.model_fields["budget"].default
    try:
        modes = [(m, *parse_mode(m.strip(), budget)) for m in args.modes.split(",") if m.strip()]
        profile = yaml.safe_load(Path(args.config).read_text())
    except (ValueError, OSError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not isinstance(profile, dict) or not isinstance(profile.get("gate"), dict):
        print(f"error: {args.config} has no `gate:` section", file=sys.stderr)
        return 2
    runs = Path(args.runs_dir) / time.strftime("%Y%m%dT%H%M%S")
    runs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")  # the gate's judge too (shared cores)
    result: dict[str, Any] = {
        **raw_header("bench/corruptible_gate.py"),
        "config": os.path.relpath(args.config, REPO), "profile": profile, "baseline_url": args.baseline_url,
        "engine": {"budget": budget, "topk": args.topk or EngineConfig.model_fields["topk"].default}, "runs": []}
    baseline = None
    try:
        if args.baseline_url:
            base_url = args.baseline_url
        else:
            baseline = CorruptibleServer(speculative=False, log_path=runs / "baseline.log").start()
            base_url = baseline.url
            result["baseline"] = "testbed.corruptible --target-only (the same numpy model, no speculation)"
        cfg_doc = {**profile, "gate": {**profile["gate"],
                                       **({} if args.production else {"baseline_url": base_url})}}
        result["production_sequence"] = bool(args.production)
        cfg_path = runs / "gate-config.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg_doc, sort_keys=False))
        base_file = runs / "baseline.json"
        print(f"[corruptible-gate] recording the baseline from {base_url}", flush=True)
        t0 = time.perf_counter()
        with open(runs / "record-baseline.log", "w") as err:
            rec = subprocess.run([sys.executable, "-m", "sglfleet.validation", "record-baseline", "--target", base_url,
                                  "--config", str(Path(args.config).resolve()), "--out", str(base_file)], cwd=REPO,
                                 env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        if rec.returncode != 0:
            tail = (runs / "record-baseline.log").read_text(errors="replace").strip().splitlines()
            print(f"error: record-baseline failed (rc {rec.returncode}): {tail[-1] if tail else ''}", file=sys.stderr)
            return 1
        result["record_baseline"] = {"wall_s": round(time.perf_counter() - t0, 1),
                                     **json.loads(rec.stdout.strip().splitlines()[-1])}

        def one(mode: str, fault: str | None, b: int) -> dict[str, Any]:
            out = runs / mode.replace("@", "-")
            out.mkdir(parents=True, exist_ok=True)
            print(f"[corruptible-gate] {mode}: starting the engine (fault {fault or 'none'}, budget {b})", flush=True)
            with CorruptibleServer(fault=fault, budget=b, topk=args.topk, log_path=out / "engine.log") as url:
                row = {"mode": mode, "fault": fault, "budget": b, "verify_width": b + 1,
                       **run_gate(url, cfg_path, base_file, out, env)}
            print(f"[corruptible-gate] {mode}: {row.get('verdict')} rc={row['rc']} failed={row.get('failed_checks')} "
                  f"in {row['wall_s']}s", flush=True)
            return row

        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            for row in pool.map(lambda m: one(*m), modes):
                result["runs"].append(row)
                result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
                Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if baseline is not None:
            baseline.stop()
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
