"""deploy -> gate -> load test (SLO verdict) -> promote, or roll back every changed host.

Every stage is a function call with a typed result (flow.report.Stage); nothing is a subprocess whose
output is parsed. Order of business:

1. checks that change nothing (bad input ends here, exit 2): image reference, inventory, registry (TLS,
   auth), the tag's digest, the image's labels against the host groups (flow/fit.py), gate and
   load-test configs;
2. the deploy playbook (rollout.deploy.apply): preflight, pull, weights, rolling restart + health;
3. the validation gate on every changed endpoint (validation.gate.run_gate), stopping at the first
   failure;
4. a capacity search on one endpoint against the deployment's SLOs (loadtests.capacity.run_capacity):
   it passes when at least `min_capacity` users meet them;
5. promotion (rollout.registry.promote: registry-side retag, digest checked, evidence attached to the
   digest) only after 3 and 4 passed; otherwise, or when promotion fails, the changed hosts go back.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from sglfleet.flow import fit, plan
from sglfleet.flow.report import Stage, write
from sglfleet.pipeline.errors import EXIT_FAIL, EXIT_OK, PipelineError, UsageError
from sglfleet.pipeline.reports import Case, new_run_dir
from sglfleet.rollout import deploy as ro
from sglfleet.rollout import registry, retry
from sglfleet.rollout.config import RolloutConfig
from sglfleet.rollout.inventory import Inventory
from sglfleet.rollout.serve_args import check_serve_command


def _log(quiet: bool) -> Callable[[str], None]:
    def log(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    return log


def retry_policy(cfg: RolloutConfig, what: str) -> retry.Policy:
    attempts = cfg.registry_attempts if what == "registry" else cfg.ssh_attempts
    return retry.Policy(attempts, cfg.retry_wait_s, cfg.retry_max_wait_s)


def transport(cfg: RolloutConfig, inv: Inventory, hosts: list[str]) -> registry.Transport:
    """TLS settings: config, then the inventory (rollout_registry_tls / _ca_bundle), then the environment."""
    hv = inv.hostvars.get(hosts[0], {}) if hosts else {}
    tls = bool(hv.get("rollout_registry_tls", cfg.registry_tls))
    ca = os.environ.get(registry.CA_ENV) or cfg.registry_ca_bundle or hv.get("rollout_registry_ca_bundle") or None
    return registry.Transport(tls=tls, ca_bundle=str(ro._abs(ca)) if ca else None, timeout_s=cfg.registry_timeout_s)


# ------------------------------------------------------------------------------------------ stages
def _speculative(hostvars: dict[str, Any]) -> bool:
    return (hostvars.get("serve_engine", "sglang") == "sglang"
            and str(hostvars.get("serve_spec_algorithm") or "").upper() in ("DFLASH", "DDTREE"))


def serve_args_stage(cfg: RolloutConfig, hosts_pattern: str, image: str) -> Stage:
    """Render each target host's server command (no connection) and run the DDTree rules on it:
    a budget the block cannot hold, a backend without a tree mask, overlap scheduling left on without the
    host's opt-in (SGLANG_DDTREE_OVERLAP=1 in its rendered env, serve_spec_ddtree_overlap), ... is
    UsageError (exit 2) here, before anything changes, not an sglang startup failure after the old
    server is stopped."""
    t0 = time.monotonic()
    rendered = ro.render(cfg, hosts_pattern, image)
    found: dict[str, Any] = {}
    for host, spec in sorted(rendered.items()):
        cmd = [str(x) for x in ((spec or {}).get("command") or [])]
        r = check_serve_command(host, cmd, (spec or {}).get("env") or {})
        if r is not None:
            found[host] = {"budget": r.budget, "topk": r.topk, "verify_width": r.verify_width,
                           "overlap": "--disable-overlap-schedule" not in cmd}
    summary = (", ".join(f"{h}: DDTree budget {v['budget']} top-k {v['topk']} (verify width {v['verify_width']}"
                         f"{', overlap scheduler' if v['overlap'] else ''})"
                         for h, v in found.items()) or "no DDTree host among the targets")
    return Stage("serve-args", True, summary, seconds=time.monotonic() - t0, data=found)


def gate_stage(url: str, out: Path, gate_cfg: Any, *, quiet: bool = False, name: str = "gate") -> Stage:
    """The validation gate, in process, against `url`; reports under `out`."""
    from sglfleet.validation.gate import run_gate

    t0 = time.monotonic()
    try:
        res = run_gate(url, gate_cfg, out_dir=out, console=Console(stderr=True, quiet=quiet))
    except PipelineError as exc:
        return Stage(name, False, f"gate could not run against {url}: {exc}", time.monotonic() - t0)
    except Exception as exc:  # anything else still ends in a rollback, never in a half-changed fleet
        return Stage(name, False, f"gate crashed against {url}: {type(exc).__name__}: {exc}"[:600],
                     time.monotonic() - t0)
    s = res.summary  # validation.gate.GateSummary
    failed = ", ".join(s.failed_checks) or "none"
    return Stage(name, res.passed, f"{s.verdict} on {url}: {s.checks} checks, failed: {failed}",
                 time.monotonic() - t0, links={"gate report": str(out / "report.html")},
                 data={"endpoint": url, "verdict": s.verdict, "failed_checks": list(s.failed_checks),
                       "median_ttft_s": s.median_ttft_s, "median_tokens_per_s": s.median_tokens_per_s,
                       "accept_length": s.accept_length, "report_dir": str(out)})


def loadtest_config(cfg: RolloutConfig, url: str) -> Any:
    """The deployment's load-test config (its SLOs) for `url`; bad input raises before anything changes."""
    from sglfleet.loadtests.capacity import QUICK
    from sglfleet.loadtests.config import load_loadtest_config

    over: dict[str, Any] = {"host": url}
    if cfg.api_key_env or cfg.api_key_file:  # the flow's key wins over the load-test file's
        over.update({"api_key_env": cfg.api_key_env, "api_key_file": cfg.api_key_file})
    if cfg.loadtest_quick:
        over.update({k: v for k, v in QUICK.items() if k != "capacity"})
        over["capacity"] = dict(QUICK["capacity"])
    if cfg.loadtest_max_load:
        over.setdefault("capacity", {})["max_load"] = cfg.loadtest_max_load
    path = str(ro._abs(cfg.loadtest_config)) if cfg.loadtest_config else None
    if path and not Path(path).is_file():
        raise UsageError(f"load-test config not found: {cfg.loadtest_config}")
    from sglfleet.loadtests.config import with_api_key

    return with_api_key(load_loadtest_config(path, over))


