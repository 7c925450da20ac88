"""Real rollout fixtures: dockerd + registry (scripts/services.sh), the CPU serving image (built once per
session), netns SSH test hosts (scripts/testhosts.sh). No GPU here: the GPU facts fed to preflight are
RECORDED nvidia-smi outputs (tests/rollout/fixtures/nvidia-smi/, CSV of the same query preflight runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rollout import REPO_ROOT
from rollout.testbed import TEST_HOSTS as HOSTS
from rollout.testbed import TEST_REPO as REPO
from rollout.testbed import testhosts_sh

N_HOSTS = len(HOSTS)


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, dockerd)"
    if not Path("/usr/sbin/sshd").exists():
        return "needs openssh-server (.ci/stages/rollout.sh installs it)"
    if not (REPO_ROOT / ".cache/ansible-collections/ansible_collections/community/docker").is_dir():
        return "needs the collections in .cache/ansible-collections (.ci/stages/rollout.sh)"
    return None


@pytest.fixture(scope="session")
def services():
    why = _skip_reason()
    if why:
        pytest.skip(why)
    subprocess.run(["bash", "scripts/services.sh", "start", "docker", "registry"], check=True, cwd=REPO_ROOT)
    import docker

    return docker.from_env(timeout=300)


@pytest.fixture(scope="session")
def images(services):
    """rc1 and rc2 (same build, two tags), `bad` (the base image: no engine inside, never healthy)."""
    from rollout import cpuimage

    cpuimage.build(f"{REPO}:rc1", push=True)
    img = services.images.get(f"{REPO}:rc1")
    img.tag(REPO, "rc2")
    for line in services.images.push(REPO, tag="rc2", stream=True, decode=True):
        assert "error" not in line, line
    services.images.get(cpuimage.BASE_IMAGE).tag(REPO, "bad")
    for line in services.images.push(REPO, tag="bad", stream=True, decode=True):
        assert "error" not in line, line
    return {"rc1": f"{REPO}:rc1", "rc2": f"{REPO}:rc2", "bad": f"{REPO}:bad"}


@pytest.fixture(scope="session")
def testhosts(services, tmp_path_factory):
    d = tmp_path_factory.mktemp("testhosts")
    testhosts_sh("start", str(N_HOSTS), str(d))
    yield d
    testhosts_sh("stop", str(d), check=False)
    ours = {f"rollout-test-{h}" for h in HOSTS}
    for c in services.containers.list(all=True, filters={"label": "org.sglang-fleet.managed=true"}):
        if c.name in ours:
            c.remove(force=True)


@pytest.fixture(scope="session")
def scrambled_model(tmp_path_factory):
    from pipeline.embedded import default_model_path
    from rollout.cpuimage import scramble_gguf

    p = tmp_path_factory.mktemp("badmodel") / "model.gguf"
    scramble_gguf(default_model_path(), p)
    return p


@pytest.fixture()
def clean_runs(tmp_path):
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)
