"""Bad input to the image tooling: one clear line, exit 2, no build started. Plus config/context rules."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sglfleet.images.build import build_args, build_context, repository
from sglfleet.images.config import TARGETS, ImageConfig, load_image_config
from sglfleet.patches import load_series, series_dir_for
from sglfleet.pipeline.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "src" / "sglfleet" / "patches" / "ddtree" / "sglang_ddtree"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglfleet.images", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=120, check=False)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["build", "--target", "h100"], None, "unknown target 'h100' (known: pcie, nvlink)"),
        (["build", "--target", "pcie", "--profile", "nosuch"], None, "unknown profile 'nosuch'"),
        (["build", "--target", "nvlink", "--arch-list", "12.0f"], None, "must include 10.3a"),
        (["build", "--target", "pcie", "--push", "not a registry"], {"DOCKER_HOST": "unix:///nonexistent.sock"},
         "no Docker engine reachable"),
        (["build", "--target", "pcie", "--profile", "ci"], {"DOCKER_HOST": "unix:///nonexistent.sock"},
         "no Docker engine reachable"),
    ],
    ids=["unknown-target", "unknown-profile", "wrong-arch", "no-engine-push", "no-engine"],
)
def test_bad_input_is_one_line_exit_2(args: list[str], env: dict[str, str] | None, message: str) -> None:
    proc = run_cli(*args, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr


def test_make_image_requires_target() -> None:
    proc = subprocess.run(["make", "--no-print-directory", "image"], capture_output=True, text=True, cwd=REPO,
                          check=False)
    assert proc.returncode == 2 and "TARGET is required" in proc.stderr


def test_credentials_never_reach_build_args() -> None:
    with pytest.raises(UsageError, match="credential"):
        load_image_config(overrides={"torch_spec": "torch @ https://user:s3cret@example.com/torch.whl"})
    with pytest.raises(UsageError, match="credential"):
        load_image_config(overrides={"wheelhouse": ["--extra-index-url=https://x:TOKEN@idx/simple"]})


def test_ci_profile_needs_torch() -> None:
    with pytest.raises(UsageError, match="needs torch_spec"):
        load_image_config("ci", overrides={"torch_spec": ""})


def test_push_must_be_registry_repo() -> None:
    cfg = ImageConfig()
    assert repository(cfg, None) == "sglang-fleet"
    assert repository(cfg, "127.0.0.1:5000/team/sglang") == "127.0.0.1:5000/team/sglang"
    with pytest.raises(UsageError):
        repository(cfg, "UPPER/Case")


def test_targets_and_build_args() -> None:
    assert TARGETS["pcie"].arch_list == "12.0f"
    assert TARGETS["nvlink"].arch_list.split() == ["10.3a", "10.0a"]
    cfg = load_image_config("production", overrides={"target": "nvlink"})
    series = load_series(series_dir_for("0.5.23"))
    args = build_args(cfg, series.sha256, "c0ffee")
    assert args["FI_ARCH_LIST"] == "10.3a 10.0a" and args["TARGET"] == "nvlink"
    assert args["BASE_IMAGE"].startswith("nvidia/cuda:13.")
    assert args["SGLANG_VERSION"] == "0.5.23" and args["PATCH_SERIES_SHA256"] == series.sha256
    dockerfile = (REPO / "src" / "sglfleet" / "images" / "Dockerfile").read_text()
    for name in args:
        assert f"ARG {name}" in dockerfile, name


def test_context_holds_only_dockerfile_inputs() -> None:
    cfg = load_image_config("production", overrides={"target": "pcie"})
    fileobj, size = build_context(cfg, [])
    with tarfile.open(fileobj=fileobj) as tar:
        names = set(tar.getnames())
    fileobj.close()
    series = load_series(series_dir_for("0.5.23"))
    # the patch tool as the package sglfleet.patches (python -m sglfleet.patches apply in the Dockerfile)
    expected = {"Dockerfile", "images/cuda-toolkit.sh", "images/jit_proof.py", "sglfleet/__init__.py",
                "sglfleet/paths.py", "sglfleet/patches/__init__.py", "sglfleet/patches/__main__.py", "wheels", "certs",
                "patches/sglang-0.5.23/series",
                "patches/sglang-0.5.23/manifest.yaml", *(f"patches/sglang-0.5.23/{p.name}" for p in series.patches),
                # the DDTree plugin the image installs
                "patches/ddtree/pyproject.toml",
                *(f"patches/ddtree/sglang_ddtree/{p.name}" for p in PLUGIN.glob("*.py"))}
    assert expected <= names
    extra = names - expected - {"certs/build-host.crt"}
    assert not extra, extra
    assert size < 5_000_000
