"""The README's main job (`make demo`): deploy the embedded target, gate it, load-test it."""

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
    p = subprocess.run([sys.executable, "-m", "pipeline.mainjob", "--out", str(out), "--port", str(port)],
                       cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-4000:]
    last = json.loads(p.stdout.strip().splitlines()[-1])
    assert last == {"verdict": "PASS", "out": str(out)}
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["stages"]) == {"deploy", "gate", "loadtest"}
    assert json.loads((out / "gate" / "report.json").read_text())["summary"]["verdict"] == "PASS"
    assert (out / "index.html").is_file() and (out / "junit.xml").is_file()
    assert any((out / "loadtest").iterdir())
    assert f"all reports under {out}" in p.stderr
