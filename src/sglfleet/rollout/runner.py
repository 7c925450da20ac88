"""Run one playbook through ansible-runner, print live progress, and summarise per-host outcomes."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglfleet.rollout import ANSIBLE_DIR
from sglfleet.rollout.inventory import ansible_env
from sglfleet.rollout.registry import PASSWORD_ENV, USER_ENV

# The image role reads the registry login from this file (controller side, mode 0600, outside the run
# dir, deleted after the run). ansible-runner writes the whole environment of the playbook process into
# artifacts/<ident>/command, so the credentials must never be in that environment.
CREDENTIALS_FILE_ENV = "ROLLOUT_REGISTRY_CREDENTIALS_FILE"

OK_EVENTS = {"runner_on_ok", "runner_item_on_ok"}
FAIL_EVENTS = {"runner_on_failed", "runner_item_on_failed"}


@dataclass
class HostResult:
    host: str
    switched: bool = False  # a new container was started on this host
    recorded: bool = False  # the new version passed health and was recorded
    restored: bool = False  # the new version failed; the previous one was put back
    would_change: bool = False  # the container would be (check mode) or was replaced
    failed: bool = False
    unreachable: bool = False
    messages: list[str] = field(default_factory=list)
    failure: dict[str, Any] = field(default_factory=dict)  # reason, msg, log_tail (the serve role's report)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.restored:
            return "restored-previous"
        if self.recorded and not self.failed:
            return "updated"
        if self.failed:
            return "failed"
        return "unchanged"


@dataclass
class PlaybookResult:
    playbook: str
    rc: int
    status: str
    hosts: dict[str, HostResult]
    wall_s: float
    artifacts: Path


def _msg(res: dict[str, Any]) -> str:
    m = res.get("msg") or res.get("stderr") or ""
    if isinstance(m, list):
        m = "; ".join(str(x) for x in m)
    return " ".join(str(m).split())[:600]


# Tasks whose start is worth a progress line (the long waits).
_SLOW = ("Pull the image", "Load the tarball", "Pre-stage the weights", "Container: switch", "Wait for /health",
         "Container: restore", "Wait until")


def sweep_credentials(tmp: str | None = None) -> list[str]:
    """Remove the credentials dirs of controllers that are gone (killed before their `finally` ran): the dir's
    name carries the pid that made it (rollout-cred-<pid>-*); a live pid's dir is left alone."""
    gone = []
    for d in Path(tmp or tempfile.gettempdir()).glob("rollout-cred-*-*"):
        pid = d.name.split("-")[2]
        if not pid.isdigit() or not d.is_dir() or d.stat().st_uid != os.getuid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        gone.append(str(d))
    return gone