def with_flow_api_key(cfg: RolloutConfig, gate_cfg: Any) -> Any:
    """The gate config with the flow's API key source (names only; the key is resolved by the gate)."""
    if not (cfg.api_key_env or cfg.api_key_file):
        return gate_cfg
    return gate_cfg.model_copy(update={"api_key_env": cfg.api_key_env, "api_key_file": cfg.api_key_file})


def loadtest_stage(lt_cfg: Any, out: Path, min_capacity: float, *, quiet: bool = False) -> Stage:
    """Capacity search against the deployment's SLOs; passes when >= min_capacity users meet them."""
    from sglfleet.loadtests.capacity import run_capacity

    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    try:
        res = run_capacity(lt_cfg, out, log=_log(quiet))
    except Exception as exc:  # PipelineError (bad target, incomplete run) or anything else: the stage fails
        why = str(exc) if isinstance(exc, PipelineError) else f"{type(exc).__name__}: {exc}"
        return Stage("loadtest", False, f"load test could not complete: {why}"[:600], time.monotonic() - t0,
                     links={"load-test report": str(out / "capacity.html")})
    cap = res.get("capacity")
    slo = res.get("slo") or {}
    best = next((s for s in res.get("steps", []) if s["load"] == cap), None)
    ttft95 = ((best or {}).get("summary", {}).get("ttft_ms") or {}).get("p95")
    ok = cap is not None and cap >= min_capacity
    slo_txt = (f"TTFT p95 <= {slo.get('ttft_p95_ms')} ms, ITL p95 <= {slo.get('itl_p95_ms')} ms, "
               f"errors <= {slo.get('max_error_rate')}")
    summary = (f"capacity {cap if cap is not None else 'none'} users meeting {slo_txt}; "
               f"{'meets' if ok else 'misses'} the required {min_capacity:g}")
    return Stage("loadtest", ok, summary, time.monotonic() - t0,
                 links={"load-test report": str(out / "capacity.html")},
                 data={"capacity": cap, "required": min_capacity, "slo": slo, "ttft_p95_ms_at_capacity": ttft95,
                       "goodput_at_capacity": res.get("goodput_at_capacity"), "report_dir": str(out)})


