"""deploy -> gate -> promote, or automatic rollback of the changed hosts; rollback; status."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.errors import EXIT_FAIL, EXIT_OK, TargetError, UsageError
from pipeline.reports import Case, new_run_dir, write_json, write_junit
from rollout import REPO_ROOT, registry
from rollout.config import RolloutConfig
from rollout.inventory import Inventory, load_inventory
from rollout.runner import PlaybookResult, run_playbook


def _abs(p: str) -> Path:
    path = Path(p)
    return path if path.is_absolute() else (REPO_ROOT / path if not path.exists() else path.resolve())


def _prepare(cfg: RolloutConfig, hosts_pattern: str) -> tuple[Inventory, list[str]]:
    inv = load_inventory(_abs(cfg.inventory))
    hosts = inv.resolve(hosts_pattern)
    inv.check_fleet(hosts)
    return inv, hosts


def _common_vars(cfg: RolloutConfig) -> dict[str, Any]:
    return {"rollout_serial": cfg.serial, "rollout_max_fail_percentage": cfg.max_fail_percentage}


def _summary(res: PlaybookResult) -> dict[str, Any]:
    return {h: {"outcome": r.outcome, "messages": r.messages} for h, r in res.hosts.items()}


def _run_gate(cfg: RolloutConfig, url: str, out: Path) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "validation", "run", "--target", url, "--out", str(out)]
    if cfg.gate_config:
        cmd += ["--config", str(_abs(cfg.gate_config))]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.gate_timeout_s, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return EXIT_FAIL, f"gate timed out after {cfg.gate_timeout_s:.0f}s"
    tail = (p.stdout + p.stderr).strip().splitlines()
    return p.returncode, (tail[-1] if tail else "")[:400]


def deploy(cfg: RolloutConfig, hosts_pattern: str, image: str, *, check: bool = False,
           image_tarball: str | None = None, extra_vars: dict[str, Any] | None = None,
           quiet: bool = False) -> tuple[int, Path]:
    # ---- everything below until run_playbook changes nothing: bad input ends here with exit 2
    ref = registry.parse_image(image)
    inv, hosts = _prepare(cfg, hosts_pattern)
    needs_auth = cfg.registry_auth or any(bool(inv.hostvars.get(h, {}).get("rollout_registry_auth")) for h in hosts)
    auth = registry.credentials(needs_auth) if not image_tarball else None
    if cfg.gate and not check and importlib.util.find_spec("validation") is None:
        raise UsageError("the validation gate (python -m validation) is not installed; use --no-gate to skip it")
    if image_tarball and not Path(image_tarball).is_file():
        raise UsageError(f"image tarball not found: {image_tarball}")
    digest = None
    if not image_tarball:
        reg = registry.Registry(ref.registry, auth, cfg.registry_timeout_s)
        try:
            reg.check()
            digest = reg.require(ref)
        finally:
            reg.close()
    run_dir = new_run_dir(_abs(cfg.runs_dir), "deploy-check" if check else "deploy")
    t0 = time.monotonic()
    report: dict[str, Any] = {"action": "deploy", "image": str(ref), "digest": digest, "hosts": hosts,
                              "inventory": str(inv.path), "check": check, "run_dir": str(run_dir)}
    extravars = {"rollout_image": str(ref), "rollout_registry": ref.registry, **_common_vars(cfg),
                 **(extra_vars or {})}
    if image_tarball:
        extravars["image_tarball"] = str(Path(image_tarball).resolve())
    if not quiet:
        print(f"deploy {ref} to {', '.join(hosts)} (run dir {run_dir})", file=sys.stderr)
    res = run_playbook("deploy", inv.path, hosts, run_dir, extravars, check=check, forks=cfg.forks, quiet=quiet)
    report["deploy"] = {"rc": res.rc, "status": res.status, "wall_s": round(res.wall_s, 2), "hosts": _summary(res)}
    updated = [h for h, r in res.hosts.items() if r.outcome == "updated"]
    restored = [h for h, r in res.hosts.items() if r.restored]
    # Switched to the new container but neither recorded nor restored: the run stopped during the health
    # wait (host unreachable, controller interrupted). The host state still names the old version.
    interrupted = [h for h, r in res.hosts.items() if r.switched and not r.recorded and not r.restored]
    report["changed_hosts"] = sorted(set(updated) | set(restored) | set(interrupted))
    report["restored_hosts"] = restored
    report["interrupted_hosts"] = interrupted
    cases = [Case(name=h, group="deploy", ok=r.outcome in ("updated", "unchanged"),
                  message=f"{r.outcome}: {'; '.join(r.messages)}"[:500]) for h, r in res.hosts.items()]

    if check:
        report["would_change"] = [h for h, r in res.hosts.items() if r.would_change]
        report["result"] = "check" if res.rc == 0 else "check-failed"
        return _finish(report, cases, run_dir, t0, EXIT_OK if res.rc == 0 else EXIT_FAIL, quiet)

    ok = res.rc == 0 and all(r.outcome in ("updated", "unchanged") for r in res.hosts.values())
    if ok and not report["changed_hosts"] and digest is not None:
        # Same image again: nothing changed anywhere. If it is already the promoted digest, the gate
        # passed on these endpoints before and there is nothing to decide: do not gate or push again.
        reg = registry.Registry(ref.registry, auth, cfg.registry_timeout_s)
        try:
            already = reg.digest(ref.with_tag(cfg.promoted_tag)) == digest
        finally:
            reg.close()
        if already:
            report["gate_failed_hosts"] = []
            report["promotion"] = {"skipped": f"{ref} is already {cfg.promoted_tag} and no host changed"}
            report["result"] = "unchanged"
            if not quiet:
                print(f"no host changed and {ref} is already {cfg.promoted_tag}: gate and promotion skipped",
                      file=sys.stderr)
            return _finish(report, cases, run_dir, t0, EXIT_OK, quiet)
    gate_failed: list[str] = []
    if ok and cfg.gate:
        report["gate"] = {}
        for h in hosts:
            url = inv.endpoint(h)
            out = run_dir / "gate" / h
            rc, line = _run_gate(cfg, url, out)
            report["gate"][h] = {"endpoint": url, "rc": rc, "report_dir": str(out), "summary": line}
            cases.append(Case(name=h, group="gate", ok=rc == 0, message=line))
            if not quiet:
                print(f"gate {h} ({url}): {'PASS' if rc == 0 else 'FAIL'} rc={rc} {line}", file=sys.stderr)
            if rc != 0:
                gate_failed.append(h)
                break  # one failing endpoint decides: do not spend time gating the others
        ok = not gate_failed
    report["gate_failed_hosts"] = gate_failed

    if ok:
        if image_tarball:
            report["promotion"] = {"skipped": "air-gapped tarball: no registry to promote in"}
        elif cfg.gate:
            gate_dir = run_dir / "gate"
            report["promotion"] = registry.promote(ref, cfg.promoted_tag, gate_dir, auth, cfg.registry_timeout_s)
            cases.append(Case(name=str(ref), group="promote", ok=True, message=report["promotion"]["promoted"]))
        else:
            report["promotion"] = {"skipped": "gate disabled (--no-gate): not promoting"}
        report["result"] = "promoted" if "promoted" in report["promotion"] else "deployed"
        return _finish(report, cases, run_dir, t0, EXIT_OK, quiet)

    # ---- failure: put every host that runs the new version back on its previous one
    to_roll_back = updated
    report["rolled_back_hosts"] = []
    if to_roll_back and cfg.auto_rollback:
        if not quiet:
            print(f"rolling back {', '.join(to_roll_back)}", file=sys.stderr)
        rb = run_playbook("rollback", inv.path, to_roll_back, run_dir, _common_vars(cfg), forks=cfg.forks, quiet=quiet)
        report["rollback"] = {"rc": rb.rc, "wall_s": round(rb.wall_s, 2), "hosts": _summary(rb)}
        report["rolled_back_hosts"] = [h for h, r in rb.hosts.items() if r.outcome == "updated"]
        for h, r in rb.hosts.items():
            cases.append(Case(name=h, group="rollback", ok=r.outcome == "updated", message=r.outcome))
    report["recovered_hosts"] = []
    if interrupted and cfg.auto_rollback:
        # Put them back on the version their state file still records as current.
        if not quiet:
            print(f"restoring the recorded version on {', '.join(interrupted)}", file=sys.stderr)
        rs = run_playbook("rollback", inv.path, interrupted, run_dir, {**_common_vars(cfg), "rollback_to": "current"},
                          forks=cfg.forks, quiet=quiet, label="restore")
        report["restore"] = {"rc": rs.rc, "wall_s": round(rs.wall_s, 2), "hosts": _summary(rs)}
        report["recovered_hosts"] = [h for h, r in rs.hosts.items() if r.outcome in ("updated", "unchanged")
                                     and not r.failed]
        for h, r in rs.hosts.items():
            cases.append(Case(name=h, group="restore", ok=h in report["recovered_hosts"], message=r.outcome))
    report["result"] = "gate-failed" if gate_failed else "deploy-failed"
    return _finish(report, cases, run_dir, t0, EXIT_FAIL, quiet)


def _finish(report: dict[str, Any], cases: list[Case], run_dir: Path, t0: float, rc: int,
            quiet: bool) -> tuple[int, Path]:
    report["wall_s"] = round(time.monotonic() - t0, 2)
    report["exit_code"] = rc
    write_json(run_dir / "report.json", report)
    write_junit(run_dir / "junit.xml", f"rollout-{report['action']}", cases)
    if not quiet:
        print(f"{report['action']}: {report.get('result')} - changed hosts: "
              f"{', '.join(report.get('changed_hosts', [])) or 'none'}"
              + (f"; rolled back: {', '.join(report['rolled_back_hosts'])}" if report.get("rolled_back_hosts") else "")
              + f" (report {run_dir / 'report.json'})", file=sys.stderr)
    return rc, run_dir


def rollback(cfg: RolloutConfig, hosts_pattern: str, *, check: bool = False, quiet: bool = False) -> tuple[int, Path]:
    inv, hosts = _prepare(cfg, hosts_pattern)
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
    inv, hosts = _prepare(cfg, hosts_pattern)
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
    inv, hosts = _prepare(cfg, hosts_pattern)
    run_dir = new_run_dir(_abs(cfg.runs_dir), "render")
    ev = {"rollout_image_override": image} if image else {}
    res = run_playbook("render", inv.path, hosts, run_dir, ev, forks=cfg.forks, quiet=True)
    if res.rc != 0:
        raise TargetError(f"render failed: {_summary(res)}")
    return {h: r.data for h, r in res.hosts.items()}
