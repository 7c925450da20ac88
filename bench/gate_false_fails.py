"""False fails from real gate runs: a correct build gated again and again in the production sequence.

    python bench/gate_false_fails.py --runs 10 [--config validation/profiles/embedded.yaml] [--target URL]
        [--baseline FILE] [--out docs/results/gate-false-fails-DATE.json]

The candidate is the target itself (the embedded SmolLM2 on llama.cpp, started here unless --target names a
server), so every refusal is a false fail. One baseline file is recorded (`record-baseline`), then each run is
`python -m sglfleet.validation run --target URL --config C --baseline FILE`, unchanged, as a whole process, C being the
profile with fresh candidate seeds (`likelihood.seeds`: disjoint per run and from the baseline's) so no two runs
share a sampler stream. One JSON file records, per run, the verdict, the exit code, the failing checks and, per
T>0 temperature, the per-token test's numbers and the answer statistics' p-values, with the command, date,
machine and commit; it is rewritten after every run, so an interrupted bench keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.history import raw_header, write_raw  # noqa: E402


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """A gate report's verdict, failing checks and per-temperature likelihood numbers."""
    out: dict[str, Any] = {"verdict": report["summary"]["verdict"],
                           "failed": {c["name"]: c["message"][:300] for c in report["cases"]
                                      if not c["ok"] and not c.get("skipped")},
                           "likelihood": {}}
    for c in report["cases"]:
        if not c["name"].startswith("likelihood@"):
            continue
        d = c.get("details") or {}
        tok = d.get("per_token") or {}
        stats = d.get("statistic") or {}
        out["likelihood"][c["name"]] = {
            "ok": c["ok"], "tokens": tok.get("n_candidate"), "ks_d": tok.get("ks_d"), "ks_p": tok.get("ks_p"),
            "noise_allowance": tok.get("noise_allowance"), "outside": tok.get("outside_candidate"),
            "outside_p": tok.get("outside_p"),
            "min_rate": {f: v.get("min_rate") for f, v in ((tok.get("power") or {}).get("families") or {}).items()},
            "min_mean_tv": (tok.get("power") or {}).get("min_mean_tv_all_families"),
            "mean_u": tok.get("mean_u"), "mean_p": tok.get("mean_p"), "clearly_outside": tok.get("clearly_outside"),
            "dispersion": tok.get("dispersion"), "dispersion_p": tok.get("dispersion_p"),
            "edge_p": tok.get("edge_p") if tok.get("alpha_edge") else None,
            "serial_z": tok.get("serial_z") if tok.get("alpha_serial") else None,
            "serial_p": tok.get("serial_p") if tok.get("alpha_serial") else None,
            "p": {n: (stats.get(n) or {}).get("p_value") for n in ("mean_nll", "worst_window_nll", "pit_lag1")}}
    pooled = next((c for c in report["cases"] if c["name"] == "likelihood_pooled" and not c.get("skipped")), None)
    if pooled is not None:  # the per-token statistics pooled over the temperatures (since 2026-12-05)
        pl = (pooled.get("details") or {}).get("pooled") or {}
        out["pooled"] = {"ok": pooled["ok"], **{k: pl.get(k) for k in ("outside_candidate", "outside_baseline",
                                                                     "outside_p", "edge_p", "serial_z", "serial_p",
                                                                     "cuts")}}
    return out