# ------------------------------------------------------------------------------------------ the flow
def deploy(cfg: RolloutConfig, hosts_pattern: str, image: str, *, check: bool = False,
           image_tarball: str | None = None, extra_vars: dict[str, Any] | None = None,
           quiet: bool = False) -> tuple[int, Path]:
    """The whole flow; returns (exit code, run dir). PipelineError before step 2 means nothing changed."""
    log = _log(quiet)
    t0 = time.monotonic()
    # ---- 1. nothing below changes anything until ro.apply
    ref = registry.parse_image(image)
    inv, hosts = ro.prepare(cfg, hosts_pattern)
    if image_tarball and not Path(image_tarball).is_file():
        raise UsageError(f"image tarball not found: {image_tarball}")
    gate_cfg = None
    if cfg.gate and not check:
        from sglfleet.validation.config import load_gate_config

        gpath = ro._abs(cfg.gate_config) if cfg.gate_config else None
        if gpath and not gpath.is_file():
            raise UsageError(f"gate config not found: {cfg.gate_config}")
        overrides = None
        if cfg.gate_baseline:
            bpath = ro._abs(cfg.gate_baseline)
            if not bpath.is_file():
                raise UsageError(f"baseline not found: {cfg.gate_baseline} (record it: make record-baseline)")
            overrides = {"lossless": {"baseline": str(bpath)}}
        gate_cfg = with_flow_api_key(cfg, load_gate_config(gpath, overrides))
        from sglfleet.validation.config import gate_api_key, lossless_requirement

        gate_api_key(gate_cfg)  # a missing key file / variable is bad input before anything changes

        # what the hosts will run: their inventory settings as the playbook's extra vars override them
        speculative = [h for h in hosts if _speculative({**inv.hostvars.get(h, {}), **(extra_vars or {})})]
        why = lossless_requirement(gate_cfg, speculative=True) if speculative else None
        if why:  # a speculative build is never promoted without the check that catches fluent corruption
            raise UsageError(f"{', '.join(speculative)} run speculative decoding; gate config: {why}")
    lt_cfg = loadtest_config(cfg, inv.endpoint(hosts[0])) if cfg.loadtest and cfg.gate and not check else None
    digest = None
    reg = None
    unverified: list[str] = []
    retries = retry.RetryLog()
    stages: list[Stage] = [serve_args_stage(cfg, hosts_pattern, str(ref))]
    if image_tarball:
        labels = fit.tarball_labels(image_tarball)
    else:
        needs_auth = cfg.registry_auth or any(bool(inv.hostvars.get(h, {}).get("rollout_registry_auth"))
                                              for h in hosts)
        reg = registry.Registry(ref.registry, registry.credentials(ref.registry, needs_auth),
                                transport(cfg, inv, hosts), retry_policy=retry_policy(cfg, "registry"),
                                retry_log=retries)
        try:
            reg.check()
            digest = reg.require(ref)
            labels = reg.labels(ref)
        except PipelineError as exc:
            reg.close()
            if not check:
                raise
            # CHECK=1 is a plan a reviewer reads offline: say what could not be verified, go on.
            reg, labels = None, None
            unverified.append(f"registry {ref.registry}: {exc} (tag, digest, image labels and the hosts' diff "
                              "not checked)")
        except BaseException:
            reg.close()
            raise
    if labels is None:
        fit_info: dict[str, Any] = {"skipped": "registry unreachable"}
    else:
        fit_info = fit.check(str(ref), labels, inv, hosts) if cfg.image_fit_check else {"skipped": True}
    stages.append(Stage("image-fit", True, f"{ref} fits {', '.join(sorted(fit_info.get('groups', {})))}"
                        if cfg.image_fit_check and labels is not None else
                        f"image fit check {'not run: registry unreachable' if labels is None else 'disabled'}",
                        skipped=not cfg.image_fit_check or labels is None, data=fit_info))
    the_plan = make_plan(cfg, inv, hosts, str(ref), gate_cfg, tuple(unverified))
    run_dir = new_run_dir(ro._abs(cfg.runs_dir), "deploy-check" if check else "deploy")
    report: dict[str, Any] = {"action": "deploy", "image": str(ref), "digest": digest, "hosts": hosts,
                              "inventory": str(inv.path), "check": check, "run_dir": str(run_dir), "fit": fit_info,
                              "registry": {"host": ref.registry, "tls": reg.t.tls if reg else None,
                                           "user": reg.creds.username if reg and reg.creds else None},
                              # every retry of a transient failure, filled as the run goes (rollout/retry.py)
                              "retries": retries.entries}
    what = digest or ("tarball" if image_tarball else "digest not verified")
    log(f"deploy {ref} ({what}) to {', '.join(hosts)} (run dir {run_dir})")
    extra_vars = dict(extra_vars or {})
    if reg is not None and reg.t.ca_bundle:  # the hosts' engines trust the same CA
        extra_vars.setdefault("rollout_registry_ca_bundle", reg.t.ca_bundle)
    if reg is not None and reg.auth_scheme and reg.creds:  # the registry asked for a login: the hosts log in too
        extra_vars.setdefault("rollout_registry_auth", True)
    report["plan"] = the_plan.to_dict()
    if check:
        print(the_plan.render(), file=sys.stderr, flush=True)
        if unverified:  # nothing more can be checked without the registry: the plan is the answer
            report["would_change"] = None
            return _finish(run_dir, report, stages, [], "check", EXIT_OK, quiet, t0)
    try:
        if not check and use_canary(cfg, the_plan):
            from sglfleet.flow import staged

            return staged.run(cfg, inv, the_plan, ref, digest, reg, run_dir, report, stages, gate_cfg,
                              image_tarball, extra_vars, quiet, t0)
        return _run(cfg, inv, hosts, ref, digest, reg, run_dir, report, stages, gate_cfg, lt_cfg, check,
                    image_tarball, extra_vars, quiet, t0)
    finally:
        if reg:
            reg.close()


