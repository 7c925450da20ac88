"""The main job on the embedded default target (no root, no Docker): serve -> gate -> load test, one report.

    python -m sglfleet.flow main [--out DIR] [--port 18080] [--skip-loadtest]      (make demo-light)

"Deploy" here starts the embedded engine (SmolLM2-135M on llama.cpp) in a child process; the gate and the
load test are the same in-process stages flow/promote.py runs on a fleet (flow.promote.gate_stage,
flow.promote.loadtest_stage), with the same verdict rule. There is no registry here, so nothing is
promoted: the page says what would have been. Exit code: 0 all stages passed, 1 one failed, 2 bad input.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sglfleet import paths
from sglfleet.flow.promote import gate_stage, headline, loadtest_config, loadtest_stage
from sglfleet.flow.report import Stage, write
from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer
from sglfleet.pipeline.errors import EXIT_FAIL, EXIT_OK, UsageError
from sglfleet.pipeline.reports import new_run_dir
from sglfleet.rollout.config import RolloutConfig

GATE_CONFIG = paths.PACKAGE_DIR / "validation" / "profiles" / "embedded.yaml"


def run(out: str | None = None, port: int = 18080, *, skip_loadtest: bool = False,
        gate_config: Path = GATE_CONFIG) -> int:
    """Run the main job; prints the report page path last (stderr) and a JSON line (stdout)."""
    from sglfleet.validation.config import load_gate_config

    run_dir = Path(out) if out else new_run_dir(paths.WORK_ROOT / "runs", "main")
    run_dir.mkdir(parents=True, exist_ok=True)
    if not gate_config.is_file():
        raise UsageError(f"gate config not found: {gate_config}")
    gate_cfg = load_gate_config(gate_config)
    cfg = EmbeddedConfig(port=port)
    lt_cfg = loadtest_config(RolloutConfig(), cfg.url)
    stages: list[Stage] = []
    t0 = time.monotonic()
    print(f"main job: serving {cfg.alias} on {cfg.url} (run dir {run_dir})", file=sys.stderr, flush=True)
    with EmbeddedServer(cfg, run_dir / "target") as srv:
        dt = time.monotonic() - t0
        stages.append(Stage("deploy", True, f"{srv.url} ready in {dt:.1f}s", dt,
                            links={"server log": str(srv.log_path)}, data={"url": srv.url}))
        st = gate_stage(srv.url, run_dir / "gate", gate_cfg)
        stages.append(st)
        print(f"gate: {'PASS' if st.ok else 'FAIL'} {st.summary}", file=sys.stderr, flush=True)
        if st.ok and not skip_loadtest:
            lt = loadtest_stage(lt_cfg, run_dir / "loadtest", 1.0)
            stages.append(lt)
            print(f"load test: {'PASS' if lt.ok else 'FAIL'} {lt.summary}", file=sys.stderr, flush=True)
    passed = all(s.ok for s in stages)
    stages.append(Stage("promote", True, "no registry on the embedded target: "
                        + ("would promote" if passed else "would roll back"), skipped=True))
    verdict = "PASS" if passed else "FAIL"
    report = {"action": "main", "image": f"embedded {cfg.alias}", "digest": None, "target": cfg.url,
              "model": cfg.alias, "run_dir": str(run_dir), "wall_s": round(time.monotonic() - t0, 2),
              "exit_code": EXIT_OK if passed else EXIT_FAIL}
    page = write(run_dir, f"Main job — embedded {cfg.alias}", verdict, headline(report, stages), stages, report)
    # summary.json: the main job's short verdict (kept for scripts that read it)
    (run_dir / "summary.json").write_text(json.dumps({"verdict": verdict, "target": cfg.url, "model": cfg.alias,
                                                      "stages": {s.name: {"ok": s.ok, "summary": s.summary}
                                                                 for s in stages}}, indent=2) + "\n")
    print(f"{verdict}: all reports under {run_dir}/ (start with {page})", file=sys.stderr)
    print(json.dumps({"verdict": verdict, "out": str(run_dir)}))
    return EXIT_OK if passed else EXIT_FAIL
