"""Server-side speculative-decoding metrics.

SGLang reports the mean accept length (tokens committed per verify step, bonus token included) in
``/server_info`` (``internal_states[i].avg_spec_accept_length``) and Prometheus
(``sglang:spec_accept_length``). Per-request values come back in responses and are read by the
client. llama.cpp reports drafted/accepted counts per response (``timings.draft_n`` /
``draft_n_accepted``), from which the gate derives the same accept length.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from sglfleet.pipeline.client import OpenAIClient

_PROM = re.compile(r"^(sglang:spec_accept_(?:length|rate))(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


@dataclass
class SpecReading:
    accept_length: float | None
    accept_rate: float | None
    source: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def parse_prometheus(text: str) -> SpecReading | None:
    """Mean over label sets of sglang:spec_accept_length / _rate, None when absent."""
    vals: dict[str, list[float]] = {}
    for name, value in _PROM.findall(text):
        v = float(value)
        if name.endswith("length") and v < 1.0:
            continue  # the gauge's default (0.0) before any verify, and on a server without speculation
        vals.setdefault(name, []).append(v)
    if not vals:
        return None

    def mean(key: str) -> float | None:
        v = vals.get(key)
        return sum(v) / len(v) if v else None

    return SpecReading(mean("sglang:spec_accept_length"), mean("sglang:spec_accept_rate"), "/metrics")


def _declares_no_speculation(info: dict) -> bool:
    """Whether SGLang's /server_info says the server runs no speculative algorithm (its server args, top level or
    in ``internal_states``, carry ``speculative_algorithm: null``)."""
    states = [info, *[s for s in info.get("internal_states") or [] if isinstance(s, dict)]]
    declared = [s["speculative_algorithm"] for s in states if "speculative_algorithm" in s]
    return bool(declared) and not any(declared)


def read_spec_metrics(client: OpenAIClient, kind: str) -> SpecReading | None:
    """Best server-side reading, or None when the server reports none."""
    if kind != "sglang":
        return None
    info = client.server_info() or {}
    if _declares_no_speculation(info):
        return None  # sglang exports its spec gauges at 0.0 on every server; the server's own args decide
    raw = [s.get("avg_spec_accept_length") for s in info.get("internal_states") or [] if isinstance(s, dict)]
    lengths = [float(x) for x in raw if x is not None]
    if lengths:
        return SpecReading(sum(lengths) / len(lengths), None, "/server_info")
    text = client.metrics_text()
    return parse_prometheus(text) if text else None