def run_playbook(name: str, inventory: Path, hosts: list[str], run_dir: Path, extravars: dict[str, Any],
                 *, check: bool = False, forks: int = 16, envvars: dict[str, str] | None = None,
                 quiet: bool = False, label: str | None = None, tags: str | None = None) -> PlaybookResult:
    """Run playbooks/<name>.yml on `hosts`. Per-host outcomes come from the roles' custom stats
    (`set_stats` under `rollout.<host>`) and from Ansible's own failed/unreachable events and stats;
    task names are used for progress lines only."""
    import ansible_runner

    results = {h: HostResult(h) for h in hosts}
    pdd = run_dir / f"ansible-{label or name}"
    pdd.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    stats: dict[str, Any] = {}

    def log(line: str) -> None:
        if not quiet:
            print(f"[{time.monotonic() - t0:6.1f}s] {line}", file=sys.stderr, flush=True)

    def on_event(ev: dict[str, Any]) -> bool:
        kind = ev.get("event", "")
        data = ev.get("event_data") or {}
        if kind == "playbook_on_stats":
            stats.update(data)
            return True
        host = data.get("host")
        task = data.get("task", "")
        res = data.get("res") or {}
        if kind == "playbook_on_play_start":
            log(f"PLAY {data.get('play', '')}")
        if not host or host not in results:
            return True
        hr = results[host]
        if kind in OK_EVENTS:
            msg = res.get("msg")
            if not isinstance(msg, dict):
                msg = {}
            hr.data.update(msg.get("rollout_status") or msg.get("rollout_render") or {})
            changed = bool(res.get("changed"))
            if kind == "runner_on_ok" and (changed or task.startswith(_SLOW)):
                extra = f" ({res['elapsed_s']}s)" if "elapsed_s" in res else ""
                log(f"{host}: {task}: {'changed' if changed else 'ok'}{extra}")
        elif kind == "runner_on_async_poll":  # the long waits (pull, weights, health) report every few seconds
            log(f"{host}: {task}: still running")
        elif kind in FAIL_EVENTS and not data.get("ignore_errors"):
            hr.failed = True
            hr.messages.append(f"{task}: {_msg(res)}")
            log(f"{host}: FAILED {task}: {_msg(res)[:300]}")
            for ln in (res.get("log_tail") or [])[-10:]:
                log(f"{host}:   | {ln[:300]}")
        elif kind == "runner_on_unreachable":
            hr.unreachable = True
            hr.messages.append(f"unreachable during '{task}': {_msg(res)}")
            log(f"{host}: UNREACHABLE during {task}")
        return True

    env = ansible_env()
    env.update(envvars or {})
    creds = {k: env.pop(k, "") for k in (USER_ENV, PASSWORD_ENV, CREDENTIALS_FILE_ENV)}
    # ansible-runner seeds the playbook's environment with os.environ (then adds envvars): take the
    # credentials out of this process's environment for the run as well.
    saved_env = {k: os.environ.pop(k) for k in (USER_ENV, PASSWORD_ENV, CREDENTIALS_FILE_ENV) if k in os.environ}
    cred_dir = None
    if creds[USER_ENV] and creds[PASSWORD_ENV]:
        sweep_credentials()
        cred_dir = tempfile.mkdtemp(prefix=f"rollout-cred-{os.getpid()}-")  # mode 0700
        cred_file = os.path.join(cred_dir, "registry.json")
        with os.fdopen(os.open(cred_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump({"username": creds[USER_ENV], "password": creds[PASSWORD_ENV]}, f)
        env[CREDENTIALS_FILE_ENV] = cred_file
    cmdline = "--check --diff" if check else None
    try:
        r = ansible_runner.run(
            private_data_dir=str(pdd),
            project_dir=str(ANSIBLE_DIR),
            playbook=str(ANSIBLE_DIR / "playbooks" / f"{name}.yml"),
            inventory=str(inventory.resolve()),
            limit=",".join(hosts),
            extravars=extravars,
            envvars=env,
            cmdline=cmdline,
            tags=tags,
            forks=forks,
            event_handler=on_event,
            quiet=True,
            suppress_env_files=True,
            settings={"suppress_ansible_output": True},
        )
    finally:
        os.environ.update(saved_env)
        if cred_dir:
            shutil.rmtree(cred_dir, ignore_errors=True)
    wall = time.monotonic() - t0
    custom = (stats.get("artifact_data") or {}).get("rollout") or {}
    for h, hr in results.items():
        mine = custom.get(h) or {}
        hr.switched = bool(mine.get("switched"))
        hr.recorded = bool(mine.get("recorded"))
        hr.restored = bool(mine.get("restored"))
        hr.would_change = bool(mine.get("would_change"))
        hr.failure = dict(mine.get("failure") or {})
        if mine.get("router"):  # the router role's report (ansible/roles/router/tasks/check.yml)
            hr.data["router"] = dict(mine["router"])
        if h in (stats.get("dark") or {}):
            hr.unreachable = True
        if h in (stats.get("failures") or {}):
            hr.failed = True
    log(f"{name}: rc={r.rc} status={r.status} in {wall:.1f}s")
    return PlaybookResult(name, r.rc, r.status, results, wall, pdd / "artifacts")
