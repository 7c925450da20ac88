"""Fixtures for the load-test stage: the simulated streaming server and a CLI runner.

Locust always runs in a child process (`python -m loadtests ...` starts it), never in pytest's.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.simserver import SimServer, _raise_priority

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(*args: str, timeout: float = 180, priority: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m loadtests ARGS` in a subprocess, output captured (priority: niced up, for timing tests)."""
    return subprocess.run([sys.executable, "-m", "loadtests", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False, preexec_fn=_raise_priority if priority else None)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.fixture
def sim() -> Iterator[Callable[..., SimServer]]:
    """Factory: sim("--ttft-ms", "20", ...) starts a simulator on a free port; all stopped at teardown."""
    started: list[SimServer] = []

    def start(*args: str) -> SimServer:
        srv = SimServer(free_port(), *args).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
