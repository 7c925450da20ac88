"""The CI images (built by `make image-ci` through the real Docker engine) and the build/push paths.

Needs a running engine and the loopback registry (scripts/services.sh start docker registry) and
the images sglang-fleet-ci:0.5.23-{pcie,nvlink}-rc1 from `make image-ci` (.ci/stages/images.sh).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import docker
import pytest

from sglfleet.images.build import BuildError, build, connect, next_rc, push_image
from sglfleet.images.config import load_image_config
from sglfleet.patches import DEFAULT_CACHE, apply_series, fetch_sglang, load_series, series_dir_for
from sglfleet.pipeline.procs import free_port as _free_port

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
CI_NAME = "sglang-fleet-ci"
REGISTRY = "127.0.0.1:5000"
EXPECT_ARCH = {"pcie": "12.0f", "nvlink": "10.3a"}
EXPECT_SM = {"pcie": "120f", "nvlink": "103a"}
# The targets `make image-ci` built (mk/images.mk exports the same variable; default both).
CI_TARGETS = os.environ.get("IMAGE_CI_TARGETS", "pcie nvlink").split()


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    return connect()


def ci_image(client: docker.DockerClient, target: str):
    tag = f"{CI_NAME}:0.5.23-{target}-rc1"
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{tag} is missing: run `make image-ci` (the CI images stage) first")


def run_in(client: docker.DockerClient, image, script: str) -> str:
    out = client.containers.run(image, ["bash", "-c", script], remove=True, network_mode="host")
    return out.decode()


@pytest.mark.parametrize("target", CI_TARGETS)
def test_ci_image_provenance_labels(client: docker.DockerClient, target: str) -> None:
    labels = ci_image(client, target).labels
    series = load_series(series_dir_for("0.5.23"))
    assert labels["org.sglang.version"] == "0.5.23"
    assert labels["org.fleet.target"] == target
    assert labels["org.fleet.cuda.arch"] == EXPECT_ARCH[target]
    assert labels["org.fleet.cuda.version"] == "13.0"
    assert labels["org.fleet.patch-series.sha256"] == series.sha256
    assert len(labels["org.opencontainers.image.revision"].split("-")[0]) == 40
    assert labels["org.opencontainers.image.created"].endswith("Z")


@pytest.mark.parametrize("target", CI_TARGETS)
def test_ci_image_contents(client: docker.DockerClient, target: str) -> None:
    img = ci_image(client, target)
    out = run_in(client, img, r"""
