"""A server started from a command line, with its log kept, gated on /health and /v1/models.

    srv = ServerProcess(["python", "-m", "sglang.launch_server", ..., "--port", "30001"],
                        "http://127.0.0.1:30001", run_dir / "server.log", timeout_s=600)
    with srv:               # launch + wait_ready; stop() on exit
        ...

`launch` starts the process in its own session (stdout and stderr to the log) and returns at once,
so several servers can load side by side; `wait_ready` then waits, within `timeout_s` of the
launch, for `/health` to answer 200 and `/v1/models` to list a model. A process that exits first,
or a timeout, is a TargetError carrying the log's tail. `stop` stops the whole process group
(an SGLang server's scheduler and detokenizer children included).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from sglfleet.pipeline.client import OpenAIClient
from sglfleet.pipeline.errors import TargetError, UsageError
from sglfleet.pipeline.procs import stop_child

LOG_TAIL_CHARS = 2000


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return text[-chars:].strip() or "(empty log)"


def port_in_use(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((parts.hostname or "127.0.0.1", parts.port or 80)) == 0


class ServerProcess:
    """One server child process: its command, URL, log file and readiness timeout."""

    def __init__(self, command: list[str], url: str, log_path: str | Path, *, timeout_s: float,
                 name: str | None = None, env: dict[str, str] | None = None, cwd: str | Path | None = None,
                 poll_s: float = 0.5) -> None:
        if not command:
            raise UsageError("ServerProcess needs a command")
        self.command = [str(c) for c in command]
        self.url = url.rstrip("/")
        self.log_path = Path(log_path)
        self.timeout_s = timeout_s
        self.name = name or Path(self.command[0]).name
        self.env = env
        self.cwd = cwd
        self.poll_s = poll_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None
        self.t_launch: float | None = None
        self.ready_s: float | None = None
        self.models: list[str] = []

    def launch(self) -> ServerProcess:
        """Start the process (its own session, output to the log); do not wait."""
        if self.proc is not None:
            return self
        if port_in_use(self.url):
            raise TargetError(f"{self.name}: {self.url} is already in use: stop what serves there or choose "
                              "another port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            log.write(("$ " + " ".join(self.command) + "\n").encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True, env=self.env,
                                             cwd=self.cwd)
            except OSError as exc:
                raise TargetError(f"{self.name}: cannot start {self.command[0]}: {exc}") from None
        self.pgid = self.proc.pid
        self.t_launch = time.monotonic()
        return self

    def _fail(self, what: str) -> TargetError:
        return TargetError(f"{self.name}: {what}; log {self.log_path}:\n{log_tail(self.log_path)}")

    def wait_ready(self) -> ServerProcess:
        """Block until /health is 200 and /v1/models lists a model; TargetError with the log tail
        when the process exits or `timeout_s` (counted from the launch) passes. Stops it on failure."""
        if self.ready_s is not None:
            return self
        if self.proc is None or self.t_launch is None:
            self.launch()
        assert self.proc is not None and self.t_launch is not None
        deadline = self.t_launch + self.timeout_s
        why = "no answer on /health"
        with OpenAIClient(self.url, timeout_s=10.0) as client:
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    self.stop()
                    raise self._fail(f"exited with {rc} before it was ready")
                if client.health():
                    try:
                        self.models = client.list_models()
                        if self.models:
                            break
                        why = "/v1/models lists no model"
                    except TargetError as exc:
                        why = str(exc)
                if time.monotonic() >= deadline:
                    self.stop()
                    raise self._fail(f"not ready after {self.timeout_s:g}s ({why})")
                time.sleep(self.poll_s)
        self.ready_s = time.monotonic() - self.t_launch
        return self

    def start(self) -> ServerProcess:
        return self.launch().wait_ready()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the whole process group (SIGTERM, SIGKILL after `timeout_s`)."""
        if self.proc is not None:
            stop_child(self.proc, timeout_s=timeout_s, group=True)
        self.proc = None

    def __enter__(self) -> ServerProcess:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