def make_plan(cfg: RolloutConfig, inv: Inventory, hosts: list[str], image: str, gate_cfg: Any,
              unverified: tuple[str, ...] = ()) -> plan.Plan:
    """The plan (flow/plan.py); the full gate's false-fail share is its likelihood alpha when it samples."""
    alpha = 0.0
    gc = gate_cfg
    if gc is None and cfg.gate:
        try:
            from sglfleet.validation.config import load_gate_config

            gc = load_gate_config(ro._abs(cfg.gate_config) if cfg.gate_config else None)
        except Exception:  # the plan is printed anyway; the deploy itself loads and checks the config
            gc = None
    if gc is not None and any(t > 0 for t in gc.temperatures):
        alpha = float(gc.likelihood.alpha)
    gate = (cfg.gate_config or "the default gate config") if cfg.gate else "disabled"
    return plan.build(inv, hosts, image, serial=cfg.serial, gate=gate, gate_alpha=alpha,
                      loadtest=cfg.loadtest, unverified=unverified)


def use_canary(cfg: RolloutConfig, p: plan.Plan) -> bool:
    if not cfg.gate:
        return False  # a baseline deploy (--no-gate / --target-only): nothing to canary
    if cfg.canary is not None:
        return cfg.canary
    return any(g.router for g in p.groups)


