#!/usr/bin/python
# Wait until a container's server answers /health, and stop at once when the container exits or restarts.
"""Ansible module fleet_wait_healthy (role health): ends the health wait the moment the container is no longer
running (exited, dead, restarting, or restarted since it was created), with the last log lines (stdout and
stderr, as `docker logs` interleaves them) in the failure. Runs on the host; needs only the docker CLI."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: fleet_wait_healthy
short_description: Wait for a container's /health, failing fast when it exits or restarts
options:
  container: {description: container name, required: true, type: str}
  url: {description: base URL of the server (GET url/health), required: true, type: str}
  budget_s: {description: seconds to wait for /health, required: true, type: float}
  poll_s: {description: seconds between probes, default: 2, type: float}
  log_lines: {description: log lines to return on failure, default: 40, type: int}
  max_restarts: {description: restarts tolerated before failing, default: 0, type: int}
"""


def _state(name):
    p = subprocess.run(["docker", "inspect", "--format", "{{json .State}}\t{{.RestartCount}}", name],
                       capture_output=True, text=True, check=False)
    if p.returncode != 0:
        return None, 0
    state, _, restarts = p.stdout.strip().partition("\t")
    return json.loads(state), int(restarts or 0)


def _logs(name, n):
    p = subprocess.run(["docker", "logs", "--tail", str(n), name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, check=False, errors="replace")
    return [ln.rstrip() for ln in p.stdout.splitlines() if ln.strip()][-n:]


def _healthy(url):
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main():
    m = AnsibleModule(argument_spec={
        "container": {"type": "str", "required": True},
        "url": {"type": "str", "required": True},
        "budget_s": {"type": "float", "required": True},
        "poll_s": {"type": "float", "default": 2.0},
        "log_lines": {"type": "int", "default": 40},
        "max_restarts": {"type": "int", "default": 0},
    }, supports_check_mode=True)
    if m.check_mode:
        m.exit_json(changed=False, skipped=True, msg="check mode: no health wait")
    p = m.params
    name = p["container"]
    t0 = time.monotonic()
    while True:
        elapsed = round(time.monotonic() - t0, 1)
        state, restarts = _state(name)
        if state is None:
            m.fail_json(msg=f"container {name} is gone after {elapsed}s", reason="container-missing",
                        elapsed_s=elapsed, log_tail=[])
        status = state.get("Status", "")
        if status in ("exited", "dead") or state.get("Restarting") or restarts > p["max_restarts"]:
            code = state.get("ExitCode")
            m.fail_json(msg=f"container {name} {'restarting' if status != 'exited' else 'exited'} "
                            f"(exit code {code}, restarts {restarts}) after {elapsed}s, before /health answered",
                        reason="container-exited", exit_code=code, restarts=restarts, elapsed_s=elapsed,
                        log_tail=_logs(name, p["log_lines"]))
        if status == "running" and _healthy(p["url"]):
            m.exit_json(changed=False, elapsed_s=elapsed, msg=f"{p['url']}/health answered 200 after {elapsed}s")
        if elapsed >= p["budget_s"]:
            m.fail_json(msg=f"{p['url']}/health did not answer 200 within {p['budget_s']:.0f}s (container running)",
                        reason="health-timeout", elapsed_s=elapsed, log_tail=_logs(name, p["log_lines"]))
        time.sleep(p["poll_s"])


if __name__ == "__main__":
    main()
