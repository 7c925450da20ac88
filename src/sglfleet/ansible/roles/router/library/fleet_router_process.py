#!/usr/bin/python
# Keep one daemon process running with a given command line, for hosts without an init system.
"""Ansible module fleet_router_process (role router, router_service_manager: process): starts the router as a
daemon (its own session, stdin from /dev/null, output appended to a log file) and records its pid, the start
time the kernel gives that pid and the command line in a JSON pidfile. Idempotent: a recorded process that is
still the same process (same pid AND same start time, so a reused pid is never taken for it) and runs the same
command line is left alone; a different command line is stopped and started again. state=stopped stops it
(SIGTERM, then SIGKILL after stop_timeout_s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: fleet_router_process
short_description: Run one daemon with a pidfile (start, restart on a changed command line, stop)
options:
  argv: {description: the command line, type: list, elements: str, default: []}
  pidfile: {description: JSON pidfile (pid, start time, argv), required: true, type: path}
  logfile: {description: the daemon's stdout and stderr are appended here, type: path}
  state: {description: started or stopped, default: started, type: str, choices: [started, stopped]}
  env: {description: extra environment variables, type: dict, default: {}}
  settle_s: {description: seconds the new process must stay alive, default: 2, type: float}
  stop_timeout_s: {description: seconds between SIGTERM and SIGKILL, default: 15, type: float}
"""


def _start_time(pid):
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):  # exited, not reaped (no init reaps it here): not running
        return None
    return int(fields[19]) if len(fields) > 19 else None


def _recorded(pidfile):
    try:
        with open(pidfile, encoding="utf-8") as fh:
            rec = json.load(fh)
        return rec if isinstance(rec, dict) and isinstance(rec.get("pid"), int) else None
    except (OSError, ValueError):
        return None


def _alive(rec):
    return rec is not None and _start_time(rec["pid"]) == rec.get("start_time")


def _tail(path, n=20):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return [ln.rstrip() for ln in fh.readlines()[-n:]]
    except OSError:
        return []


def _stop(rec, timeout_s):
    pid = rec["pid"]
    try:
        os.killpg(pid, signal.SIGTERM)  # its own session: the group is the daemon and its children
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(rec) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(rec):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        while _alive(rec) and time.monotonic() < deadline + 5:
            time.sleep(0.2)


def main():
    m = AnsibleModule(argument_spec={
        "argv": {"type": "list", "elements": "str", "default": []},
        "pidfile": {"type": "path", "required": True},
        "logfile": {"type": "path"},
        "state": {"type": "str", "default": "started", "choices": ["started", "stopped"]},
        "env": {"type": "dict", "default": {}},
        "settle_s": {"type": "float", "default": 2.0},
        "stop_timeout_s": {"type": "float", "default": 15.0},
    }, supports_check_mode=True)
    p = m.params
    rec = _recorded(p["pidfile"])
    running = _alive(rec)
    if p["state"] == "stopped":
        if not running:
            m.exit_json(changed=False, msg="not running")
        if not m.check_mode:
            _stop(rec, p["stop_timeout_s"])
            os.unlink(p["pidfile"])
        m.exit_json(changed=True, msg=f"stopped pid {rec['pid']}", pid=rec["pid"])
    if not p["argv"]:
        m.fail_json(msg="argv is required with state=started")
    if running and rec.get("argv") == p["argv"]:
        m.exit_json(changed=False, pid=rec["pid"], msg=f"running as pid {rec['pid']} with this command line")
    if m.check_mode:
        m.exit_json(changed=True, msg="would restart" if running else "would start")
    if running:
        _stop(rec, p["stop_timeout_s"])
    logfile = p["logfile"] or os.devnull
    with open(os.devnull, "rb") as devnull, open(logfile, "ab") as log:
        proc = subprocess.Popen(p["argv"], stdin=devnull, stdout=log, stderr=subprocess.STDOUT, close_fds=True,
                                start_new_session=True, env={**os.environ, **{k: str(v) for k, v in p["env"].items()}})
    new = {"pid": proc.pid, "start_time": _start_time(proc.pid), "argv": p["argv"]}
    tmp = p["pidfile"] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(new, fh)
    os.replace(tmp, p["pidfile"])
    deadline = time.monotonic() + p["settle_s"]
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            os.unlink(p["pidfile"])
            m.fail_json(msg=f"{p['argv'][0]} exited with code {proc.returncode} right after its start",
                        log_tail=_tail(logfile), pid=proc.pid)
        time.sleep(0.1)
    m.exit_json(changed=True, pid=proc.pid, restarted=running,
                msg=f"{'restarted' if running else 'started'} as pid {proc.pid}")


if __name__ == "__main__":
    main()
