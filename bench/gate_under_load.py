"""The gate's verdict on the embedded target, alone and with a CPU hog beside it (issue 28).

    python bench/gate_under_load.py [--runs 3] [--hog both|off|on] [--hog-procs N] [--out docs/results/X.json]

Starts the embedded model (SmolLM2-135M on llama.cpp) once, then runs `python -m sglfleet.validation run` against it
with its profile (validation/profiles/embedded.yaml) `--runs` times alone and `--runs` times with `--hog-procs`
(default: nproc) busy-loop processes at nice 0 beside it. Per run it records the exit code, verdict, failed
checks with their messages, wall time, the machine's load average before and after, and what
validation/determinism.py says about the determinism prompts' T=0 answers (their log-probs are in the gate's
samples), so the raw result shows whether a determinism failure is a near-tie or a real difference. The JSON
(command, date, machine) is rewritten after every run, so an interrupted bench keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer  # noqa: E402
from sglfleet.pipeline.procs import free_port as _free_port  # noqa: E402
from sglfleet.validation.determinism import Answer, judge_repeats  # noqa: E402
from sglfleet.validation.lossless import decode_logprobs  # noqa: E402

PROFILE = REPO / "src" / "sglfleet" / "validation" / "profiles" / "embedded.yaml"
HOG = "while True:\n    pass\n"


def determinism_view(run_dir: Path, tol: float) -> dict[str, Any]:
    """validation/determinism.py on the run's T=0 answers of each determinism prompt."""
    report = json.loads((run_dir / "report.json").read_text())
    prompt_ids = report["config"]["determinism"]["prompt_ids"]
    out: dict[str, Any] = {}
    for pid in prompt_ids:
        answers = []
        for s in report["samples"]:
            if s["prompt_id"] != pid or s["temperature"] != 0 or s["error"]:
                continue
            if s["purpose"] not in ("suite", "determinism-seq", "determinism-conc"):
                continue
            lp = decode_logprobs(s["logprobs"]) if s.get("logprobs") else None
            answers.append(Answer(f"{s['purpose']} {len(answers)}", s["text"], lp, s["finish_reason"]))
        answers.sort(key=lambda a: not a.label.startswith("suite"))  # the suite's answer is the reference
        v = judge_repeats(answers, tol)
        out[pid] = {"verdict": v.verdict, "ok": v.ok, "message": v.message[:1500], **v.as_dict()}
    return out


def one_run(url: str, out: Path, hog: bool, tol: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "sglfleet.validation", "run", "--target", url, "--config", str(PROFILE), "--out",
           str(out)]
    load0 = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    rec: dict[str, Any] = {"hog": hog, "rc": proc.returncode, "wall_s": round(wall, 1),
                           "loadavg_before": [round(x, 2) for x in load0],
                           "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                           "command": " ".join(cmd[1:]).replace(str(REPO) + "/", "")}
    if (out / "report.json").is_file():
        report = json.loads((out / "report.json").read_text())
        summ = report["summary"]
        rec.update({"verdict": summ["verdict"], "failed_checks": summ["failed_checks"],
                    "gate_duration_s": summ["duration_s"], "request_errors": summ["request_errors"],
                    "failed": {c["name"]: c["message"][:800] for c in report["cases"]
                               if not c["ok"] and not c.get("skipped")},
                    "determinism_py": determinism_view(out, tol)})
    else:
        rec["error"] = (proc.stderr.strip().splitlines() or ["no output"])[-1][:500]
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hog", choices=["both", "off", "on"], default="both")
    ap.add_argument("--hog-procs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--near-tie-nats", type=float, default=0.25)
    ap.add_argument("--out", default=str(REPO / "docs" / "results"
                                         / f"gate-under-load-{time.strftime('%Y-%m-%d')}.json"))
    args = ap.parse_args()
    if args.runs < 1 or args.hog_procs < 1:
        print("error: --runs and --hog-procs must be >= 1", file=sys.stderr)
        return 2
    doc: dict[str, Any] = {
        "command": "python bench/gate_under_load.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "note": "shared with other sessions' work: see each run's loadavg"},
        "profile": str(PROFILE.relative_to(REPO)), "hog_procs": args.hog_procs,
        "embedded_threads": EmbeddedConfig.model_fields["threads"].get_default(call_default_factory=True),
        "runs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    phases = {"both": [False, True], "off": [False], "on": [True]}[args.hog]
    with tempfile.TemporaryDirectory(prefix="gate-under-load-") as tmp, \
            EmbeddedServer(EmbeddedConfig(port=_free_port()), Path(tmp) / "target") as srv:
        for hog in phases:
            hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hog_procs)] if hog else []
            try:
                for i in range(args.runs):
                    rec = one_run(srv.url, Path(tmp) / f"gate-{int(hog)}-{i}", hog, args.near_tie_nats)
                    doc["runs"].append(rec)
                    out.write_text(json.dumps(doc, indent=1) + "\n")
                    print(f"[{'hog' if hog else 'alone'} {i + 1}/{args.runs}] rc {rec['rc']} "
                          f"{rec.get('verdict', rec.get('error'))} {rec.get('failed_checks', '')} "
                          f"{rec['wall_s']}s", flush=True)
            finally:
                for h in hogs:
                    h.terminate()
                for h in hogs:
                    h.wait()
    by = {}
    for hog in phases:
        rs = [r for r in doc["runs"] if r["hog"] == hog and "verdict" in r]  # a run killed mid-way has none
        by["hog" if hog else "alone"] = {"runs": len(rs), "pass": sum(r["verdict"] == "PASS" for r in rs),
                                         "no_verdict": sum(1 for r in doc["runs"] if r["hog"] == hog
                                                           and "verdict" not in r),
                                         "median_wall_s": sorted(r["wall_s"] for r in rs)[len(rs) // 2] if rs
                                         else None}
    doc["totals"] = by
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(by))
    return 0


if __name__ == "__main__":
    sys.exit(main())
