"""Inventory for the netns SSH test hosts of scripts/testhosts.sh, serving the CPU image.

The fabric group_vars (pcie.yml, nvlink.yml) are copied verbatim from the example inventory; what
differs from production is in group_vars/all.yml and host_vars here, and is written down in
docs/rollout.md: one shared Docker engine (own container name, port and state file per host), the
embedded engine instead of sglang, RECORDED nvidia-smi outputs (no GPU on this machine), no NVIDIA
container runtime, a small disk floor and startup budget.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from sglfleet.paths import ANSIBLE_DIR
from sglfleet.pipeline.embedded import default_model_path
from sglfleet.pipeline.errors import PipelineError
from testbed import REPO_ROOT

FIXTURES = REPO_ROOT / "testbed" / "fixtures"
SMI = {"pcie": FIXTURES / "nvidia-smi" / "rtx-pro-6000-x8.csv", "nvlink": FIXTURES / "nvidia-smi" / "b300-x8.csv",
       "wrong": FIXTURES / "nvidia-smi" / "h100-x8.csv"}
BASE_PORT = 18100


def read_hosts(testhosts_dir: Path) -> list[tuple[str, str, str]]:
    rows = []
    for line in (testhosts_dir / "hosts.tsv").read_text().splitlines():
        if line.strip():
            name, addr, gw = line.split("\t")
            rows.append((name, addr, gw))
    return rows


def write_inventory(out: Path, testhosts_dir: Path, *, fabrics: list[str] | None = None,
                    gpu_override: dict[str, str] | None = None, startup_budget_s: int = 90,
                    threads: int = 1, extra_all: dict | None = None, base_port: int = BASE_PORT,
                    data_dir: Path | None = None, router: dict | None = None) -> Path:
    """out/hosts.yml + group_vars + host_vars. fabrics[i] is the group of host i (default alternating
    pcie/nvlink); gpu_override maps a host to a key of SMI (e.g. 'wrong') or None to leave it in no fleet.
    threads: llama.cpp threads per server. 1 by default: several servers share a small CI machine, and
    llama.cpp's thread barrier stalls when its threads outnumber the free cores (seen here: a 2-thread
    server on the 2-core machine at load ~10 took 193 s for two concurrent 48-token answers)."""
    hosts = read_hosts(testhosts_dir)
    fabrics = fabrics or ["pcie" if i % 2 == 0 else "nvlink" for i in range(len(hosts))]
    shutil.rmtree(out, ignore_errors=True)
    # Data (state files, weights cache) lives beside the inventory directory: Ansible parses every file
    # inside it. Inventories that describe the SAME fleet (a variant with one setting changed) must pass
    # the fleet's data_dir: on a real host the state dir and weights cache are fixed paths.
    data = data_dir or out.parent / f"{out.name}-data"
    data.mkdir(parents=True, exist_ok=True)
    (out / "group_vars").mkdir(parents=True)
    (out / "host_vars").mkdir()
    for g in ("pcie", "nvlink"):
        src = ANSIBLE_DIR / "inventories" / "example" / "group_vars" / f"{g}.yml"
        shutil.copy2(src, out / "group_vars" / f"{g}.yml")
    children: dict = {"pcie": {"hosts": {}}, "nvlink": {"hosts": {}}, "unassigned": {"hosts": {}}}
    for i, (name, addr, gw) in enumerate(hosts):
        group = fabrics[i] if fabrics[i] in ("pcie", "nvlink") else "unassigned"
        children[group]["hosts"][name] = {"ansible_host": addr}
        gpu = (gpu_override or {}).get(name, fabrics[i] if fabrics[i] in SMI else "pcie")
        hv = {
            "serve_container_name": f"rollout-test-{name}",
            "serve_port": base_port + i + 1,
            "serve_probe_host": gw,  # the host reaches the shared engine's containers through its gateway
            "serve_endpoint_host": "127.0.0.1",  # the controller (and the gate) reach them on loopback
            "preflight_nvidia_smi_recorded": str(SMI[gpu]),
        }
        (out / "host_vars" / f"{name}.yml").write_text(yaml.safe_dump(hv, sort_keys=False))
    all_vars = {
        "ansible_user": "root",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_private_key_file": str((testhosts_dir / "id_ed25519").resolve()),
        "rollout_registry": TEST_REGISTRY,
        "rollout_registry_auth": True,
        "rollout_registry_tls": True,
        "rollout_registry_ca_bundle": str(REGISTRY_CA),
        "rollout_state_dir": str((data / "state").resolve()),
        "serve_engine": "embedded",
        "serve_restart_policy": "unless-stopped",
        "serve_log_max_size": "10m",
        "serve_log_max_file": 2,
        "serve_shm_size": "64m",
        "serve_gpus": "none",
        "serve_startup_budget_s": startup_budget_s,
        "serve_cpu_threads": threads,
        "serve_cpu_parallel": 2,
        "serve_context_length": 2048,
        "model_name": "smollm2-135m-instruct",
        "weights_name": "smollm2-135m-q4_1",
        "weights_file": "model.gguf",
        "weights_source": default_model_path(),
        "weights_cache_dir": str((data / "weights-cache").resolve()),
        "weights_shared_cache": False,
        "serve_mem_fraction": 0.85,
        "serve_spec_algorithm": "DDTREE",
        "serve_spec_draft_weights": "none",
        "serve_spec_block_size": 8,
        "serve_spec_ddtree_budget": 16,
        "serve_spec_topk": 4,
        "preflight_require_container_toolkit": False,
        "preflight_min_free_gb": 1,
        "preflight_nccl_min_busbw_gbps": 0,
        **(extra_all or {}),
    }
    (out / "group_vars" / "all.yml").write_text("---\n" + yaml.safe_dump(all_vars, sort_keys=False))
    if router is not None:  # sglang-router on this machine (the controller), deployed by ansible/roles/router
        children["sglang_router"] = {"hosts": {"controller": router_vars(data, **router)}}
    if not children["unassigned"]["hosts"]:
        del children["unassigned"]
    (out / "hosts.yml").write_text("---\n" + yaml.safe_dump({"all": {"children": children}}, sort_keys=False))
    return out


def router_vars(data: Path, *, port: int, prometheus_port: int, fleet_group: str = "pcie", **extra) -> dict:
    """The controller as the router host: local connection, the project's venv (it has sglang-router), a
    pidfile-managed daemon (no init system here), state and log under the inventory's data dir."""
    return {"ansible_connection": "local", "ansible_host": "127.0.0.1", "router_bind_host": "127.0.0.1",
            "router_port": port, "router_prometheus_port": prometheus_port, "router_fleet_group": fleet_group,
            "router_install": False, "router_python": sys.executable, "router_service_manager": "process",
            "router_state_dir": str((data / "router").resolve()), **extra}