def _run(cfg: RolloutConfig, inv: Inventory, hosts: list[str], ref: registry.ImageRef, digest: str | None,
         reg: registry.Registry | None, run_dir: Path, report: dict[str, Any], stages: list[Stage], gate_cfg: Any,
         lt_cfg: Any, check: bool, image_tarball: str | None, extra_vars: dict[str, Any] | None, quiet: bool,
         t0: float) -> tuple[int, Path]:
    log = _log(quiet)
    # ---- 2. deploy
    dep = ro.apply(cfg, inv, hosts, str(ref), run_dir, check=check, image_tarball=image_tarball,
                   extra_vars=extra_vars, credentials=reg.creds if reg else None, quiet=quiet)
    report["deploy"] = dep.summary()
    report["changed_hosts"] = dep.changed
    report["restored_hosts"] = dep.restored
    report["interrupted_hosts"] = dep.interrupted
    fails = [f"{h}: {'; '.join(r.messages)[:400]}" for h, r in dep.hosts.items() if r.failed or r.unreachable]
    stages.append(Stage("deploy", dep.ok, f"rc {dep.rc}; changed: {', '.join(dep.changed) or 'none'}"
                        + (f"; {' | '.join(fails)}" if fails else ""), dep.wall_s,
                        links={"ansible artifacts": str(run_dir / "ansible-deploy")}))
    extra = dep.cases()
    if check:
        report["would_change"] = dep.would_change
        return _finish(run_dir, report, stages, extra, "check" if dep.rc == 0 else "check-failed",
                       EXIT_OK if dep.rc == 0 else EXIT_FAIL, quiet, t0)
    ok = dep.ok
    # Same image again, nothing changed anywhere, and it is already the promoted digest: nothing to decide.
    if (ok and not dep.changed and digest is not None and reg is not None
            and reg.digest(ref.with_tag(cfg.promoted_tag)) == digest):
        report["gate_failed_hosts"] = []
        report["promotion"] = {"skipped": f"{ref} is already {cfg.promoted_tag} and no host changed"}
        stages.append(Stage("gate", True, "skipped: no host changed and the digest is already promoted",
                            skipped=True))
        log(f"no host changed and {ref} is already {cfg.promoted_tag}: gate, load test and promotion skipped")
        return _finish(run_dir, report, stages, extra, "unchanged", EXIT_OK, quiet, t0)

    # ---- 3. gate every endpoint (the first failure decides)
    report["gate"] = {}
    report["gate_failed_hosts"] = []
    if ok and cfg.gate:
        for h in hosts:
            url = inv.endpoint(h)
            log(f"gate {h} ({url}) ...")
            st = gate_stage(url, run_dir / "gate" / h, gate_cfg, quiet=quiet, name=f"gate {h}")
            stages.append(st)
            report["gate"][h] = {"endpoint": url, "rc": 0 if st.ok else EXIT_FAIL, "summary": st.summary,
                                 "report_dir": str(run_dir / "gate" / h)}
            log(f"gate {h}: {'PASS' if st.ok else 'FAIL'} {st.summary}")
            if not st.ok:
                report["gate_failed_hosts"].append(h)
                ok = False
                break
    # ---- 4. load test against the deployment's SLOs
    if ok and lt_cfg is not None:
        log(f"load test {lt_cfg.host} (capacity search against the SLOs) ...")
        st = loadtest_stage(lt_cfg, run_dir / "loadtest", cfg.min_capacity, quiet=quiet)
        stages.append(st)
        report["loadtest"] = {"ok": st.ok, "summary": st.summary, **st.data}
        log(f"load test: {'PASS' if st.ok else 'FAIL'} {st.summary}")
        ok = st.ok
    # ---- 5. promote, or roll back
    if ok:
        if image_tarball or reg is None or digest is None:
            report["promotion"] = {"skipped": "air-gapped tarball: no registry to promote in"}
            stages.append(Stage("promote", True, report["promotion"]["skipped"], skipped=True))
            return _finish(run_dir, report, stages, extra, "deployed", EXIT_OK, quiet, t0)
        if not cfg.gate:
            report["promotion"] = {"skipped": "gate disabled (--no-gate): not promoting"}
            stages.append(Stage("promote", True, report["promotion"]["skipped"], skipped=True))
            return _finish(run_dir, report, stages, extra, "deployed", EXIT_OK, quiet, t0)
        tp = time.monotonic()
        try:
            ann = _annotations(report, stages)
            dirs = {"gate": run_dir / "gate"}
            if (run_dir / "loadtest").is_dir():
                dirs["loadtest"] = run_dir / "loadtest"
            report["promotion"] = registry.promote(reg, ref, cfg.promoted_tag, digest, dirs, ann)
            stages.append(Stage("promote", True, f"{report['promotion']['promoted']} = {digest}; evidence "
                                f"{report['promotion']['evidence_digest'][:19]}", time.monotonic() - tp,
                                data=report["promotion"]))
            log(f"promoted {ref} as {cfg.promoted_tag} ({digest}), evidence {report['promotion']['evidence_tag']}")
            return _finish(run_dir, report, stages, extra, "promoted", EXIT_OK, quiet, t0)
        except PipelineError as exc:
            report["promotion"] = {"error": str(exc)}
            stages.append(Stage("promote", False, f"promotion failed: {exc}", time.monotonic() - tp))
            report["promotion_failed"] = True
    # Every host that runs the new version goes back to its previous one; interrupted ones to their recorded one.
    report["rolled_back_hosts"], report["recovered_hosts"] = [], []
    if cfg.auto_rollback and dep.updated:
        log(f"rolling back {', '.join(dep.updated)}")
        rb = ro.roll_back(cfg, inv, dep.updated, run_dir, quiet=quiet)
        report["rollback"] = {"rc": rb.rc, "wall_s": round(rb.wall_s, 2)}
        report["rolled_back_hosts"] = [h for h, r in rb.hosts.items() if r.outcome == "updated"]
        extra += [Case(h, "rollback", r.outcome == "updated", r.outcome) for h, r in rb.hosts.items()]
        stages.append(Stage("rollback", rb.rc == 0, f"rolled back: {', '.join(report['rolled_back_hosts']) or 'none'}",
                            rb.wall_s, links={"ansible artifacts": str(run_dir / "ansible-rollback")}))
    if cfg.auto_rollback and dep.interrupted:
        log(f"restoring the recorded version on {', '.join(dep.interrupted)}")
        rs = ro.roll_back(cfg, inv, dep.interrupted, run_dir, to="current", quiet=quiet)
        report["recovered_hosts"] = [h for h, r in rs.hosts.items() if r.outcome in ("updated", "unchanged")
                                     and not r.failed]
        extra += [Case(h, "restore", h in report["recovered_hosts"], r.outcome) for h, r in rs.hosts.items()]
        stages.append(Stage("restore", rs.rc == 0, f"restored: {', '.join(report['recovered_hosts']) or 'none'}",
                            rs.wall_s))
    if report["gate_failed_hosts"]:
        result = "gate-failed"
    elif "loadtest" in report and not report["loadtest"]["ok"]:
        result = "loadtest-failed"
    elif report.get("promotion_failed"):
        result = "promotion-failed"
    else:
        result = "deploy-failed"
    return _finish(run_dir, report, stages, extra, result, EXIT_FAIL, quiet, t0)