def refresh(raw_path: Path) -> int:
    """Re-read every run's report.json (runs/<dir>/runNN) into an existing raw file's summaries."""
    raw = json.loads(raw_path.read_text())
    for row in raw["runs"]:
        rep = Path(row["out"]) / "report.json" if row.get("out") else None
        if rep is None or not rep.is_file():
            print(f"error: the report of run {row['run']} is gone: cannot refresh {raw_path}", file=sys.stderr)
            return 2
        row.update(summary(json.loads(rep.read_text())))
    raw["refreshed"] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "what": "summaries from each report.json"}
    raw_path.write_text(json.dumps(raw, indent=2) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--first-run", type=int, default=0,
                    help="the first run's index: its seeds are 900000 + 1000 * index + j, so a later batch that starts "
                         "past an earlier one's last index shares no sampler stream with it")
    ap.add_argument("--config", default=str(REPO / "src" / "sglfleet" / "validation" / "profiles" / "embedded.yaml"))
    ap.add_argument("--target", help="a running target (default: the embedded model, started here)")
    ap.add_argument("--baseline", help="a recorded baseline file (default: recorded here from the target)")
    ap.add_argument("--out", default=str(REPO / "docs" / "results" /
                                         f"gate-false-fails-{time.strftime('%Y-%m-%d')}.json"))
    ap.add_argument("--runs-dir", default=str(REPO / "runs" / "gate-false-fails"))
    ap.add_argument("--refresh", metavar="RAW", help="only re-read each run's report.json into this raw file")
    args = ap.parse_args()
    if args.refresh:
        return refresh(Path(args.refresh))
    if args.runs < 1 or args.first_run < 0:
        print("error: --runs must be at least 1 and --first-run at least 0", file=sys.stderr)
        return 2
    profile = yaml.safe_load(Path(args.config).read_text())
    runs = Path(args.runs_dir) / time.strftime("%Y%m%dT%H%M%S")
    runs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    result: dict[str, Any] = {
        **raw_header("bench/gate_false_fails.py"),
        "config": os.path.relpath(args.config, REPO), "production_sequence": True, "runs": []}
    server = None
    try:
        url = args.target
        if url is None:
            from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer

            server = EmbeddedServer(EmbeddedConfig(port=18480), runs).start()
            url = server.url
        base = Path(args.baseline) if args.baseline else runs / "baseline.json"
        if not args.baseline:
            print(f"[false-fails] recording the baseline from {url}", flush=True)
            t0 = time.perf_counter()
            with open(runs / "record-baseline.log", "w") as err:
                rec = subprocess.run([sys.executable, "-m", "sglfleet.validation", "record-baseline", "--target", url,
                                      "--config", str(Path(args.config).resolve()), "--out", str(base)], cwd=REPO,
                                     env=env, stdout=subprocess.PIPE, stderr=err, text=True)
            if rec.returncode != 0:
                print(f"error: record-baseline failed (rc {rec.returncode}), see {runs / 'record-baseline.log'}",
                      file=sys.stderr)
                return 1
            result["record_baseline"] = {"wall_s": round(time.perf_counter() - t0, 1)}
        gate = profile.get("gate") or {}
        lik = gate.get("likelihood") or {}
        per_side = len(lik.get("seeds") or [1234, 2345, 3456])
        for k in range(args.first_run, args.first_run + args.runs):
            seeds = [900_000 + 1000 * k + j for j in range(per_side)]  # fresh, and disjoint from the baseline's
            cfg = {**profile, "gate": {**gate, "likelihood": {**lik, "seeds": seeds}}}
            out = runs / f"run{k:02d}"
            out.mkdir(parents=True, exist_ok=True)
            cfg_path = out / "gate-config.yaml"
            cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            t0 = time.perf_counter()
            with open(out / "gate.log", "w") as log:
                proc = subprocess.run([sys.executable, "-m", "sglfleet.validation", "run", "--target", url, "--config",
                                       str(cfg_path), "--baseline", str(base), "--out", str(out)], cwd=REPO,
                                      env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
            row: dict[str, Any] = {"run": k, "seeds": seeds, "rc": proc.returncode,
                                   "wall_s": round(time.perf_counter() - t0, 1), "out": str(out)}
            rp = out / "report.json"
            if rp.is_file():
                row.update(summary(json.loads(rp.read_text())))
            result["runs"].append(row)
            refused = sum(1 for r in result["runs"] if r["rc"] != 0)
            result["false_fails"] = {"runs": len(result["runs"]), "refused": refused}
            write_raw(Path(args.out), result)  # after every run: a cut session keeps what it measured
            print(f"[false-fails] run {k}: {row.get('verdict')} rc={row['rc']} failed={sorted(row.get('failed', {}))} "
                  f"in {row['wall_s']}s ({refused} of {len(result['runs'])} refused)", flush=True)
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
