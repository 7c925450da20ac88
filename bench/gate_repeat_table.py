"""Render repeated gate runs of one incident call (tests/ddtree/incident.py --repeat N on the H200):
per server how many of its runs passed, the exit codes, which checks failed and how often, and what
the lossless check counted (answers identical to the baseline, numerical near-ties, re-anchored
continuations), so that "no correct build is refused" can be read off one table.

    python bench/render_docs.py --show gate-repeat docs/results/incident-gate30-....json.gz
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def _case(gate: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in gate.get("cases", []) if c.get("name") == name), None)


def _lossless(gates: list[dict[str, Any]]) -> str:
    """Sums of the lossless check's counts over the runs: identical / answers, near-ties, re-anchored."""
    tot: Counter[str] = Counter()
    seen = False
    for g in gates:
        c = _case(g, "lossless_t0") or {}
        counts = c.get("counts") or {}
        for key in ("identical", "answers", "near_ties", "reanchored"):
            if isinstance(counts.get(key), int):
                tot[key] += counts[key]
                seen = True
    if not seen:
        return "—"
    return (f"{tot['identical']}/{tot['answers']} identical, {tot['near_ties']} near-ties, "
            f"{tot['reanchored']} re-anchored")


def _likelihood(gates: list[dict[str, Any]]) -> str:
    """How many likelihood@T cases ran (not skipped) and passed, over all runs and temperatures."""
    ran = [c for g in gates for c in g.get("cases", [])
           if str(c.get("name", "")).startswith("likelihood@") and not c.get("skipped")]
    if not ran:
        return "—"
    return f"{sum(1 for c in ran if c.get('ok'))}/{len(ran)} passed"


def render(raw: dict[str, Any], path: str) -> str:
    by_server: dict[str, list[dict[str, Any]]] = {}
    for g in raw.get("gates", []):
        by_server.setdefault(g["server"], []).append(g)
    lines = ["| server | gate runs | PASS | exit codes | failed checks (runs) | lossless_t0 over the runs "
             "| likelihood@T cases | request errors |",
             "|---|---|---|---|---|---|---|---|"]
    for server, gates in by_server.items():
        passed = sum(1 for g in gates if (g.get("summary") or {}).get("verdict") == "PASS")
        rcs = Counter("not run (no time left)" if g.get("not_run") else
                      "no verdict (timed out)" if g.get("rc") is None else str(g.get("rc")) for g in gates)
        failed: Counter[str] = Counter()
        for g in gates:
            failed.update((g.get("summary") or {}).get("failed_checks") or [])
        top = ", ".join(f"{name} ({n})" for name, n in failed.most_common(8)) or "none"
        if len(failed) > 8:
            top += f", and {len(failed) - 8} more"
        errors = sum(int((g.get("summary") or {}).get("request_errors") or 0) for g in gates)
        lines.append(f"| {server} | {len(gates)} | {passed} | "
                     + ", ".join(f"{rc}: {n}" for rc, n in sorted(rcs.items()))
                     + f" | {top} | {_lossless(gates)} | {_likelihood(gates)} | {errors} |")
    base = raw.get("baseline") or {}
    train = raw.get("drafter_train") or {}
    offline = (train.get("offline") or {}).get("accept_length")
    notes = [f"Baseline: `record-baseline` exit {base.get('rc', '—')}."]
    if offline is not None:
        notes.append(f"Drafter: offline accept length {offline:.2f} ({train.get('steps')} steps).")
    return "\n".join(lines) + "\n\n" + " ".join(notes) + "\n\n" + \
        f"Raw: {path} ({raw.get('date')}, {raw.get('machine')}; `{raw.get('command')}`)\n"
