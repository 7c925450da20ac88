"""A test-bed server run as a child process of the test or bench that needs it, on 127.0.0.1:port.

    class Worker(ChildServer):
        label = "router test worker"
        def command(self) -> list[str]: return [sys.executable, "-m", "testbed.routerworker", "--port", ...]

    with Worker(port) as w: httpx.get(w.url + "/health")

start() runs command() from the repository root (on PYTHONPATH, so `python -m testbed.X` works from any
directory) in its own session, and returns once ready() says so (by default: GET /health answers 200). A
child that exits first, or is not ready within ready_timeout_s, is a RuntimeError naming the server. stop()
stops the whole process group (TERM, then KILL); it is safe to call twice. The simulated streaming server
(simserver.py), the router test worker (routerworker.py) and the corruptible engine (corruptible/server.py)
all start this way.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Self

from sglfleet.pipeline.procs import stop_child
from testbed import REPO_ROOT

REPO = REPO_ROOT


def child_env() -> dict[str, str]:
    """This environment with the repository root first on PYTHONPATH."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


class ChildServer:
    label = "test server"  # in its errors
    ready_timeout_s = 20.0
    poll_s = 0.1
    stop_timeout_s = 10.0
    quiet = False  # the child's stdout to /dev/null (its stderr still here)

    def __init__(self, port: int, log_path: Path | None = None) -> None:
        self.port = port
        self.log_path = log_path  # the child's stdout and stderr, appended; None: this process's
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---------------------------------------------------------------- what a server sets
    def command(self) -> list[str]:
        raise NotImplementedError

    def popen_kwargs(self) -> dict[str, object]:
        return {}

    def ready(self) -> bool:
        import httpx

        try:
            return httpx.get(self.url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def exit_message(self, rc: int) -> str:
        return f"{self.label} on port {self.port} exited with {rc} at start"

    # ---------------------------------------------------------------- the life cycle
    def start(self) -> Self:
        if self.log_path is not None:
            with open(self.log_path, "ab") as log:
                self.proc = self._spawn(log, subprocess.STDOUT)
        else:
            self.proc = self._spawn(subprocess.DEVNULL if self.quiet else None, None)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                self.proc = None
                raise RuntimeError(self.exit_message(rc))
            if self.ready():
                return self
            time.sleep(self.poll_s)
        self.stop()
        where = f"; log {self.log_path}" if self.log_path else ""
        raise RuntimeError(f"{self.label} on port {self.port} not ready after {self.ready_timeout_s:.0f}s{where}")

    def _spawn(self, out: object, err: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.command(), cwd=REPO, env=child_env(), stdout=out, stderr=err,  # type: ignore[call-overload]
                                start_new_session=True, **self.popen_kwargs())

    def stop(self) -> None:
        stop_child(self.proc, timeout_s=self.stop_timeout_s, group=True)
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
