"""The Ansible half of a rollout: deploy playbook runs (typed outcome per host), rollback, status, render.

The promotion flow (deploy -> gate -> load test -> promote or roll back) is flow/promote.py; this module
changes hosts and reports what it changed, nothing more."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglfleet import paths
from sglfleet.pipeline.errors import EXIT_FAIL, EXIT_OK, TargetError, UsageError
from sglfleet.pipeline.reports import Case, new_run_dir, write_json, write_junit
from sglfleet.rollout import collections, registry, retry
from sglfleet.rollout.config import RolloutConfig
from sglfleet.rollout.inventory import Inventory, load_inventory
from sglfleet.rollout.runner import HostResult, PlaybookResult, run_playbook


def _abs(p: str) -> Path:
    return paths.resolve(p)


def prepare(cfg: RolloutConfig, hosts_pattern: str) -> tuple[Inventory, list[str]]:
    """Parse the inventory and resolve HOST; bad input raises UsageError before anything changes."""
    collections.check()
    inv = load_inventory(_abs(cfg.inventory))
    hosts = inv.resolve(hosts_pattern)
    inv.check_fleet(hosts)
    return inv, hosts


def _common_vars(cfg: RolloutConfig) -> dict[str, Any]:
    return {"rollout_serial": cfg.serial, "rollout_max_fail_percentage": cfg.max_fail_percentage}


@dataclass
class DeployOutcome:
    """What one deploy playbook run did, per host (from the roles' reports, see rollout/runner.py)."""

    rc: int
    status: str
    wall_s: float
    hosts: dict[str, HostResult]
    check: bool = False

    @property
    def ok(self) -> bool:
        return self.rc == 0 and all(r.outcome in ("updated", "unchanged") for r in self.hosts.values())

    @property
    def updated(self) -> list[str]:
        return [h for h, r in self.hosts.items() if r.outcome == "updated"]

    @property
    def restored(self) -> list[str]:
        return [h for h, r in self.hosts.items() if r.restored]

    @property
    def interrupted(self) -> list[str]:
        # Switched to the new container but neither recorded nor restored: the run stopped during the health
        # wait (host unreachable, controller interrupted). The host state still names the old version.
        return [h for h, r in self.hosts.items() if r.switched and not r.recorded and not r.restored]

    @property
    def changed(self) -> list[str]:
        return sorted(set(self.updated) | set(self.restored) | set(self.interrupted))

    @property
    def would_change(self) -> list[str]:
        return [h for h, r in self.hosts.items() if r.would_change]

    def summary(self) -> dict[str, Any]:
        return {"rc": self.rc, "status": self.status, "wall_s": round(self.wall_s, 2), "hosts": _summary(self)}

    def cases(self) -> list[Case]:
        out = []
        for h, r in self.hosts.items():
            tail = r.failure.get("log_tail") or []
            msg = f"{r.outcome}: {'; '.join(r.messages)}" + (f" | log: {' | '.join(tail[-5:])}" if tail else "")
            out.append(Case(name=h, group="deploy", ok=r.outcome in ("updated", "unchanged"), message=msg[:1500]))
        return out


def _summary(res: PlaybookResult | DeployOutcome) -> dict[str, Any]:
    return {h: {"outcome": r.outcome, "messages": r.messages, **({"failure": r.failure} if r.failure else {})}
            for h, r in res.hosts.items()}


def apply(cfg: RolloutConfig, inv: Inventory, hosts: list[str], image: str, run_dir: Path, *, check: bool = False,
          image_tarball: str | None = None, extra_vars: dict[str, Any] | None = None,
          credentials: registry.Credentials | None = None, quiet: bool = False,
          tags: str | None = None, label: str | None = None) -> DeployOutcome:
    """Run the deploy playbook: preflight, pull (or load the tarball), weights, rolling restart with health.
    `credentials` (from the environment or the Docker config file) reach the hosts' login through the 0600
    file of rollout/runner.py, never through the playbook's environment."""
    ref = registry.parse_image(image)
    extravars = {"rollout_image": str(ref), "rollout_registry": ref.registry, **_common_vars(cfg),
                 **(extra_vars or {})}
    if cfg.registry_ca_bundle:
        extravars["rollout_registry_ca_bundle"] = str(_abs(cfg.registry_ca_bundle))
    if image_tarball:
        extravars["image_tarball"] = str(Path(image_tarball).resolve())
    env = ({registry.USER_ENV: credentials.username, registry.PASSWORD_ENV: credentials.password}
           if credentials else None)
    res = run_playbook("deploy", inv.path, hosts, run_dir, extravars, check=check, forks=cfg.forks, quiet=quiet,
                       envvars=env, tags=tags, label=label)
    return DeployOutcome(res.rc, res.status, res.wall_s, res.hosts, check)


def unreachable_only(out: DeployOutcome) -> bool:
    """Hosts were unreachable (ansible-runner rc 4) and none failed a task: worth another try, if nothing
    changed (a preflight changes nothing)."""
    bad = [r for r in out.hosts.values() if r.failed or r.unreachable]
    return out.rc != 0 and bool(bad) and all(r.unreachable and not r.failed and not r.switched for r in bad)


def preflight(cfg: RolloutConfig, inv: Inventory, hosts: list[str], image: str, run_dir: Path, *,
              policy: retry.Policy, log: retry.RetryLog | None = None, sleep: Any = time.sleep,
              **kw: Any) -> DeployOutcome:
    """Play 1 of the deploy playbook only (preflight, pull, weights: no server is touched), again with back-off
    while hosts are merely unreachable (a transient SSH failure), at most policy.attempts times."""
    n = 0

    def once() -> DeployOutcome:
        nonlocal n
        n += 1
        return apply(cfg, inv, hosts, image, run_dir, tags="preflight,image,weights",
                     label="preflight" if n == 1 else f"preflight-{n}", **kw)

    def why(out: DeployOutcome) -> str | None:
        if not unreachable_only(out):
            return None
        gone = sorted(h for h, r in out.hosts.items() if r.unreachable)
        return f"rc {out.rc}: unreachable {', '.join(gone)}: {'; '.join(out.hosts[gone[0]].messages)[:200]}"

    return retry.call(once, what="ssh", name=f"preflight playbook on {', '.join(hosts)}", policy=policy, log=log,
                      retry_result=why, sleep=sleep)


def roll_back(cfg: RolloutConfig, inv: Inventory, hosts: list[str], run_dir: Path, *, to: str = "previous",
              quiet: bool = False) -> PlaybookResult:
    """Put `hosts` back on their recorded previous version (to="current": run the recorded current one again)."""
    ev = _common_vars(cfg) if to == "previous" else {**_common_vars(cfg), "rollback_to": "current"}
    return run_playbook("rollback", inv.path, hosts, run_dir, ev, forks=cfg.forks, quiet=quiet,
                        label="rollback" if to == "previous" else "restore")


@dataclass
class RouterOutcome:
    """One run of the router playbook (ansible/playbooks/router.yml): per router host, what it reported."""

    rc: int
    state: str
    wall_s: float
    routers: dict[str, dict[str, Any]]  # host -> url, metrics_url, fleet_group, workers, version, pid, changed
    errors: dict[str, list[str]]  # host -> failure messages

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.errors


def router(cfg: RolloutConfig, inv: Inventory, *, state: str = "present", run_dir: Path | None = None,
           quiet: bool = False, extra_vars: dict[str, Any] | None = None) -> RouterOutcome:
    """Deploy (state present) or stop (state stopped) sglang-router on the inventory's sglang_router hosts."""
    from sglfleet.rollout.inventory import ROUTER_GROUP

    hosts = sorted(inv.groups.get(ROUTER_GROUP, set()))
    if not hosts:
        raise UsageError(f"the inventory {inv.path} has no {ROUTER_GROUP} group: no router to deploy")
    if state not in ("present", "stopped"):
        raise UsageError(f"router state must be present or stopped, got '{state}'")
    run_dir = run_dir or new_run_dir(_abs(cfg.runs_dir), "router")
    res = run_playbook("router", inv.path, hosts, run_dir, {"router_state": state, **(extra_vars or {})},
                       forks=cfg.forks, quiet=quiet, label=f"router-{state}")
    errors = {h: r.messages or [r.outcome] for h, r in res.hosts.items() if r.failed or r.unreachable}
    if res.rc != 0 and not errors:  # the playbook failed before any host ran a task (a syntax error, say)
        errors["(playbook)"] = [f"rc {res.rc} ({res.status}): {_stdout_tail(res.artifacts)}"]
    return RouterOutcome(res.rc, state, res.wall_s, {h: dict(r.data.get("router") or {})
                                                     for h, r in res.hosts.items()}, errors)


def _stdout_tail(artifacts: Path, n: int = 8) -> str:
    lines = [ln for f in sorted(artifacts.glob("*/stdout")) for ln in f.read_text(errors="replace").splitlines()
             if ln.strip()]
    return " | ".join(lines[-n:])[:800] or "no output"


def _finish(report: dict[str, Any], cases: list[Case], run_dir: Path, t0: float, rc: int,
            quiet: bool) -> tuple[int, Path]:
    report["wall_s"] = round(time.monotonic() - t0, 2)
    report["exit_code"] = rc
    write_json(run_dir / "report.json", report)
    write_junit(run_dir / "junit.xml", f"rollout-{report['action']}", cases)
    if not quiet:
        print(f"{report['action']}: {report.get('result')} - changed hosts: "
              f"{', '.join(report.get('changed_hosts', [])) or 'none'} (report {run_dir / 'report.json'})",
              file=sys.stderr)
    return rc, run_dir


def rollback(cfg: RolloutConfig, hosts_pattern: str, *, check: bool = False, quiet: bool = False) -> tuple[int, Path]:
    inv, hosts = prepare(cfg, hosts_pattern)
    run_dir = new_run_dir(_abs(cfg.runs_dir), "rollback")
    t0 = time.monotonic()
    res = run_playbook("rollback", inv.path, hosts, run_dir, _common_vars(cfg), check=check, forks=cfg.forks,
                       quiet=quiet)
    report = {"action": "rollback", "hosts": hosts, "rc": res.rc, "detail": _summary(res),
              "changed_hosts": [h for h, r in res.hosts.items() if r.outcome in ("updated", "restored-previous")],
              "rolled_back_hosts": [h for h, r in res.hosts.items() if r.outcome == "updated"]}
    report["result"] = "rolled-back" if res.rc == 0 else "rollback-failed"
    cases = [Case(name=h, group="rollback", ok=r.outcome in ("updated", "unchanged"), message=r.outcome)
             for h, r in res.hosts.items()]
    return _finish(report, cases, run_dir, t0, EXIT_OK if res.rc == 0 else EXIT_FAIL, quiet)


def status(cfg: RolloutConfig, hosts_pattern: str, *, quiet: bool = True) -> tuple[int, dict[str, Any]]:
    inv, hosts = prepare(cfg, hosts_pattern)
    run_dir = new_run_dir(_abs(cfg.runs_dir), "status")
    res = run_playbook("status", inv.path, hosts, run_dir, {}, forks=cfg.forks, quiet=quiet)
    out: dict[str, Any] = {}
    for h, r in res.hosts.items():
        out[h] = dict(r.data) if r.data else {"host": h, "error": "; ".join(r.messages) or r.outcome}
        out[h]["endpoint"] = inv.endpoint(h)
        out[h]["reachable"] = not r.unreachable
    write_json(run_dir / "status.json", out)
    return (EXIT_OK if res.rc == 0 else EXIT_FAIL), out


def render(cfg: RolloutConfig, hosts_pattern: str, image: str | None = None) -> dict[str, Any]:
    inv, hosts = prepare(cfg, hosts_pattern)
    run_dir = new_run_dir(_abs(cfg.runs_dir), "render")
    ev = {"rollout_image_override": image} if image else {}
    res = run_playbook("render", inv.path, hosts, run_dir, ev, forks=cfg.forks, quiet=True)
    if res.rc != 0:
        raise TargetError(f"render failed: {_summary(res)}")
    return {h: r.data for h, r in res.hosts.items()}
