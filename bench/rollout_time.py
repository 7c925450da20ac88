"""Rollout wall time for N netns SSH test hosts (default 2, 4, 8): a fresh deploy of rc1 (parallel pull,
weights staging, serial restarts) and a rolling update to rc2, both through `python -m sglfleet.flow deploy`
(ansible-runner, serial 1), the gate skipped so that the number is the rollout itself.

    .venv/bin/python bench/rollout_time.py --hosts 2 4 8      # or: make bench-rollout

Needs root, dockerd + registry (scripts/services.sh), openssh-server, the CPU image (built if missing).
Uses namespaces rb1..rbN on 10.232.k.0/30 and ports 18400+k (--base-port) so it does not collide with the tests.
Results: runs/bench/rollout_time.json and a markdown table on stdout (copied into docs/rollout.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from testbed import REPO_ROOT
from testbed.testbed import TEST_REGISTRY, registry_login, run_cli, write_inventory

REPO = f"{TEST_REGISTRY}/rollout-bench-cpu"
ENV = {"TESTHOSTS_PREFIX": "rb", "TESTHOSTS_NET": "10.232"}


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, cwd=REPO_ROOT, env={**os.environ, **ENV})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--out", default="runs/bench/rollout_time.json")
    ap.add_argument("--base-port", type=int, default=18400, help="host k serves on BASE+k (must be free)")
    args = ap.parse_args()
    import docker

    from testbed import cpuimage

    sh("bash", "scripts/services.sh", "start", "docker", "registry", "tlsregistry")
    client = docker.from_env(timeout=300)
    auth = registry_login()
    client.login(registry=TEST_REGISTRY, **auth)
    try:
        client.images.get(f"{REPO}:rc1")
    except docker.errors.ImageNotFound:
        try:  # the tests' build of the same Dockerfile
            client.images.get(f"{TEST_REGISTRY}/rollout-test-cpu:rc1").tag(REPO, "rc1")
        except docker.errors.ImageNotFound:
            cpuimage.build(f"{REPO}:rc1", push=True, auth_config=auth)
    client.images.get(f"{REPO}:rc1").tag(REPO, "rc2")
    for tag in ("rc1", "rc2"):
        for line in client.images.push(REPO, tag=tag, stream=True, decode=True, auth_config=auth):
            assert "error" not in line, line
    rows = []
    for n in args.hosts:
        work = Path(tempfile.mkdtemp(prefix=f"rollout-bench-{n}-"))
        sh("bash", "scripts/testhosts.sh", "start", str(n), str(work / "hosts"))
        try:
            inv = write_inventory(work / "inventory", work / "hosts", threads=1, base_port=args.base_port,
                                  startup_budget_s=300)
            row = {"hosts": n}
            for phase, tag in (("fresh_deploy_s", "rc1"), ("rolling_update_s", "rc2"), ("noop_redeploy_s", "rc2")):
                t0 = time.monotonic()
                r = run_cli("deploy", "--hosts", "all", "--inventory", str(inv), "--image", f"{REPO}:{tag}",
                            "--no-gate")
                row[phase] = round(time.monotonic() - t0, 1)
                if r.returncode != 0:
                    raise SystemExit(f"{n} hosts, {phase}: rc={r.returncode}\n{r.stderr[-2000:]}")
            rows.append(row)
            print(json.dumps(row), flush=True)
        finally:
            sh("bash", "scripts/testhosts.sh", "stop", str(work / "hosts"))
            for c in client.containers.list(all=True, filters={"label": "org.sglang-fleet.managed=true"}):
                if c.name.startswith("rollout-test-rb"):
                    c.remove(force=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"cpus": os.cpu_count(), "machine": platform.platform(), "loadavg_at_end": os.getloadavg(),
            "serial": 1, "command": "bench/rollout_time.py --hosts " + " ".join(map(str, args.hosts))}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print("| hosts | fresh deploy (s) | rolling update rc1->rc2 (s) | no-op redeploy (s) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['hosts']} | {r['fresh_deploy_s']} | {r['rolling_update_s']} | {r['noop_redeploy_s']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