set -e
cat /opt/provenance/flashinfer-jit.json > /tmp/jit.json
python - <<'PY'
import json, os, subprocess, pathlib, sys
from importlib.metadata import entry_points
import sglang_ddtree.config as ddtree_cfg
jit = json.load(open('/tmp/jit.json'))
sampling = jit['modules'][0]
bdir = pathlib.Path(sampling['library']).parent
ninja_n = subprocess.run(['ninja', '-n', '-C', str(bdir)], capture_output=True, text=True).stdout
prefill = jit['modules'][1]
pdir = pathlib.Path(prefill.get('object') or prefill['library']).parent
print(json.dumps({
  'freeze': open('/opt/provenance/pip-freeze.txt').read().splitlines(),
  'patches': json.load(open('/opt/provenance/patches.json')),
  'jit': jit,
  'sampling_so': os.path.isfile(sampling['library']),
  'sampling_ninja_noop': 'no work to do' in ninja_n,
  'prefill_artifact': os.path.isfile(prefill.get('object') or prefill['library']),
  'prefill_ninja': (pdir / 'build.ninja').read_text() if (pdir / 'build.ninja').is_file() else '',
  'sampling_ninja': (bdir / 'build.ninja').read_text(),
  'nvcc': subprocess.run(['nvcc', '--version'], capture_output=True, text=True).stdout,
  'curand': all(os.path.isfile('/usr/local/cuda/include/' + h) for h in ('curand.h', 'curand_kernel.h')),
  'env': {k: os.environ.get(k) for k in
          ('FLASHINFER_CUDA_ARCH_LIST', 'CUDA_HOME', 'TRITON_PTXAS_PATH', 'FLASHINFER_WORKSPACE_BASE')},
  'ptxas': os.access(os.environ['TRITON_PTXAS_PATH'], os.X_OK),
  'plugin': sorted(f"{p.name}={p.value}" for p in entry_points(group='sglang.srt.plugins')),
  'plugin_cfg': ddtree_cfg.resolve(budget=16, topk=4, block_size=8, algorithm='DFLASH', draft_model_path='/d',
                                   attention_backend='triton', disable_overlap_schedule=True).verify_width,
}))
PY
""")
    data = json.loads(out.strip().splitlines()[-1])
    assert "sglang==0.5.23" in data["freeze"]
    assert "flashinfer-python==0.7.2" in data["freeze"]
    assert data["patches"]["series_sha256"] == load_series(series_dir_for("0.5.23")).sha256
    assert data["jit"]["targets"] == [EXPECT_SM[target]]
    sm = EXPECT_SM[target]
    gencode = f"-gencode=arch=compute_{sm},code=sm_{sm}"
    # sampling (curand user): full module, linked, and the cache is complete (first use compiles nothing)
    assert data["sampling_so"] and data["sampling_ninja_noop"]
    assert gencode in data["sampling_ninja"]
    assert data["jit"]["modules"][0]["bytes"] > 100_000
    # tree-verify prefill: the paged custom-mask kernel (mask mode 2) for this arch
    assert data["prefill_artifact"] and gencode in data["prefill_ninja"]
    assert "paged_kernel_mask_2" in (data["jit"]["modules"][1].get("object") or "")
    assert "release 13.0" in data["nvcc"]
    assert data["curand"]
    assert data["env"]["FLASHINFER_CUDA_ARCH_LIST"] == EXPECT_ARCH[target]
    assert data["env"]["TRITON_PTXAS_PATH"] == "/usr/local/cuda/bin/ptxas" and data["ptxas"]
    # the DDTree plugin is installed and registered where sglang's plugin loader looks
    assert data["plugin"] == ["ddtree=sglang_ddtree.plugin:load"]
    assert data["plugin_cfg"] == 17


def test_series_in_image_equals_local_zero_fuzz_apply(client: docker.DockerClient, tmp_path: Path) -> None:
    """Every file the series touches is byte-identical to applying the series here to PyPI sources."""
    series = load_series(series_dir_for("0.5.23"))
    upstream = fetch_sglang("0.5.23", DEFAULT_CACHE)
    local = tmp_path / "site"
    for rel in series.touched:
        if (upstream / rel).is_file():
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(upstream / rel, local / rel)
    (local / "sglang").mkdir(parents=True, exist_ok=True)
    assert apply_series(series, local).ok
    files = " ".join(series.touched)
    out = run_in(client, ci_image(client, "pcie"),
                 f"cd \"$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')\" && "
                 f"sha256sum {files}")
    in_image = {line.split()[1]: line.split()[0] for line in out.strip().splitlines()}
    for rel in series.touched:
        assert in_image.get(rel) == hashlib.sha256((local / rel).read_bytes()).hexdigest(), rel


def test_series_that_does_not_apply_fails_build_and_tags_nothing(client: docker.DockerClient,
                                                                 tmp_path: Path) -> None:
    upstream = fetch_sglang("0.5.23", DEFAULT_CACHE)
    rel = "sglang/srt/utils/common.py"
    src = (upstream / rel).read_text()
    needle = '    if is_flashinfer_available():\n        capability = torch.cuda.get_device_capability()\n'
    assert needle in src
    bad = (f"--- a/{rel}\n+++ b/{rel}\n@@ -1,3 +1,3 @@\n-this line is not in upstream\n+x\n context\n context\n")
    d = tmp_path / "sglang-0.5.23"
    d.mkdir()
    (d / "0001-does-not-apply.patch").write_text(bad)
    (d / "series").write_text("0001-does-not-apply.patch\n")
    (d / "manifest.yaml").write_text("- file: 0001-does-not-apply.patch\n  purpose: a patch that must be rejected\n"
                                     "  upstream: none\n  test: tests/images/test_images_docker.py\n")
    name = f"sglang-fleet-badseries-{uuid.uuid4().hex[:8]}"
    cfg = load_image_config("ci", overrides={"target": "pcie", "patch_series": str(d), "wheelhouse": [],
                                             "name": name})
    lines: list[str] = []
    with pytest.raises(BuildError, match="returned a non-zero code"):
        build(cfg, rc=1, say=lines.append)
    assert any("DOES NOT APPLY" in ln for ln in lines)
    assert client.images.list(name=name) == []


def _small_image(client: docker.DockerClient):
    return client.images.get("local/bookworm-py:latest")


def test_push_to_registry_keeps_digest_and_next_rc(client: docker.DockerClient) -> None:
    repo = f"{REGISTRY}/images-test-{uuid.uuid4().hex[:8]}"
    cfg = load_image_config("ci", overrides={"target": "pcie"})
    img = _small_image(client)
    assert img.tag(repo, "0.5.23-pcie-rc1")
    try:
        pushed, digest = push_image(client, repo, "0.5.23-pcie-rc1", say=lambda _: None)
        assert pushed == [f"{repo}:0.5.23-pcie-rc1"]
        host, _, path = repo.partition("/")
        req = urllib.request.Request(f"http://{host}/v2/{path}/manifests/0.5.23-pcie-rc1", method="HEAD",
                                     headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Docker-Content-Digest"] == digest
        client.images.remove(f"{repo}:0.5.23-pcie-rc1")
        # rc numbering sees the registry, not only local tags
        assert next_rc(client, cfg, repo, pushing=True) == 2
    finally:
        for t in client.images.list(name=repo):
            for tag in t.tags:
                client.images.remove(tag)


@pytest.fixture
def readonly_registry(tmp_path: Path):
    exe = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    if not Path(exe).is_file():
        pytest.fail("docker-registry missing: scripts/services.sh start registry installs it")
    port = _free_port()
    cfg = tmp_path / "ro.yml"
    cfg.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
                   f"  maintenance:\n    readonly:\n      enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen([exe, "serve", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_push_refused_by_registry_is_an_error(client: docker.DockerClient, readonly_registry: str) -> None:
    repo = f"{readonly_registry}/images-test"
    img = _small_image(client)
    img.tag(repo, "0.5.23-pcie-rc1")
    try:
        with pytest.raises(BuildError, match=r"refused|failed"):
            push_image(client, repo, "0.5.23-pcie-rc1", say=lambda _: None)
        with urllib.request.urlopen(f"http://{readonly_registry}/v2/_catalog", timeout=5) as r:
            assert json.load(r)["repositories"] == []
    finally:
        client.images.remove(f"{repo}:0.5.23-pcie-rc1")


def test_services_script_is_idempotent() -> None:
    t = time.monotonic()
    start = subprocess.run([str(REPO / "scripts/services.sh"), "start", "docker", "registry"],
                           capture_output=True, text=True, timeout=120, check=False)
    assert start.returncode == 0, start.stderr
    assert "already answering" in start.stderr and time.monotonic() - t < 10
    status = subprocess.run([str(REPO / "scripts/services.sh"), "status"], capture_output=True, text=True,
                            check=False)
    assert status.returncode == 0 and "docker: running" in status.stdout and "registry: running" in status.stdout
    bad = subprocess.run([str(REPO / "scripts/services.sh"), "start", "nosuch"], capture_output=True, text=True,
                         check=False)
    assert bad.returncode != 0 and "unknown service 'nosuch'" in bad.stderr


def test_base_image_is_idempotent_and_usable(client: docker.DockerClient) -> None:
    again = subprocess.run([str(REPO / "scripts/base-image.sh")], capture_output=True, text=True, timeout=600,
                           check=False)
    assert again.returncode == 0, again.stderr
    assert "is up to date" in again.stderr
    img = client.images.get("local/bookworm-py:latest")
    assert img.labels.get("org.fleet.base.recipe")
    out = client.containers.run(img, ["python3", "-c", "import venv, ensurepip, ssl; print('ok')"], remove=True,
                                network_mode="host")
    assert out.decode().strip() == "ok"


def test_base_without_toolchain_fails_build_clearly(client: docker.DockerClient) -> None:
    """A base image without nvcc, with the wheel fallback switched off: the toolchain stage fails
    with one clear line and nothing is tagged."""
    name = f"sglang-fleet-notoolkit-{uuid.uuid4().hex[:8]}"
    cfg = load_image_config("ci", overrides={"target": "pcie", "cuda_from_wheels": "0", "wheelhouse": [],
                                             "name": name, "build_target": "toolchain"})
    lines: list[str] = []
    with pytest.raises(BuildError, match="returned a non-zero code"):
        build(cfg, rc=1, say=lines.append)
    errors = [ln for ln in lines if "cuda-toolkit: ERROR" in ln]
    assert len(errors) == 1 and "no nvcc at /usr/local/cuda/bin/nvcc and CUDA_FROM_WHEELS=0" in errors[0], lines[-5:]
    assert client.images.list(name=name) == []