def _annotations(report: dict[str, Any], stages: list[Stage]) -> dict[str, str]:
    gates = [s for s in stages if s.name.startswith("gate ")]
    lt = next((s for s in stages if s.name == "loadtest"), None)
    ann = {"org.sglang-fleet.gate.verdict": "PASS" if gates and all(s.ok for s in gates) else "none",
           "org.sglang-fleet.gate.endpoints": str(len(gates)),
           "org.sglang-fleet.deploy.hosts": ",".join(report.get("changed_hosts") or report["hosts"]),
           "org.sglang-fleet.run": Path(report["run_dir"]).name}
    if lt:
        ann["org.sglang-fleet.loadtest.capacity_users"] = str(lt.data.get("capacity"))
        ann["org.sglang-fleet.loadtest.ttft_p95_ms"] = str(lt.data.get("ttft_p95_ms_at_capacity"))
    return ann


def headline(report: dict[str, Any], stages: list[Stage]) -> dict[str, Any]:
    lt = next((s for s in stages if s.name == "loadtest"), None) or next(  # the canary rollout: the last one
        (s for s in reversed(stages) if s.name.split(" ")[0] in ("loadtest", "fleet-loadtest")
         and s.data.get("capacity") is not None), None)
    gates = [s for s in stages if s.name.startswith("gate")]
    acc = next((s.data.get("accept_length") for s in gates if s.data.get("accept_length") is not None), None)
    ttft = lt.data.get("ttft_p95_ms_at_capacity") if lt else None
    return {"image": report.get("image"), "digest": report.get("digest"),
            "capacity (users meeting the SLOs)": lt.data.get("capacity") if lt else None,
            "TTFT p95 at capacity (ms)": round(ttft, 1) if isinstance(ttft, int | float) else None,
            "accept length": acc if acc is not None else "n/a (the server reports no speculative decoding)",
            "changed hosts": ", ".join(report.get("changed_hosts") or []) or "none",
            "promoted": (report.get("promotion") or {}).get("promoted")}


def _finish(run_dir: Path, report: dict[str, Any], stages: list[Stage], extra: list[Case], result: str, rc: int,
            quiet: bool, t0: float) -> tuple[int, Path]:
    report["result"] = result
    report["wall_s"] = round(time.monotonic() - t0, 2)
    report["exit_code"] = rc
    if report.get("retries"):  # transient failures retried on the way (rollout/retry.py): on the page too
        by: dict[str, int] = {}
        for r in report["retries"]:
            by[r["what"]] = by.get(r["what"], 0) + 1
        last = report["retries"][-1]
        stages.append(Stage("retries", True, f"{len(report['retries'])} retried transient failure(s) "
                            f"({', '.join(f'{k} {v}' for k, v in sorted(by.items()))}); last: {last['call']} "
                            f"attempt {last['attempt']}: {last['reason']}", data={"retries": report["retries"]}))
    write(run_dir, f"Deploy {report['image']}", result.upper(), headline(report, stages), stages, report, extra)
    if not quiet:
        # plain print: a console would wrap the path
        print(f"deploy: {result} - changed hosts: {', '.join(report.get('changed_hosts', [])) or 'none'}"
              + (f"; rolled back: {', '.join(report['rolled_back_hosts'])}" if report.get("rolled_back_hosts") else "")
              + f"; page {run_dir / 'index.html'} (report {run_dir / 'report.json'})", file=sys.stderr)
    return rc, run_dir
