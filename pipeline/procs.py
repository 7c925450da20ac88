"""Child processes the pipeline starts (the embedded engine, the fluency judge)."""

from __future__ import annotations

import subprocess


def stop_child(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """Terminate a child that is still running; kill it when it ignores SIGTERM for `timeout_s`."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
