"""Inventory checks done on the controller before anything changes: parse, resolve HOST, fleet groups."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglfleet import paths
from sglfleet.pipeline.errors import UsageError
from sglfleet.rollout import ANSIBLE_DIR
from sglfleet.rollout.collections import COLLECTIONS_DIR

FLEETS = ("pcie", "nvlink")
# The hosts that run sglang-router (ansible/roles/router): not fleet hosts; `all` does not name them.
ROUTER_GROUP = "sglang_router"


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_CONFIG"] = str(ANSIBLE_DIR / "ansible.cfg")
    # the collections `make setup` / `sglfleet collections install` put in the work root's .cache (a checkout's
    # root, or the directory an installed controller runs in), unless the caller names others
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", str(COLLECTIONS_DIR))
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    env.setdefault("ANSIBLE_LOCAL_TEMP", "/tmp/.ansible-local")
    return env


@dataclass
class Inventory:
    path: Path
    groups: dict[str, set[str]]
    hostvars: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def hosts(self) -> set[str]:
        return set(self.hostvars) | set().union(*self.groups.values()) if self.groups else set(self.hostvars)

    def fleet_of(self, host: str) -> str | None:
        fl = [g for g in FLEETS if host in self.groups.get(g, set())]
        return fl[0] if len(fl) == 1 else None

    def resolve(self, pattern: str) -> list[str]:
        """HOST may be a host, a group, `all`, or a comma/colon separated union of those."""
        if not pattern or not pattern.strip():
            raise UsageError("HOST is empty: give a host or group (pcie, nvlink, all)")
        out: list[str] = []
        for tok in re.split(r"[,:]", pattern):
            tok = tok.strip()
            if not tok:
                continue
            if tok in self.groups:
                members = sorted(self.groups[tok])
                if tok != ROUTER_GROUP:  # a router host in no fleet group is not deployed to
                    members = [m for m in members if not self.router_only(m)]
            elif tok in self.hosts:
                members = [tok]
            else:
                raise UsageError(f"unknown HOST '{tok}': not a host or group in {self.path}")
            out.extend(m for m in members if m not in out)
        if not out:
            raise UsageError(f"HOST '{pattern}' matches no hosts in {self.path}")
        return out

    def check_fleet(self, hosts: list[str]) -> None:
        bad = []
        for h in hosts:
            fl = [g for g in FLEETS if h in self.groups.get(g, set())]
            if len(fl) != 1:
                bad.append(f"{h} (in {fl or 'no fleet group'})")
        if bad:
            raise UsageError("every host must be in exactly one fleet group (pcie or nvlink): " + ", ".join(bad))

    def router_only(self, host: str) -> bool:
        return host in self.groups.get(ROUTER_GROUP, set()) and self.fleet_of(host) is None

    def routers(self) -> dict[str, dict[str, str]]:
        """fleet group -> the router in front of it (ansible/roles/router): host, url, metrics_url."""
        out: dict[str, dict[str, str]] = {}
        for h in sorted(self.groups.get(ROUTER_GROUP, set())):
            hv = self.hostvars.get(h, {})
            grp = str(hv.get("router_fleet_group") or "pcie")
            addr = hv.get("router_advertise_host") or hv.get("ansible_host") or h
            if grp in out:
                raise UsageError(f"fleet group {grp} has two routers ({out[grp]['host']}, {h}): one per group")
            out[grp] = {"host": h, "url": str(hv.get("router_url") or f"http://{addr}:{hv.get('router_port', 30080)}"),
                        "metrics_url": str(hv.get("router_metrics_url")
                                           or f"http://{addr}:{hv.get('router_prometheus_port', 29000)}/metrics")}
        return out

    def endpoint(self, host: str) -> str:
        hv = self.hostvars.get(host, {})
        addr = hv.get("serve_endpoint_host") or hv.get("ansible_host") or host
        port = hv.get("serve_port", 30000)
        return f"http://{addr}:{port}"


def load_inventory(path: str | Path) -> Inventory:
    """The inventory at `path` (a relative path may name the package's own, ansible/inventories/example)."""
    p = paths.resolve(path)
    if not p.exists():
        raise UsageError(f"inventory not found: {p}")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(p), "--list"],
        capture_output=True, text=True, env=ansible_env(), timeout=120,
    )
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip() and "WARNING" not in ln]
        why = next((ln for ln in lines if "ERROR" in ln or "rror" in ln), lines[0] if lines else "unknown error")
        raise UsageError(f"malformed inventory {p}: {why[:300]}")
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise UsageError(f"malformed inventory {p}: ansible-inventory output is not JSON") from None
    hostvars = data.get("_meta", {}).get("hostvars", {})
    groups: dict[str, set[str]] = {}

    def members(g: str, seen: set[str]) -> set[str]:
        if g in seen:
            return set()
        seen.add(g)
        node = data.get(g, {})
        hs = set(node.get("hosts", []))
        for child in node.get("children", []):
            hs |= members(child, seen)
        return hs

    for g in data:
        if g != "_meta":
            groups[g] = members(g, set())
    for h in hostvars:
        groups.setdefault("all", set()).add(h)
    return Inventory(path=p, groups=groups, hostvars=hostvars)
