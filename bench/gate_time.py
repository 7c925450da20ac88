"""Time to verdict of the full gate against the embedded target (median of several runs).

    python bench/gate_time.py [--runs 3] [--config validation/profiles/embedded.yaml] [--out FILE] [--judge-cost]

Starts the embedded target once, runs `python -m sglfleet.validation run` against it --runs times as whole
processes, and records each wall time, the median, min and max, the machine and the command.
With --judge-cost every run is a pair, the gate with the fluency judge and with `--no-judge`, in
alternating order, so the judge's cost is measured under the same machine load: the file records
both medians, their ratio and the judge's own time from each report (`summary.judge_s`).
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


def _write(args: argparse.Namespace, walls: list[float], verdicts: list[str],
           pairs: list[dict[str, object]]) -> dict[str, object]:
    """The result so far, written to --out (after every pair, so an interrupted run leaves its data)."""
    result: dict[str, object] = {
        **raw_header("bench/gate_time.py"),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()], "runs": args.runs,
        "median_s": round(statistics.median(walls), 1), "min_s": round(min(walls), 1),
        "max_s": round(max(walls), 1), "walls_s": [round(w, 1) for w in walls], "verdicts": verdicts}
    with_judge = [p["judge"] for p in pairs if p.get("judge") and p["judge"]["judge_s"] is not None]  # type: ignore[index]
    if with_judge:  # the judge's own phase (start + scoring) against the rest of the same gate run
        shares = [j["judge_s"] / (j["wall_s"] - j["judge_s"]) for j in with_judge]  # type: ignore[index,operator]
        result["judge_share"] = {"per_run": [round(x, 3) for x in shares],
                                 "median": round(statistics.median(shares), 3),
                                 "judge_s": [j["judge_s"] for j in with_judge]}  # type: ignore[index]
    if args.judge_cost and all("nojudge" in p and "judge" in p for p in pairs):
        on = [float(p["judge"]["wall_s"]) for p in pairs]  # type: ignore[index]
        off = [float(p["nojudge"]["wall_s"]) for p in pairs]  # type: ignore[index]
        js = [float(p["judge"]["judge_s"]) for p in pairs if p["judge"]["judge_s"] is not None]  # type: ignore[index]
        result["judge_cost"] = {
            "pairs": pairs, "median_with_judge_s": round(statistics.median(on), 1),
            "median_without_judge_s": round(statistics.median(off), 1),
            "median_ratio": round(statistics.median(a / b for a, b in zip(on, off, strict=True)), 3),
            "judge_s_median": round(statistics.median(js), 1) if js else None,
            "judge_share_of_gate_without": round(statistics.median(js) / statistics.median(off), 3) if js else None}
    result["complete_pairs"] = len(pairs)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--config", default=str(REPO / "src" / "sglfleet" / "validation" / "profiles" / "embedded.yaml"))
    ap.add_argument("--out", default=str(REPO / "docs" / "results" / "gate-time.json"))
    ap.add_argument("--judge-cost", action="store_true", help="pairs: with and without the fluency judge")
    args = ap.parse_args()
    walls, verdicts = [], []
    pairs: list[dict[str, object]] = []
    with EmbeddedServer(EmbeddedConfig(port=18680), REPO / "runs" / "bench-gate") as srv:
        for i in range(args.runs):
            modes = ([True, False] if i % 2 == 0 else [False, True]) if args.judge_cost else [True]
            pair: dict[str, object] = {}
            for judge in modes:
                out = REPO / "runs" / "bench-gate" / f"run{i}-{'judge' if judge else 'nojudge'}"
                cmd = [sys.executable, "-m", "sglfleet.validation", "run", "--target", srv.url, "--config", args.config,
                       "--out", str(out)] + ([] if judge else ["--no-judge"])
                t0 = time.perf_counter()
                p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
                wall = time.perf_counter() - t0
                verdict = json.loads(p.stdout.strip().splitlines()[-1])["verdict"] if p.stdout.strip() else p.stderr
                judge_s = None
                if (out / "report.json").is_file():
                    judge_s = json.loads((out / "report.json").read_text())["summary"].get("judge_s")
                pair["judge" if judge else "nojudge"] = {"wall_s": round(wall, 1), "verdict": verdict,
                                                         "judge_s": judge_s, "load": round(os.getloadavg()[0], 2)}
                if judge:
                    walls.append(wall)
                    verdicts.append(verdict)
                print(f"run {i} judge={judge}: {wall:.1f}s {verdict} judge_s={judge_s}", flush=True)
            pairs.append(pair)
            _write(args, walls, verdicts, pairs)
    result = _write(args, walls, verdicts, pairs)

    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
