"""Time to verdict of the full gate against the embedded target (median of several runs).

    python bench/gate_time.py [--runs 3] [--config validation/profiles/embedded.yaml] [--out FILE]

Starts the embedded target once, runs `python -m validation run` against it --runs times as whole
processes, and records each wall time, the median, min and max, the machine and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.embedded import EmbeddedConfig, EmbeddedServer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--config", default=str(REPO / "validation" / "profiles" / "embedded.yaml"))
    ap.add_argument("--out", default=str(REPO / "docs" / "gate-time.json"))
    args = ap.parse_args()
    walls, verdicts = [], []
    with EmbeddedServer(EmbeddedConfig(port=18680), REPO / "runs" / "bench-gate") as srv:
        for i in range(args.runs):
            cmd = [sys.executable, "-m", "validation", "run", "--target", srv.url, "--config", args.config,
                   "--out", str(REPO / "runs" / "bench-gate" / f"run{i}")]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            walls.append(time.perf_counter() - t0)
            verdicts.append(json.loads(p.stdout.strip().splitlines()[-1])["verdict"] if p.stdout.strip() else p.stderr)
            print(f"run {i}: {walls[-1]:.1f}s {verdicts[-1]}", flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "command": "python bench/gate_time.py " + " ".join(sys.argv[1:]),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "load_average_at_end": [round(x, 2) for x in os.getloadavg()], "runs": args.runs,
              "median_s": round(statistics.median(walls), 1), "min_s": round(min(walls), 1),
              "max_s": round(max(walls), 1), "walls_s": [round(w, 1) for w in walls], "verdicts": verdicts}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
