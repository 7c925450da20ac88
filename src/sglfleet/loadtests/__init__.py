"""Locust load tests and capacity search for OpenAI-compatible streaming chat endpoints.

Entry points: `python -m sglfleet.loadtests run|capacity|ui`, `make loadtest|capacity|loadtest-ui`, and from
Python `loadtests.runner.run_loadtest(cfg, out)` / `loadtests.capacity.run_capacity(cfg, out)` /
`loadtests.quick_capacity(url, out)`. Locust always runs in a child process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def quick_capacity(host: str, out: str | Path, max_load: float | None = None, **slo: float) -> dict[str, Any]:
    """A short capacity search (the `--quick` settings) against `host`; returns the capacity result.

    `slo` may set ttft_p95_ms, itl_p95_ms, max_error_rate. Raises pipeline.errors.PipelineError
    subclasses for bad input, an unreachable target or an incomplete run. Writes capacity.json,
    capacity.html and plots into `out`; result["capacity"] is None when even one user misses the SLOs.
    """
    from sglfleet.loadtests.capacity import QUICK, run_capacity
    from sglfleet.loadtests.config import load_loadtest_config

    overrides: dict[str, Any] = {**QUICK, "host": host, "slo": dict(slo)}
    if max_load is not None:
        overrides["capacity"] = {**QUICK["capacity"], "max_load": max_load}
    cfg = load_loadtest_config(None, overrides)
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    return run_capacity(cfg, path)
