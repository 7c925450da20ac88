"""Patch 0001: sglang's set_cuda_arch() keeps a FLASHINFER_CUDA_ARCH_LIST that is already set.

Upstream 0.5.23 overwrites it unconditionally in ModelRunner.load_model() with
f"{major}.{minor}a" (12.0a on an RTX PRO 6000), while the image compiles FlashInfer with 12.0f
(FlashInfer's own SM120 default for CUDA >= 12.9) and FlashInfer keys its JIT cache directory by
the arch list. Overwriting it moves FlashInfer to an empty cache directory: the first request
compiles. The function tested is the real one, taken from the sglang sources after applying the
committed series, and executed.
"""

from __future__ import annotations

import ast
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from sglfleet.patches import DEFAULT_CACHE, apply_series, fetch_sglang, load_series, series_dir_for

pytestmark = pytest.mark.network  # downloads sglang from PyPI (cached after the first run)

REL = "sglang/srt/utils/common.py"
CI_TARGETS = os.environ.get("IMAGE_CI_TARGETS", "pcie nvlink").split()


def function_source(path: Path, name: str) -> str:
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(path.read_text(), node) or ""


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    upstream = fetch_sglang("0.5.23", DEFAULT_CACHE)
    series = load_series(series_dir_for("0.5.23"))
    root = tmp_path_factory.mktemp("site")
    for rel in {*series.touched, REL}:
        if (upstream / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(upstream / rel, root / rel)
    assert apply_series(series, root).ok
    return upstream / REL, root / REL


def run_set_cuda_arch(src: str, env_value: str | None) -> str | None:
    import torch  # real torch (CPU here): any call into torch.cuda would raise

    saved = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    try:
        if env_value is None:
            os.environ.pop("FLASHINFER_CUDA_ARCH_LIST", None)
        else:
            os.environ["FLASHINFER_CUDA_ARCH_LIST"] = env_value
        ns: dict = {"os": os, "torch": torch, "is_flashinfer_available": lambda: True}
        exec(compile(src, REL, "exec"), ns)
        ns["set_cuda_arch"]()
        return os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    finally:
        if saved is None:
            os.environ.pop("FLASHINFER_CUDA_ARCH_LIST", None)
        else:
            os.environ["FLASHINFER_CUDA_ARCH_LIST"] = saved


def test_upstream_overwrites_with_a_suffix(sources: tuple[Path, Path]) -> None:
    up = function_source(sources[0], "set_cuda_arch")
    # The pinned upstream assigns unconditionally (no check of an existing value) ...
    assert 'os.environ["FLASHINFER_CUDA_ARCH_LIST"] = (' in up and "os.environ.get" not in up
    # ... and its formula gives 12.0a for SM120, where FlashInfer itself uses 12.0f on CUDA >= 12.9.
    expr = ast.parse(textwrap.dedent(up)).body[0]
    assign = next(n for n in ast.walk(expr) if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Subscript))
    value = eval(compile(ast.Expression(assign.value), "x", "eval"), {"arch": "12.0", "capability": (12, 0)})
    assert value == "12.0a"


def test_patched_keeps_preset_arch_list_without_touching_cuda(sources: tuple[Path, Path]) -> None:
    patched = function_source(sources[1], "set_cuda_arch")
    assert run_set_cuda_arch(patched, "12.0f") == "12.0f"
    assert run_set_cuda_arch(patched, "10.3a 10.0a") == "10.3a 10.0a"


def test_patched_still_detects_when_unset(sources: tuple[Path, Path]) -> None:
    """Unset: the upstream detection path runs (here: CPU-only torch, so the device query raises)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU; covered by the gpu test")
    patched = function_source(sources[1], "set_cuda_arch")
    with pytest.raises((RuntimeError, AssertionError)):
        run_set_cuda_arch(patched, None)


@pytest.mark.docker
@pytest.mark.parametrize("target", CI_TARGETS)
def test_image_cache_is_hit_after_patched_set_cuda_arch(target: str) -> None:
    """In the CI image: run the image's (patched) set_cuda_arch, then import FlashInfer: its JIT dir
    must be the one the build filled, and the sampling module must count as compiled."""
    import docker

    client = docker.from_env()
    tag = f"sglang-fleet-ci:0.5.23-{target}-rc1"
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{tag} is missing: run `make image-ci` first")
    script = r"""
import ast, os, sysconfig, json
p = os.path.join(sysconfig.get_paths()['purelib'], 'sglang/srt/utils/common.py')
src = open(p).read()
node = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == 'set_cuda_arch')
import torch
ns = {'os': os, 'torch': torch, 'is_flashinfer_available': lambda: True}
exec(ast.get_source_segment(src, node), ns)
before = os.environ['FLASHINFER_CUDA_ARCH_LIST']
ns['set_cuda_arch']()
from flashinfer.jit import env as jit_env
from flashinfer.jit import sampling
spec = sampling.gen_sampling_module()
print(json.dumps({'before': before, 'after': os.environ['FLASHINFER_CUDA_ARCH_LIST'],
                  'jit_dir': str(jit_env.FLASHINFER_JIT_DIR), 'compiled': spec.is_compiled}))
"""
    out = client.containers.run(tag, ["python", "-c", script], remove=True, network_mode="host").decode()
    import json

    data = json.loads(out.strip().splitlines()[-1])
    assert data["before"] == data["after"]
    assert data["jit_dir"].endswith(f"/{data['before'].replace('.', '').replace(' ', '_')}/cached_ops")
    assert data["compiled"] is True


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs an NVIDIA CUDA GPU")
def test_on_a_gpu_upstream_clobbers_and_patched_keeps(sources: tuple[Path, Path]) -> None:
    """On any CUDA GPU: upstream replaces a preset list with the device's '<major>.<minor>a'."""
    import torch
    major, minor = torch.cuda.get_device_capability()
    up = function_source(sources[0], "set_cuda_arch")
    patched = function_source(sources[1], "set_cuda_arch")
    assert run_set_cuda_arch(up, "12.0f") == f"{major}.{minor}{'a' if major >= 9 else ''}"
    assert run_set_cuda_arch(patched, "12.0f") == "12.0f"
    assert run_set_cuda_arch(patched, None) == f"{major}.{minor}{'a' if major >= 9 else ''}"
