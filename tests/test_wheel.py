"""The product as an installed wheel, as an operator's controller gets it: build the wheel, install it into a fresh
virtual environment (its dependencies from the package index, no extras: no torch), then from a directory outside
the checkout plan a deploy in check mode against the example inventory the wheel carries (`make deploy CHECK=1`),
render the hosts' server commands, and print the gate's help. Every file these need (ansible/, the patch series,
the profiles) has to come from the wheel: a missing one fails the plan or the render."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.network, pytest.mark.slow]  # the wheel's dependencies come from the package index

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_HOSTS = ("pcie-01", "pcie-02", "b300-01", "b300-02")
LAB_ONLY = ("torch", "triton", "transformers", "accelerate", "safetensors")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_the_installed_wheel_plans_a_deploy_outside_the_checkout(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "ANSIBLE_COLLECTIONS_PATH",
                                                             "ANSIBLE_CONFIG")}
    # built from a copy of the files git knows (tracked and new, not ignored), as a fresh clone would: no egg-info
    # or build/ left in the checkout can fill in package data the pyproject forgot
    src = tmp_path / "src"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    r = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", src], tmp_path, env,
             600)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("sglfleet/ansible/playbooks/deploy.yml", "sglfleet/ansible/inventories/example/hosts.yml",
                 "sglfleet/patches/sglang-0.5.23/series", "sglfleet/images/Dockerfile",
                 "sglfleet/validation/profiles/embedded.yaml"):
        assert data in names, f"{data} is not in {wheel.name}"
    assert not [n for n in names if n.split("/")[0] in ("testbed", "bench", "tests")]

    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", venv], tmp_path, env, 300)
    assert r.returncode == 0, r.stderr[-3000:]
    py, cli = venv / "bin" / "python", venv / "bin" / "sglfleet"
    r = _run([py, "-m", "pip", "install", "-q", wheel], tmp_path, env, 1800)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run([py, "-c", f"import importlib.util as u; print([m for m in {LAB_ONLY!r} if u.find_spec(m)])"],
             tmp_path, env, 120)
    assert r.stdout.strip() == "[]", f"the controller install pulled in lab-only packages: {r.stdout}{r.stderr}"

    work = tmp_path / "work"  # outside the checkout: runs/ and .cache/ go here
    work.mkdir()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    r = _run([cli, "collections", "install"], work, env, 900)  # the playbooks' collections, into work/.cache
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    # make deploy CHECK=1 with the default inventory (the example, package data); the registry is down: the plan
    # is printed with what could not be verified, nothing changes, exit 0
    r = _run([cli, "deploy", "--hosts", "all", "--image", "127.0.0.1:9/sglang-fleet:rc7", "--check"], work, env, 600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "plan: 127.0.0.1:9/sglang-fleet:rc7 to 4 host(s)" in r.stderr, r.stderr[-3000:]
    assert all(h in r.stderr for h in EXAMPLE_HOSTS), r.stderr[-3000:]
    assert list((work / "runs" / "rollout").glob("deploy-check-*/report.json")), "the run dir is not in the work dir"
    # make render: the server command each host would run, rendered by the packaged playbook (no connection)
    r = _run([cli, "render", "--hosts", "pcie"], work, env, 600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    rendered = json.loads(r.stdout)
    assert sorted(rendered) == ["pcie-01", "pcie-02"] and all(s.get("command") for s in rendered.values())
    r = _run([cli, "validate", "--help"], work, env, 120)
    assert r.returncode == 0 and "--target" in r.stdout, r.stderr[-3000:]
    r = _run([cli, "validate"], work, env, 120)  # bad input: exit 2, the stage's own one error
    assert r.returncode == 2 and "--target" in r.stderr
