"""Fixtures for the load-test stage: the simulated streaming server and a CLI runner.

Locust always runs in a child process (`python -m sglfleet.loadtests ...` starts it), never in pytest's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from testbed.simserver import _raise_priority

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, timeout: float = 180, priority: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m sglfleet.loadtests ARGS` in a subprocess, output captured (priority: niced up, for timing tests)."""
    return subprocess.run([sys.executable, "-m", "sglfleet.loadtests", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False, preexec_fn=_raise_priority if priority else None)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def records(out: Path) -> list[dict[str, Any]]:
    """Every per-request record of a run (one line per chat request, all worker processes)."""
    return [json.loads(line) for f in sorted((out / "records").glob("*.jsonl")) for line in f.read_text().splitlines()
            if line.strip()]


def html_request_stats(out: Path) -> dict[str, dict[str, Any]]:
    """Locust's own request statistics as its HTML report holds them: name -> stats entry."""
    text = (out / "locust.html").read_text(encoding="utf-8")
    i = text.index("templateArgs = ") + len("templateArgs = ")
    args, _ = json.JSONDecoder().raw_decode(text[i:])
    return {s["name"]: s for s in args["requests_statistics"]}


def metrics_csv(out: Path) -> dict[str, dict[str, str]]:
    import csv

    return {r["Name"]: r for r in csv.DictReader((out / "locust_metrics.csv").open())}


def assert_locust_counts_only_chat_requests(out: Path) -> list[dict[str, Any]]:
    """Locust's stats (HTML report, CSV) hold the chat requests and nothing else: the Aggregated row is
    the chat row, its count is the number of chat requests made, and the latency metrics sit in their
    own table with one TTFT per successful request and one ITL per streamed gap."""
    import csv

    recs = [r for r in records(out) if not r.get("running_at_stop")]  # Locust never counts those
    ok = [r for r in recs if r["ok"]]
    stats = html_request_stats(out)
    assert set(stats) == {"chat", "Aggregated"}, set(stats)
    agg, chat = stats["Aggregated"], stats["chat"]
    assert agg["num_requests"] == chat["num_requests"] and agg["num_failures"] == chat["num_failures"]
    assert agg["total_rps"] == chat["total_rps"]
    m = metrics_csv(out)
    # One TTFT sample per successful chat request, counted over the same span as Locust's stats.
    assert chat["num_requests"] - chat["num_failures"] == int(m["TTFT"]["Count"])
    warmup_reset = (out / "stats_reset.json").is_file()  # both were reset at the end of the warm-up
    if warmup_reset:
        assert chat["num_requests"] <= len(recs) and int(m["ITL"]["Count"]) <= sum(len(r["itl"]) for r in ok)
    else:
        assert chat["num_requests"] == len(recs), (chat["num_requests"], len(recs))
        assert chat["num_failures"] == len(recs) - len(ok)
        assert int(m["ITL"]["Count"]) == sum(len(r["itl"]) for r in ok)
        assert int(m["output tokens"]["Count"]) == len(ok)
    rows = {r["Name"]: r for r in csv.DictReader((out / "locust_stats.csv").open())}
    assert set(rows) == {"chat", "Aggregated"}, set(rows)
    assert rows["Aggregated"]["Request Count"] == rows["chat"]["Request Count"]
    assert rows["Aggregated"]["Requests/s"] == rows["chat"]["Requests/s"]
    assert int(rows["chat"]["Request Count"]) <= len(recs)  # the CSV's last write may precede the final requests
    assert list(m) == ["TTFT", "ITL", "TPOT", "decode tok/s", "request tok/s", "output tokens"]
    assert {r["Unit"] for n, r in m.items() if n in ("TTFT", "ITL", "TPOT")} == {"ms"}
    assert m["decode tok/s"]["Unit"] == m["request tok/s"]["Unit"] == "tok/s"
    assert "lt-latency-metrics" in (out / "locust.html").read_text(encoding="utf-8")
    return recs
