"""GPU machine only: Locust capacity (`python -m sglfleet.loadtests capacity --quick`) against real sglang servers,
the target alone and DDTree (budget 16, top-k 4, the trained drafter), one after the other on the one GPU.

Servers are rendered and started by the sweep's sglang kind (validation/grids/sglang-smollm2.yaml:
flow.sweep_sglang.server_command / cell_command, pipeline.server_proc.ServerProcess), so the
commands are the ones CI checks with sglang's parser. Needs the environment of
tests/ddtree/gpu_session.sh (`loadtest` step): the patched sglang + plugin on PYTHONPATH and Locust's
wheels (.carry/locust-py, tests/ddtree/make_locust_carry.sh) installed.

    python3 tests/ddtree/loadtest_real.py --out $OUT/loadtest
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from sglfleet.flow.sweep import load_sweep_config  # noqa: E402
from sglfleet.flow.sweep_sglang import cell_command, cell_server, server_command  # noqa: E402

GRID = ROOT / "src" / "sglfleet" / "validation" / "grids" / "sglang-smollm2.yaml"


# A GPU-sized capacity search (the CI `--quick` one tops out at 8 users of 8 tokens): 64-token answers,
# users doubled from 2 to 64 then bisected, SLOs that a 135M model on an H200 can miss (TTFT p95 500 ms,
# ITL p95 40 ms). The grid captures decode CUDA graphs up to batch 64: with graphs only up to 4 (the
# first try, docs/results/loadtest-sglang-h200-graphbs4-2026-12-01.json.xz) ITL jumped to 22 ms at 8 users.
CAPACITY_ARGS = ["--quick", "--start", "2", "--max-load", "64", "--max-tokens", "64", "--output-tokens", "64",
                 "--input-tokens", "128", "--step-duration", "6", "--min-samples", "8",
                 "--slo-ttft-ms", "500", "--slo-itl-ms", "40"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--topk", type=int, default=4)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    s = load_sweep_config(str(GRID)).sglang
    runs = [("target-only", server_command(s, s.port_base, None)),
            (f"ddtree-b{a.budget}-k{a.topk}",
             cell_command(s, {"budget": a.budget, "topk": a.topk}, s.port_base + 1, "loadtest"))]
    doc: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
                 "grid": str(GRID.relative_to(ROOT)), "capacity_args": CAPACITY_ARGS, "runs": []}
    t0 = time.time()
    servers = [cell_server(cmd, s, s.port_base + i, a.out, name) for i, (name, cmd) in enumerate(runs)]
    for srv in servers:  # both load side by side; each is then measured alone (the other one idle)
        srv.launch()
    for srv, (name, cmd) in zip(servers, runs, strict=True):
        row: dict = {"name": name, "server_cmd": cmd}
        try:
            srv.wait_ready()
            row["ready_s"] = srv.ready_s
            lt = a.out / name
            p = subprocess.run([sys.executable, "-m", "sglfleet.loadtests", "capacity", "--host", srv.url,
                                *CAPACITY_ARGS,
                                "--out", str(lt)], cwd=ROOT, env=dict(os.environ),
                               capture_output=True, text=True, timeout=240)
            row.update(rc=p.returncode, tail=(p.stdout + p.stderr)[-3000:])
            rep = lt / "capacity.json"
            if rep.is_file():
                row["capacity"] = json.loads(rep.read_text())
        except Exception as e:  # recorded: a server that does not come up is a result too
            row["error"] = f"{type(e).__name__}: {e}"[:3000]
        doc["runs"].append(row)
        print(name, row.get("rc"), f"{time.time() - t0:.0f}s", row.get("error", "")[:200], flush=True)
    doc["wall_s"] = time.time() - t0
    (a.out / "loadtest.json").write_text(json.dumps(doc, indent=1))
    for srv in servers:
        srv.stop(timeout_s=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
