"""Summarize one `.ci/run` log (and the JUnit file it leaves in the clone) as a raw JSON result:
stage durations, test-prepare's own steps, pytest's summary line, JUnit counts, the commit, date and
machine. docs/ci-run.md renders its table from that file (bench/render_docs.py, block `ci-run`).

    bash .ci/run > ci.log 2>&1; python bench/ci_run_summary.py ci.log --clone DIR --out docs/results/F.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

STAGE_OK = re.compile(r"^::: stage (?P<name>[\w-]+) — ok in (?P<s>\d+)s")
STAGE_FAIL = re.compile(r"^::: stage (?P<name>[\w-]+) — FAILED \(exit (?P<rc>\d+)\) after (?P<s>\d+)s")
PREP = re.compile(r"^::: (?P<what>images|test-prepare)(?: stage took |: done \()(?P<s>\d+)s")
PYTEST = re.compile(r"^=+ (?P<summary>.*\d+ (?:passed|failed).*) in (?P<s>[\d.]+)s")
TOTAL = re.compile(r"^::: all stages passed in (?P<s>\d+)s")


class SummaryError(Exception):
    pass


def summarize(log: str, junit: Path | None = None) -> dict[str, Any]:
    stages: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    prep: dict[str, int] = {}
    pytest_summary = pytest_s = total = None
    for line in log.splitlines():
        if m := STAGE_OK.match(line):
            stages.append({"stage": m["name"], "seconds": int(m["s"])})
        elif m := STAGE_FAIL.match(line):
            failed.append({"stage": m["name"], "exit": int(m["rc"]), "seconds": int(m["s"])})
        elif m := PREP.match(line):
            prep[m["what"]] = int(m["s"])
        elif m := PYTEST.match(line):
            pytest_summary, pytest_s = m["summary"].strip(), float(m["s"])
        elif m := TOTAL.match(line):
            total = int(m["s"])
    if not stages and not failed:
        raise SummaryError("no `::: stage` lines: not a .ci/run log")
    out: dict[str, Any] = {"stages": stages, "failed_stages": failed, "test_prepare": prep,
                           "pytest_summary": pytest_summary, "pytest_seconds": pytest_s,
                           "total_seconds": total, "passed": bool(total is not None and not failed)}
    if junit is not None and junit.is_file():
        root = ET.parse(junit).getroot()
        suites = [root] if root.tag == "testsuite" else list(root)
        tests = sum(int(s.get("tests", 0)) for s in suites)
        skipped = sum(int(s.get("skipped", 0)) for s in suites)
        fails = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
        out["junit"] = {"tests": tests, "skipped": skipped, "failed": fails, "ran": tests - skipped}
    return out


def _git(clone: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(clone), *args], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", type=Path)
    ap.add_argument("--clone", type=Path, help="the clone .ci/run ran in (commit, runs/pytest-junit.xml)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", default="bash .ci/run (a fresh clone of main)",
                    help="how .ci/run was started, as recorded")
    ap.add_argument("--machine", default=f"{platform.node()} ({platform.platform()}), "
                    f"{len(__import__('os').sched_getaffinity(0))} cores")
    a = ap.parse_args(argv)
    try:
        doc = summarize(a.log.read_text(errors="replace"), a.clone / "runs" / "pytest-junit.xml" if a.clone else None)
    except (OSError, SummaryError) as e:
        print(f"error: {a.log}: {e}", file=sys.stderr)
        return 2
    doc = {"command": a.command, "date": _dt.datetime.fromtimestamp(
        a.log.stat().st_mtime, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": a.machine,
        "commit": _git(a.clone, "log", "-1", "--format=%H %s") if a.clone else None, **doc}
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("commit", "passed", "total_seconds", "pytest_summary")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
