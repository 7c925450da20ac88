"""bench/ci_run_summary.py reads a .ci/run log as .ci/run prints it (stage lines, test-prepare's
steps, pytest's last line) and refuses anything else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.ci_run_summary import SummaryError, summarize

REPO = Path(__file__).resolve().parents[1]
LOG = """::: stage setup — start 11:42:41
::: stage setup — ok in 71s
::: stage lint — start 11:43:52
All checks passed!
::: stage lint — ok in 8s
::: stage test — start 11:44:00
::: images stage took 206s
::: test-prepare: done (207s)
tests/x.py ....
================ 601 passed, 164 skipped in 1172.99s (0:19:32) =================
::: stage test — ok in 1384s
::: stage tests-ran — ok in 0s
::: all stages passed in 1463s
"""


def test_a_green_run() -> None:
    s = summarize(LOG)
    assert [(x["stage"], x["seconds"]) for x in s["stages"]] == [("setup", 71), ("lint", 8), ("test", 1384),
                                                                   ("tests-ran", 0)]
    assert s["test_prepare"] == {"images": 206, "test-prepare": 207}
    assert s["pytest_summary"] == "601 passed, 164 skipped" and s["pytest_seconds"] == 1172.99
    assert s["total_seconds"] == 1463 and s["passed"] is True and s["failed_stages"] == []


def test_a_failed_run_is_not_passed() -> None:
    log = LOG.split("::: stage test — ok")[0].replace("601 passed", "3 failed, 598 passed")
    log += "::: stage test — FAILED (exit 2) after 1300s\n"
    s = summarize(log)
    assert s["passed"] is False and s["failed_stages"] == [{"stage": "test", "exit": 2, "seconds": 1300}]
    assert s["pytest_summary"].startswith("3 failed")


def test_not_a_ci_log_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(SummaryError):
        summarize("hello\n")
    f = tmp_path / "x.log"
    f.write_text("hello\n")
    p = subprocess.run([sys.executable, str(REPO / "bench" / "ci_run_summary.py"), str(f), "--out",
                        str(tmp_path / "o.json")], capture_output=True, text=True)
    assert p.returncode == 2 and "not a .ci/run log" in p.stderr and not (tmp_path / "o.json").exists()
