"""Precision: TTFT and every ITL computed by the Locust harness against a server with known delays.

The simulator sleeps a known TTFT and a cycle of known gaps, and records the instants at which it
actually wrote each token (same monotonic clock as the client). The harness's numbers, read from
its per-request records and Locust's stats, must match those within 1 ms.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

from tests.loadtests.conftest import assert_locust_counts_only_chat_requests, metrics_csv, read_json, run_cli

TTFT_MS = 40.0
GAPS_MS = (3.0, 8.0, 15.0)
TOKENS = 16


def _records(out: Path) -> list[dict]:
    recs = [json.loads(line) for f in sorted((out / "records").glob("*.jsonl")) for line in f.read_text().splitlines()]
    return sorted(recs, key=lambda r: r["t"])


def test_ttft_and_itl_match_known_delays(sim, tmp_path: Path) -> None:
    srv = sim("--ttft-ms", str(TTFT_MS), "--itl-ms", ",".join(str(g) for g in GAPS_MS), "--tokens", str(TOKENS))
    out = tmp_path / "run"
    cp = run_cli("run", "--host", srv.url, "--users", "1", "--duration", "4", "--max-tokens", str(TOKENS),
                 "--out", str(out), priority=True)
    assert cp.returncode == 0, cp.stderr
    stop_at = read_json(out / "stop_at.json")["at"]
    all_recs = _records(out)
    timings = srv.timings()[1:]  # the first request the server saw is the CLI's preflight probe
    assert len(timings) == len(all_recs)
    pairs = [(r, t) for r, t in zip(all_recs, timings, strict=True)
             # as in the summary: requests still running when the run began to stop are left out
             if r["ok"] and r["t"] + r["e2e"] / 1000 <= stop_at]
    assert len(pairs) >= 10
    itl_err, ttft_err = [], []
    for rec, tim in pairs:
        sends = tim["sends"]
        assert rec["n"] == TOKENS and len(rec["itl"]) == TOKENS - 1
        server_gaps = [(b - a) * 1000 for a, b in itertools.pairwise(sends)]
        itl_err += [abs(c - s) for c, s in zip(rec["itl"], server_gaps, strict=True)]
        # TTFT: the server's known part (headers sent -> first token) against the client's (headers
        # received -> first token); connection set-up and scheduling before the headers are common to both.
        ttft_err.append(abs((rec["ttft"] - rec["hdr"]) - (sends[0] - tim["t_head"]) * 1000))
        assert rec["ttft"] >= TTFT_MS - 1.0
    # Within 1 ms. A systematic error (a timestamp taken late, a gap computed wrongly) moves the
    # median; a shared CI box adds scheduler-tick outliers (~4-8 ms when a process is descheduled) to
    # a share of samples, so the share under 1 ms is bounded loosely (measured run: docs/loadtests.md).
    assert statistics.median(itl_err) < 0.5, sorted(itl_err)
    assert sum(e < 1.0 for e in itl_err) >= 0.6 * len(itl_err), sorted(itl_err)[-10:]
    assert statistics.median(ttft_err) < 1.0, sorted(ttft_err)
    assert sum(e < 1.0 for e in ttft_err) >= 0.5 * len(ttft_err), sorted(ttft_err)

    # The same numbers reach the Locust-side latency metrics (locust_metrics.csv), not Locust's request
    # stats: one ITL sample per gap, one TTFT per request, and the Aggregated row counts chat requests only.
    summary = read_json(out / "summary.json")
    assert_locust_counts_only_chat_requests(out)
    rows = metrics_csv(out)
    assert int(rows["TTFT"]["Count"]) >= summary["requests"]["ok"]
    assert int(rows["ITL"]["Count"]) == int(rows["TTFT"]["Count"]) * (TOKENS - 1)
    nominal_mean_gap = statistics.mean((GAPS_MS * TOKENS)[: TOKENS - 1])
    assert abs(float(rows["ITL"]["Mean"]) - nominal_mean_gap) < 2.0
    tpot = summary["tpot_ms"]["mean"]
    e2e, ttft = summary["e2e_ms"]["mean"], summary["ttft_ms"]["mean"]
    assert abs(tpot - (e2e - ttft) / (TOKENS - 1)) < 0.01
