"""The main job on the embedded default target: deploy -> gate -> load test, one run directory.

    python -m pipeline.mainjob [--out DIR] [--port 18080] [--skip-loadtest]

"Deploy" here starts the embedded engine (SmolLM2-135M on llama.cpp) the way the project serves it;
the fleet path (`make deploy HOST=...`) deploys the same way through Ansible. Every stage runs as
its own command (the same ones the Makefile calls), so each can be re-run alone against the URL
this job prints. Exit code: 0 when every stage passed, 1 when one failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from pipeline.embedded import EmbeddedConfig, EmbeddedServer
from pipeline.errors import EXIT_FAIL, EXIT_OK, cli_main
from pipeline.reports import Case, new_run_dir, write_html, write_json, write_junit

REPO = Path(__file__).resolve().parent.parent


def _stage(console: Console, name: str, cmd: list[str], log: Path) -> tuple[int, float]:
    console.rule(f"[bold]{name}")
    console.print("$ " + " ".join(cmd), highlight=False)
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            console.out(line.rstrip("\n"), highlight=False)
        rc = proc.wait()
    dt = time.perf_counter() - t0
    console.print(f"{name}: exit {rc} in {dt:.1f}s", style="green" if rc == 0 else "bold red")
    return rc, dt


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.mainjob", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="run directory (default runs/main-<timestamp>)")
    ap.add_argument("--port", type=int, default=18080, help="port of the embedded target")
    ap.add_argument("--gate-config", default=str(REPO / "validation" / "profiles" / "embedded.yaml"))
    ap.add_argument("--skip-loadtest", action="store_true")
    args = ap.parse_args(argv)
    console = Console(stderr=True)
    out = Path(args.out) if args.out else new_run_dir(REPO / "runs", "main")
    out.mkdir(parents=True, exist_ok=True)
    cfg = EmbeddedConfig(port=args.port)
    cases: list[Case] = []
    stages: dict[str, dict[str, object]] = {}
    py = sys.executable
    console.rule("[bold]deploy (embedded target)")
    t0 = time.perf_counter()
    with EmbeddedServer(cfg, out / "target") as srv:
        dt = time.perf_counter() - t0
        console.print(f"serving {cfg.alias} at {srv.url} (ready in {dt:.1f}s; log {srv.log_path})")
        cases.append(Case("deploy", "main", True, f"{srv.url} ready in {dt:.1f}s", time_s=dt))
        stages["deploy"] = {"url": srv.url, "seconds": round(dt, 2), "log": str(srv.log_path)}
        rc, dt = _stage(console, "gate", [py, "-m", "validation", "run", "--target", srv.url, "--config",
                                          args.gate_config, "--out", str(out / "gate")], out / "gate.log")
        cases.append(Case("gate", "main", rc == 0, f"exit {rc}; report {out / 'gate' / 'report.html'}", time_s=dt))
        stages["gate"] = {"exit": rc, "seconds": round(dt, 2), "report": str(out / "gate" / "report.html")}
        if not args.skip_loadtest:
            rc, dt = _stage(console, "load test (quick capacity search)",
                            [py, "-m", "loadtests", "capacity", "--host", srv.url, "--quick", "--out",
                             str(out / "loadtest")], out / "loadtest.log")
            cases.append(Case("loadtest", "main", rc == 0, f"exit {rc}; report {out / 'loadtest'}", time_s=dt))
            stages["loadtest"] = {"exit": rc, "seconds": round(dt, 2), "dir": str(out / "loadtest")}
    passed = all(c.ok for c in cases)
    summary = {"verdict": "PASS" if passed else "FAIL", "target": cfg.url, "model": cfg.alias, "stages": stages}
    write_json(out / "summary.json", summary)
    write_junit(out / "junit.xml", "mainjob", cases)
    write_html(out / "index.html", "Main job — embedded target", verdict=summary["verdict"],
               summary={k: json.dumps(v) if isinstance(v, dict) else v for k, v in summary.items()}, cases=cases)
    console.rule("[bold]done")
    # plain print: rich would wrap a long path across lines
    print(f"{summary['verdict']}: all reports under {out}/ (start with {out / 'index.html'})", file=sys.stderr)
    print(json.dumps({"verdict": summary["verdict"], "out": str(out)}))
    return EXIT_OK if passed else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
