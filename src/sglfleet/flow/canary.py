"""Execute a rollout plan (flow/plan.py) stage by stage: every stage is one call returning one typed result;
the run's record is the list of those results, turned into the report only at the end.

The hooks (deploy a batch, gate, smoke-gate, load test, roll back, promote) are passed in as `Hooks`, so the
same executor runs the real Ansible + gate + load test (flow/promote.py) and the fault-matrix tests' fakes in
front of a real router (tests/test_flow_canary.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sglfleet.flow.plan import GroupPlan, Plan
from sglfleet.flow.traffic import ClientLoad
from sglfleet.rollout.router import RouterClient, RouterError, add_back, drain


@dataclass(frozen=True)
class StepResult:
    kind: str
    group: str
    hosts: tuple[str, ...]
    ok: bool
    summary: str
    seconds: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeployResult:
    ok: bool
    updated: tuple[str, ...]  # switched to the new version and recorded it
    restored: tuple[str, ...]  # the playbook put the previous version back itself
    interrupted: tuple[str, ...]  # switched, neither recorded nor restored
    summary: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckResult:  # a gate, smoke gate or load test
    ok: bool
    summary: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RestoreResult:
    ok: bool
    restored: tuple[str, ...]
    summary: str


@dataclass
class Hooks:
    deploy: Callable[[tuple[str, ...]], DeployResult]
    gate: Callable[[str, str], CheckResult]  # (host, url) -> full gate
    smoke: Callable[[str, str], CheckResult]  # (host, url) -> smoke gate
    loadtest: Callable[[str, str], CheckResult]  # (label, url) -> capacity against the SLOs
    rollback: Callable[[tuple[str, ...], str], RestoreResult]  # (hosts, to: previous | current)
    promote: Callable[[], CheckResult] | None = None
    preflight: Callable[[tuple[str, ...]], CheckResult] | None = None  # every host, before any changes
    log: Callable[[str], None] = lambda _m: None


@dataclass(frozen=True)
class OutOfRouter:
    host: str
    seconds: float
    spans: int


@dataclass(frozen=True)
class RolloutRecord:
    ok: bool
    result: str  # promoted | deployed | gate-failed | smoke-failed | loadtest-failed | deploy-failed | router-failed
    steps: tuple[StepResult, ...]
    changed: tuple[str, ...]  # in the order they changed
    rolled_back: tuple[str, ...]
    failed_at: str | None
    out_of_router: tuple[OutOfRouter, ...]
    traffic: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Failed(Exception):
    def __init__(self, result: str, where: str) -> None:
        super().__init__(where)
        self.result, self.where = result, where


class Executor:
    def __init__(self, plan: Plan, hooks: Hooks, *, load: ClientLoad | None = None, drain_timeout_s: float = 60.0,
                 add_timeout_s: float = 180.0, grace_s: float = 5.0) -> None:
        self.plan, self.h, self.load = plan, hooks, load
        self.drain_timeout_s, self.add_timeout_s, self.grace_s = drain_timeout_s, add_timeout_s, grace_s
        self.steps: list[StepResult] = []
        self.changed: list[DeployResult] = []  # batches that changed, in order (rollback goes newest first)
        self.batch_of: dict[int, tuple[str, ...]] = {}
        self.routers: dict[str, RouterClient] = {}
        self.out_since: dict[str, float] = {}
        self.out_total: dict[str, float] = {}
        self.out_spans: dict[str, int] = {}

    # ------------------------------------------------------------------ helpers
    def _router(self, gp: GroupPlan) -> RouterClient | None:
        if not gp.router:
            return None
        if gp.router not in self.routers:
            self.routers[gp.router] = RouterClient(gp.router)
        return self.routers[gp.router]

    def _stage(self, name: str) -> None:
        if self.load is not None:
            self.load.set_stage(name)
        self.h.log(f"stage: {name}")

    def _add(self, kind: str, group: str, hosts: tuple[str, ...], ok: bool, summary: str, t0: float,
             data: dict[str, Any] | None = None) -> StepResult:
        st = StepResult(kind, group, hosts, ok, summary, round(time.monotonic() - t0, 2), data or {})
        self.steps.append(st)
        self.h.log(f"{kind} {', '.join(hosts)}: {'ok' if ok else 'FAILED'} {summary}")
        return st

    def _drain(self, gp: GroupPlan, batch: tuple[str, ...], label: str = "drain") -> None:
        self._stage(f"{label} {gp.group} {','.join(batch)}")
        t0 = time.monotonic()
        r = self._router(gp)
        if r is None:
            self._add(label, gp.group, batch, True, "no router: not drained", t0)
            return
        res = []
        for h in batch:
            d = drain(r, h, gp.workers[h], timeout_s=self.drain_timeout_s, grace_s=self.grace_s)
            if d.removed:
                self.out_since.setdefault(h, time.monotonic())
            res.append(d)
        self._add(label, gp.group, batch, True, "; ".join(f"{d.host}: {'removed, ' if d.removed else 'not listed, '}"
                                                        f"{d.how}" for d in res), t0,
                  {"drains": [asdict(d) for d in res]})

    def _add_back(self, gp: GroupPlan, batch: tuple[str, ...], label: str = "add-back") -> None:
        self._stage(f"{label} {gp.group} {','.join(batch)}")
        t0 = time.monotonic()
        r = self._router(gp)
        if r is None:
            self._add(label, gp.group, batch, True, "no router: nothing to add", t0)
            return
        res = []
        for h in batch:
            a = add_back(r, h, gp.workers[h], timeout_s=self.add_timeout_s)
            since = self.out_since.pop(h, None)
            if since is not None:
                self.out_total[h] = self.out_total.get(h, 0.0) + time.monotonic() - since
                self.out_spans[h] = self.out_spans.get(h, 0) + 1
            res.append(a)
        self._add(label, gp.group, batch, True, "; ".join(f"{a.host} healthy in the router after {a.waited_s:.1f} s"
                                                        for a in res), t0, {"added": [asdict(a) for a in res]})

    def _check(self, kind: str, gp: GroupPlan, hosts: tuple[str, ...], fn: Callable[[], CheckResult],
               fail_result: str) -> None:
        self._stage(f"{kind} {gp.group} {','.join(hosts)}")
        t0 = time.monotonic()
        c = fn()
        self._add(kind, gp.group, hosts, c.ok, c.summary, t0, c.data)
        if not c.ok:
            raise _Failed(fail_result, f"{kind} {','.join(hosts)}")

    # ------------------------------------------------------------------ the run
    def run(self) -> RolloutRecord:
        result, failed_at = "promoted", None
        try:
            if self.h.preflight is not None:
                self._stage("preflight")
                t0 = time.monotonic()
                c = self.h.preflight(self.plan.hosts)
                self._add("preflight", "all", self.plan.hosts, c.ok, c.summary, t0, c.data)
                if not c.ok:
                    raise _Failed("deploy-failed", "preflight")
            for gp in self.plan.groups:
                for i, batch in enumerate([(gp.canary,), *gp.batches]):
                    self._batch(gp, batch, canary=i == 0)
            self._fleet()
            if self.h.promote is not None:
                self._stage("promote")
                t0 = time.monotonic()
                c = self.h.promote()
                self._add("promote", "all", self.plan.hosts, c.ok, c.summary, t0, c.data)
                if not c.ok:
                    raise _Failed("promotion-failed", "promote")
                result = c.data.get("result", "promoted")
            else:
                result = "deployed"
        except _Failed as f:
            result, failed_at = f.result, f.where
        except RouterError as exc:
            result, failed_at = "router-failed", str(exc)
            self._add("router", "all", (), False, str(exc), time.monotonic())
        rolled: tuple[str, ...] = ()
        if failed_at is not None:
            rolled = self._roll_back()
        self._stage("end")
        for h, since in self.out_since.items():  # hosts still out (a failed add-back, a dead router)
            self.out_total[h] = self.out_total.get(h, 0.0) + time.monotonic() - since
            self.out_spans[h] = self.out_spans.get(h, 0) + 1
        for r in self.routers.values():
            r.close()
        changed = tuple(h for d in self.changed for h in (*d.updated, *d.restored, *d.interrupted))
        traffic = tuple({"stage": s.stage, "sent": s.sent, "ok": s.ok, "failed": s.failed, "errors": dict(s.errors)}
                        for s in (self.load.result() if self.load else []))
        out = tuple(OutOfRouter(h, round(self.out_total[h], 2), self.out_spans.get(h, 0)) for h in self.out_total)
        return RolloutRecord(failed_at is None, result, tuple(self.steps), changed, rolled, failed_at, out, traffic)

    def _batch(self, gp: GroupPlan, batch: tuple[str, ...], *, canary: bool) -> None:
        self._drain(gp, batch)
        self._stage(f"deploy {gp.group} {','.join(batch)}")
        t0 = time.monotonic()
        dep = self.h.deploy(batch)
        if dep.updated or dep.interrupted or dep.restored:
            self.batch_of[len(self.changed)] = batch
            self.changed.append(dep)
        self._add("deploy", gp.group, batch, dep.ok, dep.summary, t0, dep.data)
        if not dep.ok:
            raise _Failed("deploy-failed", f"deploy {','.join(batch)}")
        if canary:
            h = batch[0]
            self._check("gate", gp, batch, lambda: self.h.gate(h, gp.workers[h]), "gate-failed")
            self._check("loadtest", gp, batch, lambda: self.h.loadtest(f"canary {h}", gp.workers[h]),
                        "loadtest-failed")
        else:
            for h in batch:
                self._check("smoke-gate", gp, (h,), lambda h=h: self.h.smoke(h, gp.workers[h]),  # type: ignore[misc]
                            "smoke-failed")
        self._add_back(gp, batch)

    def _fleet(self) -> None:
        for gp in self.plan.groups:
            if not gp.router:
                continue
            self._check("fleet-loadtest", gp, tuple(gp.workers),
                        lambda gp=gp: self.h.loadtest(f"fleet {gp.group}", gp.router),  # type: ignore[misc]
                        "loadtest-failed")

    def _roll_back(self) -> tuple[str, ...]:
        """Newest batch first: drain it (if the router answers), put its previous version back, add it back."""
        done: list[str] = []
        by_host = {h: gp for gp in self.plan.groups for h in gp.workers}
        for i in reversed(range(len(self.changed))):
            dep, batch = self.changed[i], self.batch_of[i]
            gp = by_host[batch[0]]
            router_ok = True
            try:
                self._drain(gp, batch, "rollback-drain")
            except RouterError as exc:
                router_ok = False
                self._add("rollback-drain", gp.group, batch, False, f"router unreachable, restarting without a "
                          f"drain: {exc}", time.monotonic())
            for hosts, to in ((dep.updated, "previous"), (dep.interrupted, "current")):
                if not hosts:
                    continue
                self._stage(f"rollback {gp.group} {','.join(hosts)}")
                t0 = time.monotonic()
                rb = self.h.rollback(hosts, to)
                self._add("rollback" if to == "previous" else "restore", gp.group, hosts, rb.ok, rb.summary, t0)
                done.extend(rb.restored)
            if router_ok:
                try:
                    self._add_back(gp, batch, "rollback-add-back")
                except RouterError as exc:
                    self._add("rollback-add-back", gp.group, batch, False, str(exc), time.monotonic())
        for h in list(self.out_since):  # drained but never changed (a deploy that changed nothing): back in
            try:
                self._add_back(by_host[h], (h,), "rollback-add-back")
            except RouterError as exc:
                self._add("rollback-add-back", by_host[h].group, (h,), False, str(exc), time.monotonic())
        return tuple(done)
