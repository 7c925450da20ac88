"""Per-request latency metrics, defined once for every stage (load tests; the gate may adopt them).

All inputs are one request's client-side timings in seconds and its output token count:

* TTFT   time from sending the request to the first content token.
* ITL    every gap between consecutive content chunks (one gap per streamed chunk, as in
         `sglang.bench_serving`; a chunk carrying several tokens counts once).
* TPOT   (E2E - TTFT) / (tokens - 1): mean time per output token after the first.
* decode tok/s  (tokens - 1) / (E2E - TTFT): the decode rate after the first token (1 / TPOT).
* request tok/s tokens / E2E: output tokens over the whole request, prefill included.

`METRICS` names each metric with its unit, for tables and CSV headers.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

# name -> unit. The order is the order of tables.
METRICS: dict[str, str] = {
    "TTFT": "ms",
    "ITL": "ms",
    "TPOT": "ms",
    "decode tok/s": "tok/s",
    "request tok/s": "tok/s",
    "output tokens": "tokens",
}


def inter_token_gaps(token_times: Sequence[float]) -> list[float]:
    """ITL: the gaps between consecutive content-chunk arrival times."""
    return [b - a for a, b in pairwise(token_times)]


def tpot(e2e: float, ttft: float | None, tokens: int) -> float | None:
    """(E2E - TTFT) / (tokens - 1); None without a first token or with fewer than two tokens."""
    if ttft is None or tokens < 2:
        return None
    return (e2e - ttft) / (tokens - 1)


def decode_tokens_per_s(e2e: float, ttft: float | None, tokens: int) -> float | None:
    """(tokens - 1) / (E2E - TTFT); None when it is undefined (no TTFT, < 2 tokens, no decode time)."""
    if ttft is None or tokens < 2 or e2e - ttft <= 0:
        return None
    return (tokens - 1) / (e2e - ttft)


def request_tokens_per_s(e2e: float, tokens: int) -> float | None:
    """tokens / E2E; None for a request with no duration."""
    return tokens / e2e if e2e > 0 else None