# The tests' registry: TLS (a private CA) + htpasswd logins, started by `scripts/services.sh start tlsregistry`.
TEST_REGISTRY = "127.0.0.1:5443"
TLS_DIR = Path(os.environ.get("SERVICES_STATE_DIR", "/run/fleet-services")) / "tlsregistry"
REGISTRY_CA = TLS_DIR / "ca.crt"


def registry_login() -> dict[str, str]:
    """The TLS registry's user and password (files written by scripts/services.sh, 0600)."""
    return {"username": (TLS_DIR / "user").read_text().strip(), "password": (TLS_DIR / "password").read_text().strip()}


def registry_env() -> dict[str, str]:
    login = registry_login()
    return {"ROLLOUT_REGISTRY_USER": login["username"], "ROLLOUT_REGISTRY_PASSWORD": login["password"]}
# Namespace prefix, /16 and first port of the tests' hosts (tests/rollout). Override them to run beside
# another fleet, e.g. one left by a killed run: testhosts.sh refuses a namespace another run still uses.
TEST_PREFIX = os.environ.get("ROLLOUT_TESTHOSTS_PREFIX", "rt")
TEST_NET = os.environ.get("ROLLOUT_TESTHOSTS_NET", "10.231")
TEST_BASE_PORT = int(os.environ.get("ROLLOUT_TESTHOSTS_BASE_PORT", str(BASE_PORT)))
TEST_HOSTS = [f"{TEST_PREFIX}1", f"{TEST_PREFIX}2"]


class ScriptError(PipelineError):
    """A testbed script (scripts/testhosts.sh, scripts/services.sh) failed; it printed its own error first."""


def run_script(script: str, *args: str, check: bool = True,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """bash scripts/SCRIPT ARGS from the repo root; with check, a non-zero exit is one ScriptError (exit 2)."""
    proc = subprocess.run(["bash", f"scripts/{script}", *args], cwd=REPO_ROOT, env=env, check=False)
    if check and proc.returncode != 0:
        raise ScriptError(f"scripts/{script} {' '.join(args[:1])} exited {proc.returncode} (its error is above)")
    return proc


def testhosts_sh(*args: str, check: bool = True, prefix: str = TEST_PREFIX,
                 net: str = TEST_NET) -> subprocess.CompletedProcess:
    """scripts/testhosts.sh ARGS for the hosts PREFIXk on NET.k.0/30."""
    env = {**os.environ, "TESTHOSTS_PREFIX": prefix, "TESTHOSTS_NET": net}
    return run_script("testhosts.sh", *args, check=check, env=env)

TEST_REPO = f"{TEST_REGISTRY}/rollout-test-cpu"


def run_cli(*args: str, env: dict | None = None, timeout: float = 900):
    """`python -m sglfleet.flow deploy ...` (what `make deploy` runs) or `python -m sglfleet.rollout
    status|rollback ...`, with the registry login in the environment unless `env` overrides it; output captured."""
    e = {**os.environ, **registry_env()}
    e.update(env or {})
    module = "sglfleet.flow" if args[0] in ("deploy", "main", "demo") else "sglfleet.rollout"
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          env=e, timeout=timeout)
