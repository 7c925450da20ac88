"""Child processes the pipeline starts (the embedded engine, the fluency judge, SGLang servers)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when the group has no process left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a recycled group id of someone else's
        return False
    return True


def group_alive(pgid: int) -> bool:
    """True while a process of group `pgid` is running (zombies awaiting their reaper do not count)."""
    if not os.path.isdir("/proc"):  # pragma: no cover - not Linux
        return _signal_group(pgid, 0)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def stop_child(proc: subprocess.Popen | None, timeout_s: float = 10.0, group: bool = False) -> None:
    """Terminate a child that is still running; kill it when it ignores SIGTERM for `timeout_s`.

    group=True: the child leads its own session (``start_new_session=True``) and the whole process
    group is stopped, leader and every process it started (an SGLang server's scheduler and
    detokenizer), also when the leader has already exited.
    """
    if proc is None:
        return
    if not group:
        if proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout_s)
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)
        for _ in range(100):
            if not group_alive(pgid):
                break
            time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
