"""The main job on the embedded target (`python -m sglfleet.flow main`): serve, gate and load-test in one process."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parent.parent


def test_main_job_end_to_end(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "main"
    p = subprocess.run([sys.executable, "-m", "sglfleet.flow", "main", "--out", str(out), "--port", str(port)],
                       cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-4000:]
    last = json.loads(p.stdout.strip().splitlines()[-1])
    assert last == {"verdict": "PASS", "out": str(out)}
    report = json.loads((out / "report.json").read_text())
    names = [s["name"] for s in report["stages"]]
    assert names == ["deploy", "gate", "loadtest", "promote"], names
    assert json.loads((out / "gate" / "report.json").read_text())["summary"]["verdict"] == "PASS"
    lt = next(s for s in report["stages"] if s["name"] == "loadtest")
    assert lt["ok"] and lt["data"]["capacity"] >= 1
    page = (out / "index.html").read_text()
    # the page links the gate and load-test reports, and both exist
    assert "gate/report.html" in page and "loadtest/capacity.html" in page
    assert (out / "gate" / "report.html").is_file() and (out / "loadtest" / "capacity.html").is_file()
    assert report["headline"]["capacity (users meeting the SLOs)"] == lt["data"]["capacity"]
    assert (out / "junit.xml").is_file()
    assert f"all reports under {out}" in p.stderr
