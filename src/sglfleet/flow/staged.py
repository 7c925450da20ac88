"""The canary rollout with the real stages: the plan (flow/plan.py) executed by flow/canary.py with hooks that
run the deploy playbook per batch, the validation gate (full on the canary, smoke on the later batches), the
load test (the canary alone, then the fleet through its router), promotion, and the rollback playbook. The
report is made from the typed record once, at the end."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from sglfleet.flow import promote as pr
from sglfleet.flow.canary import CheckResult, DeployResult, Executor, Hooks, RestoreResult
from sglfleet.flow.plan import Plan, smoke_gate_config
from sglfleet.flow.report import Stage
from sglfleet.flow.traffic import ClientLoad
from sglfleet.pipeline.errors import EXIT_FAIL, EXIT_OK, PipelineError
from sglfleet.pipeline.reports import Case
from sglfleet.rollout import deploy as ro
from sglfleet.rollout import metrics, registry
from sglfleet.rollout.config import RolloutConfig
from sglfleet.rollout.inventory import Inventory
from sglfleet.rollout.retry import RetryLog
from sglfleet.rollout.router import RouterClient


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-")


def _check(st: Stage) -> CheckResult:
    return CheckResult(st.ok, st.summary, {**st.data, "links": st.links})


def run(cfg: RolloutConfig, inv: Inventory, plan: Plan, ref: registry.ImageRef, digest: str | None,
        reg: registry.Registry | None, run_dir: Path, report: dict[str, Any], stages: list[Stage], gate_cfg: Any,
        image_tarball: str | None, extra_vars: dict[str, Any] | None, quiet: bool, t0: float) -> tuple[int, Path]:
    log = pr._log(quiet)
    creds = reg.creds if reg else None
    smoke_cfg = smoke_gate_config(gate_cfg, run_dir / "smoke-suite") if gate_cfg is not None else None
    extra: list[Case] = []

    def deploy(batch: tuple[str, ...]) -> DeployResult:
        # play 1 (preflight, pull, weights) ran on every host in the preflight stage: the batch only switches
        staged_vars = {**(extra_vars or {}), "rollout_staged": True}
        dep = ro.apply(cfg, inv, list(batch), str(ref), run_dir, image_tarball=image_tarball, extra_vars=staged_vars,
                       credentials=creds, quiet=quiet, label=f"deploy-{_slug('-'.join(batch))}")
        extra.extend(dep.cases())
        fails = [f"{h}: {'; '.join(r.messages)[:300]}" for h, r in dep.hosts.items() if r.failed or r.unreachable]
        return DeployResult(dep.ok, tuple(dep.updated), tuple(dep.restored), tuple(dep.interrupted),
                            f"rc {dep.rc}; changed: {', '.join(dep.changed) or 'none'}"
                            + (f"; {' | '.join(fails)}" if fails else ""), {"deploy": dep.summary()})

    retries = RetryLog(report.setdefault("retries", []))

    def preflight(hosts: tuple[str, ...]) -> CheckResult:
        before = len(retries)
        dep = ro.preflight(cfg, inv, list(hosts), str(ref), run_dir, policy=pr.retry_policy(cfg, "ssh"),
                           log=retries, image_tarball=image_tarball, extra_vars=extra_vars, credentials=creds,
                           quiet=quiet)
        fails = [f"{h}: {'; '.join(r.messages)[:300]}" for h, r in dep.hosts.items() if r.failed or r.unreachable]
        again = len(retries) - before
        return CheckResult(dep.rc == 0 and not fails, f"rc {dep.rc}; preflight, pull, weights on {len(hosts)} "
                           "host(s), no server touched" + (f"; {again} retr{'y' if again == 1 else 'ies'} after "
                                                           "unreachable hosts" if again else "")
                           + (f"; {' | '.join(fails)}" if fails else ""))

    workers = {h: u for g in plan.groups for h, u in g.workers.items()}
    router_prom = {g.router: g.router_metrics for g in plan.groups if g.router and g.router_metrics}

    def metered(label: str, urls: dict[str, str], fn: Any) -> CheckResult:
        """Run a check while the servers' (and the router's) /metrics are sampled; their peaks and growth go
        into the check's data, a file beside its report, and one line of its summary."""
        with metrics.Sampler(urls, period_s=cfg.metrics_period_s) as sampler:
            c = fn()
        m = sampler.summary()
        out = run_dir / "metrics" / f"{_slug(label)}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(m, indent=2))
        links = {**(c.data.get("links") or {}), "server metrics": str(out)}
        return CheckResult(c.ok, f"{c.summary}; metrics: {metrics.summary_line(m)}",
                           {**c.data, "links": links, "metrics": m})

    def gate(h: str, url: str) -> CheckResult:
        return metered(f"gate {h}", {h: url}, lambda: _check(pr.gate_stage(
            url, run_dir / "gate" / h, gate_cfg, quiet=quiet, name=f"gate {h}")))

    def smoke(h: str, url: str) -> CheckResult:
        return metered(f"smoke-gate {h}", {h: url}, lambda: _check(pr.gate_stage(
            url, run_dir / "smoke" / h, smoke_cfg, quiet=quiet, name=f"smoke-gate {h}")))

    def loadtest(label: str, url: str) -> CheckResult:
        if not cfg.loadtest:
            return CheckResult(True, "load test disabled (--no-loadtest)", {"skipped": True})
        # the canary alone: its server; the fleet through its router: every worker and the router itself
        urls = ({h: u for h, u in workers.items() if u == url} or
                {**workers, **({"router": router_prom[url]} if url in router_prom else {})})
        return metered(f"loadtest {label}", urls, lambda: _check(pr.loadtest_stage(
            pr.loadtest_config(cfg, url), run_dir / "loadtest" / _slug(label), cfg.min_capacity, quiet=quiet)))

    def rollback(hosts: tuple[str, ...], to: str) -> RestoreResult:
        if not cfg.auto_rollback:
            return RestoreResult(False, (), "auto_rollback is off: left as it is")
        rb = ro.roll_back(cfg, inv, list(hosts), run_dir, to=to, quiet=quiet)
        ok_out = ("updated",) if to == "previous" else ("updated", "unchanged")
        done = tuple(h for h, r in rb.hosts.items() if r.outcome in ok_out and not r.failed)
        extra.extend(Case(h, "rollback" if to == "previous" else "restore", h in done, r.outcome)
                     for h, r in rb.hosts.items())
        return RestoreResult(rb.rc == 0, done, f"rc {rb.rc}; {'rolled back' if to == 'previous' else 'restored'}: "
                             f"{', '.join(done) or 'none'}")

    def promote() -> CheckResult:
        if image_tarball or reg is None or digest is None:
            return CheckResult(True, "air-gapped tarball: no registry to promote in", {"result": "deployed"})
        ann = {"org.sglang-fleet.gate.verdict": "PASS", "org.sglang-fleet.deploy.hosts": ",".join(plan.hosts),
               "org.sglang-fleet.run": run_dir.name, "org.sglang-fleet.rollout": "canary"}
        dirs = {k: run_dir / k for k in ("gate", "smoke", "loadtest") if (run_dir / k).is_dir()}
        try:
            p = registry.promote(reg, ref, cfg.promoted_tag, digest, dirs, ann)
        except PipelineError as exc:
            return CheckResult(False, f"promotion failed: {exc}")
        return CheckResult(True, f"{p['promoted']} = {digest}; evidence {p['evidence_digest'][:19]}",
                           {**p, "result": "promoted"})

    load = None
    routers = sorted({g.router for g in plan.groups if g.router})
    if cfg.client_load_rate > 0 and routers:
        model = str(inv.hostvars.get(plan.hosts[0], {}).get("model_name") or "default")
        load = ClientLoad(routers[0], rate_per_s=cfg.client_load_rate, model=model).start()
    try:
        rec = Executor(plan, Hooks(deploy, gate, smoke, loadtest, rollback, promote, preflight, log), load=load,
                       drain_timeout_s=cfg.drain_timeout_s, add_timeout_s=cfg.router_add_timeout_s).run()
    finally:
        if load is not None:
            time.sleep(1.0)  # the last requests sent finish under the "end" stage
            load.stop()
    router_state: dict[str, Any] = {}
    for url in routers:  # what the router itself saw: its workers, per-worker health and circuit-breaker state
        c = RouterClient(url)
        try:
            router_state[url] = {"workers": [w.__dict__ for w in c.workers()]} if c.alive() else {"down": True}
        finally:
            c.close()
        if url in router_prom:
            router_state[url]["metrics"] = metrics.scrape(router_prom[url]).to_dict()
    for s in rec.steps:
        stages.append(Stage(f"{s.kind} {','.join(s.hosts)}".strip(), s.ok, s.summary, s.seconds,
                            links=dict(s.data.get("links") or {}), data={k: v for k, v in s.data.items()
                                                                          if k != "links"}))
    if load is not None:
        failed = sum(t["failed"] for t in rec.traffic)
        sent = sum(t["sent"] for t in rec.traffic)
        per = ", ".join(f"{t['stage']}: {t['failed']}/{t['sent']}" for t in rec.traffic if t["sent"])
        stages.append(Stage("client-load", failed == 0, f"{failed} of {sent} requests through the router failed "
                            f"(failed/sent per stage: {per})", data={"per_stage": list(rec.traffic)}))
    out_txt = ", ".join(f"{o.host} {o.seconds:.1f} s" for o in rec.out_of_router) or "none"
    stages.append(Stage("out-of-router", True, f"time each host was out of the router: {out_txt}",
                        data={"hosts": [o.__dict__ for o in rec.out_of_router]}))
    gate_failed = [s.hosts[0] for s in rec.steps if s.kind in ("gate", "smoke-gate") and not s.ok and s.hosts]
    final = {**report, "rollout": "canary", "changed_hosts": sorted(set(rec.changed)),
             "change_order": list(rec.changed), "rolled_back_hosts": list(rec.rolled_back),
             "gate_failed_hosts": gate_failed, "failed_at": rec.failed_at,
             "gate": {s.hosts[0]: {"rc": 0 if s.ok else EXIT_FAIL, "summary": s.summary}
                      for s in rec.steps if s.kind == "gate"},
             "traffic": list(rec.traffic), "out_of_router": [o.__dict__ for o in rec.out_of_router],
             "router": router_state, "steps": [s.__dict__ for s in rec.steps]}
    promo = next((s for s in rec.steps if s.kind == "promote"), None)
    if promo is not None:
        final["promotion"] = {k: v for k, v in promo.data.items() if k != "result"}
    lts = [s for s in rec.steps if s.kind in ("loadtest", "fleet-loadtest")]
    if lts:
        final["loadtest"] = {"ok": all(s.ok for s in lts), "summary": lts[-1].summary,
                             "capacity": lts[-1].data.get("capacity")}
    rc = EXIT_OK if rec.ok else EXIT_FAIL
    stages.append(export_verdicts(cfg, run_dir, {**final, "result": rec.result, "exit_code": rc,
                                                 "wall_s": round(time.monotonic() - t0, 2)}))
    final["metrics_textfiles"] = list(stages[-1].links.values())
    return pr._finish(run_dir, final, stages, extra, rec.result, rc, quiet, t0)


def export_verdicts(cfg: RolloutConfig, run_dir: Path, record: dict[str, Any]) -> Stage:
    """The verdicts in Prometheus text format: run_dir/rollout.prom, and cfg.metrics_textfile (node-exporter's
    textfile collector) when set. A textfile that cannot be written is said, never a reason to fail the run."""
    t = time.monotonic()
    paths = [run_dir / "rollout.prom"] + ([Path(cfg.metrics_textfile)] if cfg.metrics_textfile else [])
    links, errors, names = {}, [], []
    for p in paths:
        try:
            names = metrics.export(record, p)
            links[p.name if p.parent == run_dir else f"textfile {p}"] = str(p)
        except OSError as exc:
            errors.append(f"{p}: {exc}")
    written = ", ".join(str(p) for p in links.values()) or "nowhere"
    summary = (f"{len(names)} metric families ({metrics.PREFIX}_*) written to {written}"
               + (f"; NOT written: {'; '.join(errors)}" if errors else ""))
    return Stage("metrics-export", True, summary, time.monotonic() - t, links=links, data={"names": names})
