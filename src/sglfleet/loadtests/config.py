"""Load-test settings: one pydantic model whose field defaults are the project's defaults.

Load it from the `loadtest:` section of a deployment YAML with `load_loadtest_config(path, overrides)`.
Every run is bounded: `duration_s` and `max_requests` always apply (Locust's own `--run-time` plus a
watchdog inside the locustfile, so web-UI runs are bounded too). There is no default target.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sglfleet.pipeline.config import StrictModel, load_config


class SLO(StrictModel):
    """Service-level objectives a load level must meet."""

    ttft_p95_ms: float = Field(default=2000.0, gt=0, le=3_600_000)
    itl_p95_ms: float = Field(default=200.0, gt=0, le=600_000)
    max_error_rate: float = Field(default=0.01, ge=0, lt=1)

    @field_validator("ttft_p95_ms", "itl_p95_ms", "max_error_rate")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


class Step(StrictModel):
    """One step of a ramp: hold `users` for `duration_s` (rate mode: `rate` req/s)."""

    users: int = Field(ge=1, le=10_000)
    duration_s: float = Field(gt=0, le=3600)
    spawn_rate: float | None = Field(default=None, gt=0)


class WorkloadConfig(StrictModel):
    """What each request asks for."""

    kind: Literal["builtin", "synthetic", "jsonl", "prefix-cache"] = "builtin"
    dataset: str | None = None  # JSONL file for kind=jsonl
    max_tokens: int = Field(default=128, ge=1, le=131072)  # builtin / jsonl lines without their own
    input_tokens: int = Field(default=256, ge=1, le=1_000_000)  # synthetic target prompt length
    output_tokens: int = Field(default=128, ge=1, le=131072)  # synthetic target output length
    ignore_eos: bool = True  # synthetic: send ignore_eos + min_tokens so the server emits exactly N
    temperature: float = Field(default=0.0, ge=0, le=2)
    seed: int = 0  # sampling seeds (T > 0) and, with reuse_prompts, the synthetic prompts' words
    # Synthetic prompts are new on every run (a run id in each one), so a prefix cache warmed by an
    # earlier run does not flatter TTFT. reuse_prompts: true makes them the same as every other run with
    # this seed (a run repeated on purpose); the `prefix-cache` workload keeps a fixed set on purpose.
    reuse_prompts: bool = False
    prefix_pool: int = Field(default=8, ge=1, le=4096, description="prefix-cache workload: distinct prompts")
    # Requests whose received length differs from the asked one by more than this are mismatches.
    length_tolerance: float = Field(default=0.1, ge=0, le=1)

    @model_validator(mode="after")
    def _dataset(self) -> WorkloadConfig:
        if self.kind == "jsonl" and not self.dataset:
            raise ValueError("workload.kind=jsonl needs workload.dataset (a JSONL file)")
        return self


class CapacityConfig(StrictModel):
    """Capacity search: bracket (double the load) then bisect, one bounded Locust run per step."""

    mode: Literal["users", "rate"] = "users"
    start: float = Field(default=1, gt=0)
    max_load: float = Field(default=256, gt=0)
    resolution: float = Field(default=0.1, gt=0, le=1)  # stop bisecting when hi-lo <= res*lo (users: >= 1)
    step_duration_s: float = Field(default=20, gt=0, le=3600)
    warmup_s: float = Field(default=3, ge=0)
    min_samples: int = Field(default=20, ge=1)
    max_step_s: float = Field(default=60, gt=0, le=7200)  # a step that has too few samples ends here
    early_stop_factor: float = Field(default=3.0, gt=1)  # stop a step when p95 TTFT > factor*SLO
    max_steps: int = Field(default=16, ge=2, le=100)

    @model_validator(mode="after")
    def _consistent(self) -> CapacityConfig:
        if self.warmup_s >= self.step_duration_s:
            raise ValueError(f"warmup_s ({self.warmup_s:g}) must be shorter than step_duration_s "
                             f"({self.step_duration_s:g})")
        if self.max_step_s < self.step_duration_s:
            raise ValueError("max_step_s must be >= step_duration_s")
        if self.start > self.max_load:
            raise ValueError(f"start ({self.start:g}) must be <= max_load ({self.max_load:g})")
        return self


class LoadTestConfig(StrictModel):
    """Everything one load test (or capacity search) needs. `host` has no default on purpose."""

    host: str | None = None
    model: str | None = None  # default: the first model the server lists
    # The target's API key: set from api_key_env / api_key_file by with_api_key() (pipeline/auth.py) and
    # never written to disk (loadtest-settings.json leaves it out; Locust gets it through its environment).
    api_key: str | None = None
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    api_key_file: str | None = None
    path: str = "/v1/chat/completions"
    # Load: fixed users (closed loop), or an open-loop request rate spread over `users` generators.
    users: int = Field(default=4, ge=1, le=10_000)
    spawn_rate: float = Field(default=100.0, gt=0)
    rate: float | None = Field(default=None, gt=0)  # req/s; set => open-loop rate mode
    arrival: Literal["constant", "poisson"] = "poisson"
    max_inflight: int = Field(default=256, ge=1)  # rate mode: arrivals beyond this are dropped+counted
    steps: list[Step] = Field(default_factory=list)  # step ramp through a LoadTestShape
    # Bounds (always on).
    duration_s: float = Field(default=60.0, gt=0, le=86_400)
    max_requests: int = Field(default=10_000, ge=1)
    warmup_s: float = Field(default=0.0, ge=0)  # requests started earlier are left out of our summary
    request_timeout_s: float = Field(default=120.0, gt=0)
    request_stall_s: float = Field(default=30.0, gt=0, description="no bytes for this long: the request fails "
                                   "with the error class `stall` (before its answer or mid-stream); at most "
                                   "request_timeout_s")
    stop_timeout_s: float = Field(default=5.0, ge=0)  # in-flight requests may finish this long after the end
    # Scale-out: >1 runs Locust's master + N local worker processes (`--processes N`).
    processes: int = Field(default=1, ge=1, le=256)
    itl_events: Literal["each", "mean", "off"] = "each"  # one Locust event per ITL gap, per request, none
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    slo: SLO = Field(default_factory=SLO)
    capacity: CapacityConfig = Field(default_factory=CapacityConfig)
    # Set by the capacity search for its steps: stop early once enough samples / saturated.
    step_control: bool = False

    @field_validator("host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s) URL, got '{v}'")
        return v.rstrip("/") if v else v

    @model_validator(mode="after")
    def _consistent(self) -> LoadTestConfig:
        if self.warmup_s >= self.duration_s:
            raise ValueError(f"warmup_s ({self.warmup_s:g}) must be shorter than duration_s ({self.duration_s:g})")
        if self.steps and self.rate is not None:
            raise ValueError("steps (a user ramp) and rate cannot be combined")
        if self.api_key_env and self.api_key_file:
            raise ValueError("give the API key one way: api_key_env or api_key_file, not both")
        return self

    @property
    def total_duration_s(self) -> float:
        """The run's length: the sum of the steps for a ramp, else duration_s."""
        return sum(s.duration_s for s in self.steps) if self.steps else self.duration_s


def with_api_key(cfg: LoadTestConfig) -> LoadTestConfig:
    """The config with `api_key` read from api_key_env / api_key_file (UsageError when missing); unchanged
    when neither is set."""
    from sglfleet.pipeline.auth import resolve_api_key

    key = resolve_api_key(cfg.api_key_env, cfg.api_key_file)
    return cfg.model_copy(update={"api_key": key}) if key else cfg


def load_loadtest_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> LoadTestConfig:
    """Defaults <- `loadtest:` section of a YAML file <- overrides (e.g. from the CLI)."""
    return load_config(LoadTestConfig, path, overrides, section="loadtest")
