"""When did the router's upstream errors of a `make demo` run happen, against the fleet load test's steps?

The open item of docs/rollout.md: sglang-router counts an upstream 5xx or two during `make demo`'s fleet load test
while no client sees an error. Two explanations were left: a request sent on a pooled connection the server had
just closed (the router retries it), or the load test's own cancellation when Locust stops a step's users. The
second can only happen at a step's end. This reads one demo run directory: the router's log
(`inventory-data/router/router.log`, its `Failed to send` lines, UTC to the second) and each load test step's
window (`loadtest/<stage>/steps/*/stats_reset.json` .. `stop_at.json`), and writes each error with the step it fell
in and its distance to that step's end.

    python bench/router_upstream_errors.py runs/demo-... --out docs/results/router-upstream-errors-DATE.json

Exit 2 when the directory holds no router log or no load test step.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.history import raw_header  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LINE = re.compile(r"^(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})\s+ERROR\s.*?Failed to send typed request "
                  r"worker_url=(?P<worker>\S+) route=(?P<route>\S+) error=(?P<error>.*)$")


def router_errors(log: Path) -> list[dict[str, Any]]:
    out = []
    for raw in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = LINE.match(ANSI.sub("", raw).strip())
        if m:
            at = dt.datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC).timestamp()
            out.append({"at": at, "utc": m["ts"], "worker": m["worker"], "route": m["route"], "error": m["error"]})
    return out


def steps(run: Path) -> list[dict[str, Any]]:
    out = []
    for d in sorted(run.glob("**/loadtest/*/steps/*")):
        try:
            start = json.loads((d / "stats_reset.json").read_text())["at"]
            stop = json.loads((d / "stop_at.json").read_text())["at"]
        except (OSError, ValueError, KeyError):
            continue
        out.append({"stage": d.parent.parent.name, "step": d.name, "measured_from": start, "stopped_at": stop})
    return out


def place(errors: list[dict[str, Any]], windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each error with the step whose measured window (to the log's one-second resolution) holds it."""
    for e in errors:
        hit = [w for w in windows if w["measured_from"] - 1 <= e["at"] <= w["stopped_at"] + 1]
        e["step"] = f"{hit[0]['stage']}/{hit[0]['step']}" if hit else None
        # the log truncates to the second: the error happened in [at, at + 1)
        e["seconds_before_step_end"] = (round(hit[0]["stopped_at"] - (e["at"] + 1), 3) if hit else None)
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a make demo run directory (runs/demo-...)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    run = Path(a.run)
    log = run / "inventory-data" / "router" / "router.log"
    windows = steps(run)
    if not log.is_file() or not windows:
        print(f"error: {run}: no router log ({log}) or no load test step", file=sys.stderr)
        return 2
    errors = place(router_errors(log), windows)
    out = {**raw_header("bench/router_upstream_errors.py", argv), "run": run.name, "steps": windows,
           "errors": errors, "inside_a_step_before_its_end": sum(1 for e in errors if e["step"] and
                                                                  (e["seconds_before_step_end"] or 0) > 0)}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {a.out}: {len(errors)} router upstream error(s), {out['inside_a_step_before_its_end']} inside a "
          "step before its end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
