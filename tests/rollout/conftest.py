"""Real rollout fixtures: dockerd + registry (scripts/services.sh), the CPU serving image (built once per
session), netns SSH test hosts (scripts/testhosts.sh). No GPU here: the GPU facts fed to preflight are
RECORDED nvidia-smi outputs (testbed/fixtures/nvidia-smi/, CSV of the same query preflight runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed import REPO_ROOT
from testbed.testbed import TEST_HOSTS as HOSTS
from testbed.testbed import TEST_REPO as REPO
from testbed.testbed import registry_login, testhosts_sh

N_HOSTS = len(HOSTS)


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, dockerd)"
    if not Path("/usr/sbin/sshd").exists():
        return "needs openssh-server (.ci/stages/rollout.sh installs it)"
    from sglfleet.rollout import collections

    if collections.missing():
        return f"needs the Ansible collections ({', '.join(collections.missing())}): make setup installs them"
    return None


@pytest.fixture(scope="session")
def services():
    why = _skip_reason()
    if why:
        pytest.skip(why)
    subprocess.run(["bash", "scripts/services.sh", "start", "docker", "registry", "tlsregistry"], check=True,
                   cwd=REPO_ROOT)
    import docker

    return docker.from_env(timeout=300)


# A serving image that exits at once with an error on stderr (restart policy: it crash-loops).
CRASH_DOCKERFILE = """FROM local/bookworm-py:latest
LABEL org.fleet.engine="embedded" org.fleet.target="pcie,nvlink"
ENTRYPOINT ["python3", "-c", "import sys; print('loading weights'); sys.exit('fatal: simulated CUDA init failure')"]
"""


def _push(client, ref: str, auth: dict) -> None:
    repo, _, tag = ref.rpartition(":")
    for line in client.images.push(repo, tag=tag, stream=True, decode=True, auth_config=auth):
        assert "error" not in line, line


@pytest.fixture(scope="session")
def images(services):
    """On the TLS + login registry: rc1 and rc2 (same build, two tags), `crash` (exits at once, crash-loops),
    `nvlink-only` (the CPU image labelled for the nvlink fleet only: refused on pcie hosts)."""
    import io

    from testbed import cpuimage

    auth = registry_login()
    services.login(registry=REPO.split("/")[0], **auth)
    cpuimage.build(f"{REPO}:rc1", push=True, auth_config=auth)
    img = services.images.get(f"{REPO}:rc1")
    img.tag(REPO, "rc2")
    _push(services, f"{REPO}:rc2", auth)
    cpuimage.build(f"{REPO}:nvlink-only", push=True, targets="nvlink", auth_config=auth)
    services.images.build(fileobj=io.BytesIO(CRASH_DOCKERFILE.encode()), tag=f"{REPO}:crash", network_mode="host",
                          rm=True, pull=False)
    _push(services, f"{REPO}:crash", auth)
    return {"rc1": f"{REPO}:rc1", "rc2": f"{REPO}:rc2", "crash": f"{REPO}:crash",
            "nvlink-only": f"{REPO}:nvlink-only"}


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
    from sglfleet.pipeline.embedded import default_model_path
    from testbed.cpuimage import scramble_gguf

    p = tmp_path_factory.mktemp("badmodel") / "model.gguf"
    scramble_gguf(default_model_path(), p)
    return p


@pytest.fixture()
def clean_runs(tmp_path):
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)
