"""The gate's wall time and verdict in its two modes, side by side on the embedded target.

    python bench/gate_modes.py [--pairs 3] [--config validation/profiles/embedded.yaml] [--out FILE.json]

Starts the embedded target once and records a baseline of it (`record-baseline`, the target-only answers the
oracle mode compares against: T=0 with log-probs, T>0 with `likelihood.baseline_seeds`). Then runs pairs of
whole `python -m sglfleet.validation run` processes in alternating order: the weaker mode (no baseline: detectors and
the fluency judge decide, the gate of before the oracle) and the oracle mode (`--baseline`: lossless_t0 at
T=0, the target's likelihood at T>0). Each run's wall time, verdict, failed checks and verdict modes are kept,
with the machine's load; the medians and their ratio are measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.history import raw_header  # noqa: E402
from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer  # noqa: E402


def _run(cmd: list[str], out: Path) -> dict[str, object]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    row: dict[str, object] = {"wall_s": round(wall, 1), "rc": p.returncode, "load": round(os.getloadavg()[0], 2)}
    if (out / "report.json").is_file():
        s = json.loads((out / "report.json").read_text())["summary"]
        row.update(verdict=s["verdict"], failed=s["failed_checks"], modes=s.get("verdict_mode"),
                   judge_s=s.get("judge_s"), gate_s=s.get("duration_s"), requests=s.get("requests"))
    else:
        row["error"] = p.stderr.strip().splitlines()[-1:] if p.stderr.strip() else "no report"
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--config", default=str(REPO / "src" / "sglfleet" / "validation" / "profiles" / "embedded.yaml"))
    ap.add_argument("--out", default=str(REPO / "docs" / "results" / f"gate-modes-{time.strftime('%Y-%m-%d')}.json"))
    ap.add_argument("--port", type=int, default=18690)
    args = ap.parse_args()
    if args.pairs < 1:
        print("error: --pairs must be at least 1", file=sys.stderr)
        return 2
    work = REPO / "runs" / "bench-gate-modes"
    work.mkdir(parents=True, exist_ok=True)
    base = work / "baseline.json"
    py = [sys.executable, "-m", "sglfleet.validation"]
    pairs: list[dict[str, object]] = []
    result: dict[str, object] = {}
    with EmbeddedServer(EmbeddedConfig(port=args.port), work / "server") as srv:
        t0 = time.perf_counter()
        rec = subprocess.run([*py, "record-baseline", "--target", srv.url, "--config", args.config, "--out", str(base)],
                             cwd=REPO, capture_output=True, text=True)
        if rec.returncode != 0:
            print(f"error: record-baseline failed: {rec.stderr.strip()[-400:]}", file=sys.stderr)
            return 1
        record_s = round(time.perf_counter() - t0, 1)
        for i in range(args.pairs):
            pair: dict[str, object] = {}
            for mode in (["detectors", "oracle"] if i % 2 == 0 else ["oracle", "detectors"]):
                out = work / f"pair{i}-{mode}"
                cmd = [*py, "run", "--target", srv.url, "--config", args.config, "--out", str(out)]
                if mode == "oracle":
                    cmd += ["--baseline", str(base)]
                pair[mode] = _run(cmd, out)
                print(f"pair {i} {mode}: {pair[mode]}", flush=True)
            pairs.append(pair)
            walls = {m: [float(p[m]["wall_s"]) for p in pairs] for m in ("detectors", "oracle")}  # type: ignore[index]
            result = {
                **raw_header("bench/gate_modes.py"), "config": args.config,
                "record_baseline_s": record_s, "pairs": pairs,
                "median_s": {m: round(statistics.median(w), 1) for m, w in walls.items()},
                "median_ratio_oracle_over_detectors": round(statistics.median(
                    o / d for o, d in zip(walls["oracle"], walls["detectors"], strict=True)), 3),
                "verdicts": {m: [p[m].get("verdict") for p in pairs] for m in ("detectors", "oracle")},  # type: ignore[union-attr]
                "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_s", "median_ratio_oracle_over_detectors", "verdicts")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
