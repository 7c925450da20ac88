"""Typed image build configuration. The field defaults are *the* defaults (production, TARGET=pcie
settings live in TARGETS); profiles (images/profiles/*.yaml) and CLI flags override them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sglfleet import paths
from sglfleet.pipeline.config import StrictModel, load_config
from sglfleet.pipeline.errors import UsageError

IMAGES_DIR = paths.PACKAGE_DIR / "images"
PROFILES_DIR = IMAGES_DIR / "profiles"


class TargetSpec(StrictModel):
    description: str
    arch_list: str = Field(description="FLASHINFER_CUDA_ARCH_LIST for the image")
    required_arch: str = Field(description="arch that must stay in any override of arch_list")


TARGETS: dict[str, TargetSpec] = {
    "pcie": TargetSpec(description="8x RTX PRO 6000 Blackwell (SM120), PCIe", arch_list="12.0f",
                       required_arch="12.0f"),
    "nvlink": TargetSpec(description="8x B300 (SM103; SM100 kept for B200), NVLink", arch_list="10.3a 10.0a",
                         required_arch="10.3a"),
}

_SECRETISH = re.compile(r"(token|passw|secret|api[_-]?key|credential|://[^/\s]*:[^/\s]*@)", re.I)


class ImageConfig(StrictModel):
    target: Literal["pcie", "nvlink"] = "pcie"
    name: str = Field("sglang-fleet", pattern=r"^[a-z0-9]+([._/-][a-z0-9]+)*$")
    base_image: str = "nvidia/cuda:13.0.1-devel-ubuntu24.04"
    cuda_version: str = Field("13.0", pattern=r"^\d+\.\d+$")
    sglang_version: str = Field("0.5.23", pattern=r"^\d+\.\d+\.\d+(\.post\d+)?$")
    flashinfer_version: str = Field("0.7.2", pattern=r"^\d+\.\d+\.\d+(\.post\d+)?$")
    patch_series: str = Field("patches/sglang-0.5.23",
                              description="series dir (absolute, or relative to the current directory or the package)")
    install_profile: Literal["full", "ci"] = "full"
    jit_scope: Literal["full", "ci"] = "full"
    arch_list: str | None = Field(None, description="override of the target's FlashInfer arch list")
    head_dims: str = Field("128", pattern=r"^\d+( \d+)*$")
    cuda_from_wheels: Literal["auto", "0", "1"] = "auto"
    torch_spec: str = Field("", description="extra torch requirement (ci: the CPU wheel from the wheelhouse)")
    wheelhouse: list[str] = Field(default_factory=list,
                                  description="requirements to `pip download --no-deps` into the build context")
    wheel_platform: str = "manylinux_2_28_x86_64"
    wheel_python: str = "3.11"
    dockerfile: str = "images/Dockerfile"
    build_target: Literal["toolchain", "sglang", "jit", "image"] = "image"

    @field_validator("torch_spec", "base_image")
    @classmethod
    def _no_secrets(cls, v: str) -> str:
        if _SECRETISH.search(v):
            raise ValueError("looks like it carries a credential; build args end up in image history")
        return v

    @field_validator("wheelhouse")
    @classmethod
    def _no_secret_reqs(cls, v: list[str]) -> list[str]:
        for item in v:
            if _SECRETISH.search(item):
                raise ValueError(f"'{item}' looks like it carries a credential")
        return v

    @model_validator(mode="after")
    def _check_arch(self) -> ImageConfig:
        if self.arch_list is not None:
            spec = TARGETS[self.target]
            archs = self.arch_list.split()
            if spec.required_arch not in archs:
                raise ValueError(f"arch_list '{self.arch_list}' for target {self.target} must include "
                                 f"{spec.required_arch}")
            for a in archs:
                if not re.fullmatch(r"\d+\.\d+[af]?", a):
                    raise ValueError(f"arch '{a}' is not like 12.0f / 10.3a")
        if self.install_profile == "ci" and not self.torch_spec:
            raise ValueError("install_profile ci needs torch_spec (torch is not pulled in by --no-deps)")
        return self

    @property
    def effective_arch_list(self) -> str:
        return self.arch_list or TARGETS[self.target].arch_list

    @property
    def series_path(self) -> Path:
        return paths.resolve(self.patch_series).resolve()


def load_image_config(profile: str | None = None, config: str | None = None,
                      overrides: dict | None = None) -> ImageConfig:
    """defaults <- profile (images/profiles/<name>.yaml) or --config file <- CLI overrides."""
    if profile and config:
        raise UsageError("give either --profile or --config, not both")
    path: Path | None = None
    if profile:
        path = PROFILES_DIR / f"{profile}.yaml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
            raise UsageError(f"unknown profile '{profile}' (known: {known})")
    elif config:
        path = Path(config)
    if overrides and "target" in overrides and overrides["target"] not in TARGETS:
        raise UsageError(f"unknown target '{overrides['target']}' (known: {', '.join(TARGETS)})")
    return load_config(ImageConfig, path, overrides=overrides or None)
