"""`make test-fast` promises no servers, no network, no nvcc: the guard in tests/conftest.py enforces it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBES = '''
import socket, subprocess, sys

def test_binds_a_server():
    socket.socket().bind(("127.0.0.1", 0))

def test_connects_out():
    socket.create_connection(("127.0.0.1", 9), timeout=1)

def test_runs_pip():
    subprocess.run([sys.executable, "-m", "pip", "--version"], check=True)

def test_runs_nvcc():
    subprocess.run(["nvcc", "--version"], check=False)

def test_plain_unit_test():
    assert sum([1, 2]) == 3
'''


def _run(tmp_path: Path, fast: bool) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBES)
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_TEST_FAST"}
    if fast:
        env["PIPELINE_TEST_FAST"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "-p", "no:locust", "-o", "addopts=", "--rootdir", str(tmp_path), str(probe)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_guard_fails_servers_network_and_nvcc_under_test_fast(tmp_path: Path) -> None:
    cp = _run(tmp_path, fast=True)
    out = cp.stdout
    for name in ("test_binds_a_server", "test_connects_out", "test_runs_pip", "test_runs_nvcc"):
        assert any(name in line and "FAILED" in line for line in out.splitlines()), (name, out)
    assert "1 passed" in out and "4 failed" in out, out


def test_guard_is_off_outside_test_fast(tmp_path: Path) -> None:
    cp = _run(tmp_path, fast=False)
    assert "make test-fast" not in cp.stdout, cp.stdout  # no guard message: the probes ran unguarded
    assert "test_plain_unit_test" not in [ln for ln in cp.stdout.splitlines() if "FAILED" in ln]
