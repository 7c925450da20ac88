"""Typed rollout settings (defaults here; a YAML file's `rollout:` section overrides any of them)."""

from __future__ import annotations

from pydantic import Field

from sglfleet.pipeline.config import StrictModel, load_config


class RolloutConfig(StrictModel):
    inventory: str = "ansible/inventories/example"
    runs_dir: str = "runs/rollout"
    # Batch size of the rolling restart (hosts per batch, or a percentage like "25%").
    serial: int | str = 1
    # Failed hosts tolerated per batch, in percent. 0: the first failure stops the rollout.
    max_fail_percentage: int = Field(default=0, ge=0, le=100)
    forks: int = Field(default=16, ge=1)
    promoted_tag: str = "promoted"
    # Roll the changed hosts back automatically when the deploy or the gate fails.
    auto_rollback: bool = True
    gate: bool = True
    gate_config: str | None = None
    # The lossless baseline (`make record-baseline` from a target-only deployment of the same image): sets the
    # gate config's lossless.baseline, which a speculative deployment needs before anything changes.
    gate_baseline: str | None = None
    gate_timeout_s: float = Field(default=900.0, gt=0)
    # Registry needs a login (also taken from the inventory's rollout_registry_auth).
    registry_auth: bool = False
    registry_timeout_s: float = Field(default=10.0, gt=0)
    # TLS to the registry (default). false only for a plain-HTTP loopback test registry (also taken from
    # the inventory's rollout_registry_tls). CA bundle: a private CA (env ROLLOUT_REGISTRY_CA_BUNDLE wins).
    registry_tls: bool = True
    registry_ca_bundle: str | None = None
    # Load test before promotion: a quick capacity search on the first changed endpoint; its SLOs come from
    # the `loadtest:` section of loadtest_config (default: the load-test defaults). Promotion needs a
    # capacity of at least min_capacity (users) meeting those SLOs.
    loadtest: bool = True
    loadtest_config: str | None = None
    loadtest_quick: bool = True
    loadtest_max_load: float | None = Field(default=None, gt=0)
    min_capacity: float = Field(default=1.0, gt=0)
    # The served endpoints' API key (SGLang --api-key), for the gate and the load test: the NAME of an
    # environment variable or a file holding it (pipeline/auth.py), never the key; passed to both stages.
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    api_key_file: str | None = None
    # Canary rollout (flow/plan.py, flow/canary.py): per group one canary (rollout_canary: true, else the first
    # host) drained from its router, deployed, fully gated and load-tested alone, then the other hosts in
    # `serial` batches with a smoke gate, then a fleet load test through the router. None: on when the
    # inventory names a router (rollout_router_url) and the gate is on; false: every host, then every gate.
    canary: bool | None = None
    drain_timeout_s: float = Field(default=120.0, gt=0)  # bound on a drained host's requests in flight
    router_add_timeout_s: float = Field(default=180.0, gt=0)  # until the router reports a host healthy
    # Constant client load through the router during the whole rollout (requests per second, 0: none).
    client_load_rate: float = Field(default=0.0, ge=0)
    # Seconds between two scrapes of the servers' and the router's /metrics while a gate or load test runs.
    metrics_period_s: float = Field(default=2.0, gt=0)
    # The rollout's verdicts in Prometheus text format are written to the run dir (rollout.prom) and, when set,
    # to this file too: node-exporter's textfile collector directory + a name ending in .prom.
    metrics_textfile: str | None = None
    # Retries of transient failures (never of a verdict): registry HTTP calls (connection errors, 429, 5xx)
    # and the preflight playbook when hosts were unreachable (ansible-runner rc 4). Attempts in all, and the
    # first wait (doubled each time, at most retry_max_wait_s).
    registry_attempts: int = Field(default=4, ge=1)
    ssh_attempts: int = Field(default=3, ge=1)
    retry_wait_s: float = Field(default=0.5, ge=0)
    retry_max_wait_s: float = Field(default=8.0, ge=0)
    # Refuse an image whose labels (target, sglang version, patch series) do not fit the host group.
    image_fit_check: bool = True


def load(path: str | None, overrides: dict | None = None) -> RolloutConfig:
    return load_config(RolloutConfig, path, overrides, section="rollout")
