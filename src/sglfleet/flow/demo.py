"""`make demo`: the product's real path on an embedded fleet on this machine (root).

patch series checked -> CPU serving image built and pushed to a local TLS + login registry -> two SSH test
hosts (network namespaces, group pcie) serving a baseline tag -> a lossless baseline recorded from the first
-> sglang-router deployed on the controller by the router role (the inventory's sglang_router group) ->
`flow.promote.deploy` as a canary rollout (the canary drained, deployed, gated and load-tested alone, then the
second host smoke-gated, a fleet load test through the router, promotion) under a constant client load of 1
request/s through the router -> one page (runs/demo-*/index.html) with verdict, capacity, TTFT p95 and accept
length on top, linking every report, client failures per stage and the time each host was out of the router.
The router is stopped, the hosts and their containers removed at the end; the registry and dockerd keep
running.

What differs from a GPU fleet is the test bed's (testbed/testbed.py, docs/rollout.md): the embedded
engine instead of sglang, recorded nvidia-smi outputs, one shared Docker engine, the lean gate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from sglfleet import paths
from sglfleet.flow import promote
from sglfleet.flow.report import Stage, write
from sglfleet.patches import DEFAULT_VERSION, load_series, series_dir_for
from sglfleet.pipeline.errors import EXIT_FAIL, EXIT_OK, UsageError
from sglfleet.pipeline.reports import new_run_dir
from sglfleet.rollout.config import RolloutConfig

# Namespace prefix, /16, first server port and router port of the demo's fleet. DEMO_PREFIX, DEMO_NET,
# DEMO_BASE_PORT and DEMO_ROUTER_PORT move it beside another fleet (one a killed run left behind, say).
PREFIX = os.environ.get("DEMO_PREFIX", "dm")
NET = os.environ.get("DEMO_NET", "10.234")
BASE_PORT = int(os.environ.get("DEMO_BASE_PORT", "18300"))
ROUTER_PORT = int(os.environ.get("DEMO_ROUTER_PORT", "18390"))
GATE_IN_CHECKOUT = Path("testbed", "fixtures", "gate-embedded-lean.yaml")


def _say(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


def run(out: str | None = None) -> int:
    if os.geteuid() != 0:
        raise UsageError("make demo needs root (Docker engine, TLS registry, SSH test hosts); without root run: "
                         "make demo-light")
    import docker

    try:  # the test bed is part of a checkout, not of the installed product
        from testbed import cpuimage
        from testbed.testbed import (
            TEST_REGISTRY,
            registry_env,
            registry_login,
            run_script,
            testhosts_sh,
            write_inventory,
        )
    except ImportError as exc:
        raise UsageError(f"make demo runs from a checkout of this repository (testbed/ is not installed): {exc}") \
            from None
    root = paths.require_checkout("make demo")
    gate = root / GATE_IN_CHECKOUT

    run_dir = Path(out) if out else new_run_dir(root / "runs", "demo")
    run_dir.mkdir(parents=True, exist_ok=True)
    stages: list[Stage] = []
    t0 = time.monotonic()

    t = time.monotonic()
    series = load_series(series_dir_for(DEFAULT_VERSION))
    stages.append(Stage("series", True, f"sglang {DEFAULT_VERSION}: {len(series.patches)} patches, sha256 "
                        f"{series.sha256[:12]} (parsed and hashed; `make patches-check` applies it)",
                        time.monotonic() - t))
    _say(stages[-1].summary)

    t = time.monotonic()
    run_script("services.sh", "start", "docker", "registry", "tlsregistry")
    auth = registry_login()
    client = docker.from_env(timeout=600)
    client.login(registry=TEST_REGISTRY, **auth)
    image = f"{TEST_REGISTRY}/fleet-demo-cpu:{run_dir.name}"[:200]
    _say(f"building and pushing {image} ...")
    built = cpuimage.build(image, push=True, auth_config=auth)
    stages.append(Stage("image", True, f"{image} built ({built['id'][:19]}) and pushed over TLS with a login",
                        time.monotonic() - t))

    # The same build under a second tag: the baseline the fleet serves before the rollout.
    base = image.rsplit(":", 1)[0] + ":base-" + image.rsplit(":", 1)[1]
    repo, _, btag = base.rpartition(":")
    client.images.get(image).tag(repo, btag)
    for line in client.images.push(repo, tag=btag, stream=True, decode=True, auth_config=auth):
        if "error" in line:
            raise UsageError(f"push of {base} failed: {line['error']}")

    t = time.monotonic()
    hosts_dir = run_dir / "testhosts"
    inv = None
    from sglfleet.rollout import deploy as ro
    from sglfleet.rollout.inventory import load_inventory

    try:  # a start that fails half-way (one host up) is stopped too
        testhosts_sh("start", "2", str(hosts_dir), prefix=PREFIX, net=NET)
        inv = write_inventory(run_dir / "inventory", hosts_dir, base_port=BASE_PORT, startup_budget_s=180,
                              fabrics=["pcie", "pcie"],
                              router={"port": ROUTER_PORT, "prometheus_port": ROUTER_PORT + 1})
        stages.append(Stage("fleet", True, f"2 SSH test hosts {PREFIX}1, {PREFIX}2 (group pcie) in network "
                            f"namespaces; the controller is the inventory's sglang_router host",
                            time.monotonic() - t, links={"inventory": str(inv / "hosts.yml")}))
        os.environ.update(registry_env())
        t = time.monotonic()
        base_cfg = RolloutConfig(inventory=str(inv), runs_dir=str(run_dir), gate=False)
        rc, _ = promote.deploy(base_cfg, "all", base)
        if rc != 0:
            raise UsageError(f"the baseline deploy of {base} failed (exit {rc})")
        stages.append(Stage("baseline", True, f"{base} on both hosts (not gated)", time.monotonic() - t))
        t = time.monotonic()
        baseline = run_dir / "baseline.json"
        rb = subprocess.run([sys.executable, "-m", "sglfleet.validation", "record-baseline", "--target",
                             f"http://127.0.0.1:{BASE_PORT + 1}", "--config", str(gate), "--out", str(baseline)],
                            cwd=root, check=False)
        if rb.returncode != 0:
            raise UsageError(f"recording the lossless baseline from {PREFIX}1 failed (exit {rb.returncode})")
        stages.append(Stage("record-baseline", True, f"T=0 answers of {base} on {PREFIX}1: the baseline the "
                            "gates' lossless_t0 compares against", time.monotonic() - t,
                            links={"baseline": str(baseline)}))
        t = time.monotonic()
        rr = ro.router(base_cfg, load_inventory(inv), run_dir=run_dir)
        if not rr.ok:
            raise UsageError(f"the router role failed: {rr.errors}")
        info = next(iter(rr.routers.values()))
        stages.append(Stage("router", True, f"sglang-router {info.get('version')} deployed by the router role on "
                            f"the controller: {info.get('url')} in front of {', '.join(info.get('workers') or [])}",
                            time.monotonic() - t, links={"router log": str(inv.parent / "inventory-data" / "router"
                                                                            / "router.log")}, data=info))
        cfg = RolloutConfig(inventory=str(inv), runs_dir=str(run_dir), gate_config=str(gate), loadtest_max_load=2,
                            client_load_rate=1.0, drain_timeout_s=60, gate_baseline=str(baseline))
        rc, deploy_dir = promote.deploy(cfg, "all", image)
    finally:
        if inv is not None:
            try:
                ro.router(RolloutConfig(inventory=str(inv), runs_dir=str(run_dir)), load_inventory(inv),
                          state="stopped", run_dir=run_dir, quiet=True)
            except Exception as exc:  # the run's own error (if any) is the one to show
                _say(f"stopping the router failed: {exc}")
        testhosts_sh("stop", str(hosts_dir), check=False, prefix=PREFIX, net=NET)
        for c in client.containers.list(all=True, filters={"label": "org.sglang-fleet.managed=true"}):
            if c.name in (f"rollout-test-{PREFIX}1", f"rollout-test-{PREFIX}2"):
                c.remove(force=True)
    rep = json.loads((deploy_dir / "report.json").read_text())
    for s in rep["stages"]:
        stages.append(Stage(s["name"], s["ok"], s["summary"], s["seconds"], s["skipped"],
                            {k: str(Path(v)) for k, v in s["links"].items()}, s["data"]))
    stages.append(Stage("reports", True, "the deploy's own page",
                        links={"deploy page": str(deploy_dir / "index.html")}))
    verdict = rep["result"].upper()
    head = {"verdict": verdict, **rep["headline"], "series": series.sha256[:12]}
    page = write(run_dir, "Demo — embedded fleet", verdict, head, stages,
                 {"action": "demo", "image": image, "run_dir": str(run_dir), "deploy_run": str(deploy_dir),
                  "wall_s": round(time.monotonic() - t0, 1)})
    cl = next((s for s in rep["stages"] if s["name"] == "client-load"), None)
    print(f"client load through the router: {cl['summary'] if cl else 'none'}", file=sys.stderr)
    print(f"{verdict}: capacity {head['capacity (users meeting the SLOs)']} users, TTFT p95 "
          f"{head['TTFT p95 at capacity (ms)']} ms, accept length {head['accept length']}; page {page}",
          file=sys.stderr)
    return EXIT_OK if rc == 0 else EXIT_FAIL
