"""Typed YAML config loading.

Each stage declares its settings as a pydantic model whose field defaults are *the* defaults
(one place). A deployment file overrides any subset; unknown keys and bad values are rejected at
load with a one-line message naming the offending key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from sglfleet.pipeline.errors import UsageError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for config models: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Return base updated recursively by override (override wins; dicts merge, lists replace)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; raise UsageError with the file name on any problem. A relative path that is not
    under the current directory may name the package's own files (validation/profiles/..., the same in a
    checkout and in an installed wheel: sglfleet.paths.resolve)."""
    p = Path(path)
    if not p.is_file():
        from sglfleet.paths import resolve  # here only: the CPU image carries sglfleet/pipeline alone

        p = resolve(path)
    if not p.is_file():
        raise UsageError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(f"{p}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{p}: top level must be a mapping, got {type(data).__name__}")
    return data


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line naming every bad key, e.g. `thresholds.max_char_run: must be > 0`."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        msg = err["msg"].replace("Value error, ", "")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        parts.append(f"{loc}: {msg}")
    return f"{source}: invalid config: " + "; ".join(parts)


def build_model(model: type[M], data: dict[str, Any], source: str = "config") -> M:
    """Validate a mapping into `model`, raising UsageError with a readable one-line message."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise UsageError(format_validation_error(exc, source)) from None


def load_config(
    model: type[M],
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    section: str | None = None,
) -> M:
    """Load `model` from defaults <- YAML file (optionally one top-level section) <- overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        raw = read_yaml(path)
        source = str(path)
        if section is not None:
            raw = raw.get(section, {}) or {}
            if not isinstance(raw, dict):
                raise UsageError(f"{path}: section '{section}' must be a mapping")
        data = raw
    if overrides:
        data = deep_merge(data, overrides)
    return build_model(model, data, source)
