"""The rollout as a plan: which host is each group's canary, the batches after it, the router each group sits
behind, and what every stage will run. Built from the inventory and the configs only (it changes nothing and
reaches nothing); `make deploy CHECK=1` prints it, the staged rollout (flow/canary.py) executes it.

Per fleet group (pcie, nvlink), in inventory order:
    canary:  drain -> deploy -> full gate -> load test on the canary alone -> add back
    batches: drain -> deploy -> smoke gate (health, one generation, a short T=0 lossless check) -> add back
then a load test of the whole fleet through its router, then promotion. Any failure rolls back what changed,
newest first, each host drained before its restart.

The statistical budget: each gated host is a chance to refuse a correct build. The canary gets the full gate
(its sampled T>0 verdict is built for a false-fail share of `likelihood.alpha`: 1 % by default, 0.1 % in the
production profile sglang-ddtree.yaml); the later
batches get the smoke gate, whose only verdict on the answers is T=0 equality with the baseline up to the
target's own near-ties: no sampled statistic, so no sampling false-fail. The rollout's total is bounded by
(canaries x alpha) + (smoke-gated hosts x 0), printed with the plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sglfleet.pipeline.errors import UsageError
from sglfleet.rollout.inventory import Inventory

SMOKE_PROMPTS = ("factual", "code", "arithmetic")  # the smoke gate's T=0 prompts (of the gate's suite)


@dataclass(frozen=True)
class Step:
    kind: str  # drain | deploy | gate | smoke-gate | loadtest | add-back | fleet-loadtest | promote | preflight
    group: str
    hosts: tuple[str, ...]
    does: str  # one line: what this stage runs


@dataclass(frozen=True)
class GroupPlan:
    group: str
    router: str | None  # the router's URL for this group, or None (no drain / add-back)
    canary: str
    canary_named: bool  # rollout_canary: true in the inventory (else the group's first host)
    batches: tuple[tuple[str, ...], ...]  # after the canary
    workers: dict[str, str] = field(default_factory=dict)  # host -> URL the router knows it by
    router_metrics: str | None = None  # the router's Prometheus URL, when the inventory's router role names it


@dataclass(frozen=True)
class Budget:
    full_gate_false_fail: float  # per canary
    smoke_gate_false_fail: float  # per smoke-gated host
    canaries: int
    smoke_hosts: int

    @property
    def total(self) -> float:
        return self.canaries * self.full_gate_false_fail + self.smoke_hosts * self.smoke_gate_false_fail


@dataclass(frozen=True)
class Plan:
    image: str
    hosts: tuple[str, ...]
    groups: tuple[GroupPlan, ...]
    steps: tuple[Step, ...]
    budget: Budget
    gate: str  # what the full gate is (config path or "disabled")
    unverified: tuple[str, ...] = ()  # what a check could not verify (registry down, ...)

    def order(self) -> list[str]:
        return [h for g in self.groups for h in (g.canary, *[x for b in g.batches for x in b])]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["budget"]["total"] = self.budget.total
        d["order"] = self.order()
        return d

    def render(self) -> str:
        b = self.budget
        out = [f"plan: {self.image} to {len(self.hosts)} host(s), order {' -> '.join(self.order())}"]
        for g in self.groups:
            router = g.router or "none (no drain, no add-back)"
            if g.router_metrics:
                router += f" (router role; metrics {g.router_metrics})"
            out.append(f"  group {g.group}: router {router}; canary {g.canary}"
                       f" ({'named in the inventory' if g.canary_named else 'first host of the group'})"
                       + (f"; batches {' | '.join(', '.join(x) for x in g.batches)}" if g.batches else
                          "; no later batch"))
        for i, s in enumerate(self.steps, 1):
            out.append(f"  {i:2d}. [{s.group}] {s.kind:<14} {', '.join(s.hosts) or '-':<20} {s.does}")
        out.append(f"  false-fail budget: {b.canaries} canary full gate(s) x {b.full_gate_false_fail:.2%} + "
                   f"{b.smoke_hosts} smoke-gated host(s) x {b.smoke_gate_false_fail:.2%} = at most {b.total:.2%} "
                   "of correct builds refused")
        out.append("  on any failure: roll back what changed, newest first, each host drained before its restart")
        for u in self.unverified:
            out.append(f"  NOT VERIFIED: {u}")
        return "\n".join(out)


def _batches(hosts: list[str], serial: int | str) -> list[tuple[str, ...]]:
    if not hosts:
        return []
    if isinstance(serial, str) and serial.endswith("%"):
        n = max(1, int(len(hosts) * float(serial[:-1]) / 100))
    else:
        n = max(1, int(serial))
    return [tuple(hosts[i:i + n]) for i in range(0, len(hosts), n)]


def worker_url(inv: Inventory, host: str) -> str:
    """The URL the router reaches the host's server on (router_worker_url, else the host's endpoint)."""
    return str(inv.hostvars.get(host, {}).get("router_worker_url") or inv.endpoint(host))


def build(inv: Inventory, hosts: list[str], image: str, *, serial: int | str = 1, gate: str = "disabled",
          gate_alpha: float = 0.0, loadtest: bool = True, promote: bool = True,
          unverified: tuple[str, ...] = ()) -> Plan:
    """The plan for `hosts` (already resolved and fleet-checked); bad inventory settings are UsageError."""
    groups: list[GroupPlan] = []
    steps: list[Step] = [Step("preflight", "all", tuple(hosts), "preflight, pull and weights on every host "
                              "(play 1 of the deploy playbook): no server touched")]
    gated = gate != "disabled"
    for grp in ("pcie", "nvlink"):
        members = [h for h in hosts if inv.fleet_of(h) == grp]
        if not members:
            continue
        named = [h for h in members if inv.hostvars.get(h, {}).get("rollout_canary") is True]
        if len(named) > 1:
            raise UsageError(f"group {grp}: more than one host has rollout_canary: true ({', '.join(named)})")
        canary = named[0] if named else members[0]
        routers = {str(inv.hostvars.get(h, {}).get("rollout_router_url") or "") for h in members}
        if len(routers) > 1:
            raise UsageError(f"group {grp}: its hosts name different routers ({', '.join(sorted(routers))}); "
                             "set rollout_router_url per group")
        router = routers.pop() or None
        deployed = inv.routers().get(grp)  # the router role's host for this group (ansible/roles/router)
        if router is None and deployed:
            router = deployed["url"]
        router_metrics = deployed["metrics_url"] if deployed and deployed["url"] == router else None
        rest = [h for h in members if h != canary]
        gp = GroupPlan(grp, router, canary, bool(named), tuple(_batches(rest, serial)),
                       {h: worker_url(inv, h) for h in members}, router_metrics)
        groups.append(gp)
        drain = ("remove from the router, wait for its requests in flight (bounded)" if router
                 else "no router: the host keeps its traffic while it restarts")
        back = "add to the router, wait until it reports the host healthy" if router else "no router: nothing"
        for i, batch in enumerate([(canary,), *gp.batches]):
            is_canary = i == 0
            steps.append(Step("drain", grp, batch, drain))
            steps.append(Step("deploy", grp, batch, "deploy playbook on these hosts only: switch, /health, one "
                              "generation, record; a failing host puts its previous version back itself"))
            if is_canary and gated:
                steps.append(Step("gate", grp, batch, f"the full validation gate ({gate})"))
                if loadtest:
                    steps.append(Step("loadtest", grp, batch, "capacity search against the SLOs on the canary "
                                      "alone (it is out of the router: no fleet traffic mixes in)"))
            elif gated:
                steps.append(Step("smoke-gate", grp, batch, "health, one real generation, lossless_t0 on "
                                  f"{len(SMOKE_PROMPTS)} prompts at T=0 against the baseline"))
            steps.append(Step("add-back", grp, batch, back))
    if loadtest and gated:
        for gp in groups:
            steps.append(Step("fleet-loadtest", gp.group, tuple(gp.workers),
                              f"capacity search through the router {gp.router} against the SLOs" if gp.router
                              else "no router: skipped (the canary's load test stands)"))
    if promote and gated:
        steps.append(Step("promote", "all", tuple(hosts), "registry-side retag to the promoted tag, evidence "
                          "(gate and load-test reports) attached to the digest"))
    smoke_hosts = sum(len(b) for g in groups for b in g.batches) if gated else 0
    budget = Budget(gate_alpha if gated else 0.0, 0.0, len(groups) if gated else 0, smoke_hosts)
    return Plan(image, tuple(hosts), tuple(groups), tuple(steps), budget, gate, unverified)


def smoke_gate_config(gate_cfg: Any, suite_dir: Any) -> Any:
    """A reduced copy of the gate config: T=0 only, SMOKE_PROMPTS of its suite (written to suite_dir under the
    suite's own file name: a recorded baseline names its suite file, and the gate checks that name), no
    determinism / variation / depth / speed checks; the lossless baseline (when there is one) is reduced to the
    same prompts, beside it: lossless_t0 compares every prompt the baseline holds."""
    import json
    from pathlib import Path

    import yaml

    from sglfleet.validation.suite import load_suite

    suite = load_suite(gate_cfg.suite)
    suite_out = Path(suite_dir) / Path(str(gate_cfg.suite)).name
    keep = [p for p in suite.prompts if p.id in SMOKE_PROMPTS] or list(suite.prompts[:3])
    data = suite.model_dump(mode="json")
    data["prompts"] = [p.model_dump(mode="json") for p in keep]
    suite_out.parent.mkdir(parents=True, exist_ok=True)
    suite_out.write_text(yaml.safe_dump(data, sort_keys=False))
    upd: dict[str, Any] = {"suite": str(suite_out), "temperatures": [0.0]}
    kept = [p.id for p in keep]
    for name in ("determinism", "variation", "quality", "long_copy", "speed"):
        sub = getattr(gate_cfg, name, None)
        if sub is not None and hasattr(sub, "enabled"):
            off: dict[str, Any] = {"enabled": False}
            if hasattr(sub, "prompt_ids"):  # the gate checks that every named prompt is in its suite
                off["prompt_ids"] = kept[:1]
            upd[name] = sub.model_copy(update=off)
    lossless = getattr(gate_cfg, "lossless", None)
    if lossless is not None and getattr(lossless, "baseline", None):
        doc = json.loads(Path(lossless.baseline).read_text())
        for key in ("answers", "logprobs"):
            if isinstance(doc.get(key), dict):
                doc[key] = {k: v for k, v in doc[key].items() if k in kept}
        if isinstance(doc.get("samples"), list):  # T>0 samples: the smoke gate runs T=0 only
            doc["samples"] = []
        base_out = Path(suite_dir) / "baseline-smoke.json"
        base_out.write_text(json.dumps(doc))
        upd["lossless"] = lossless.model_copy(update={"baseline": str(base_out)})
    return gate_cfg.model_copy(update=upd)
