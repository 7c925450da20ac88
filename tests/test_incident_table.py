"""bench/incident_table.py's lossless column: the counts kept by the incident driver, or (older raw
files) the gate's message; a failed check is FAIL whatever its numbers."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.incident_table import _lossless


def _server(case: dict) -> dict:
    return {"gate": {"cases": [{"name": "spec_accept_length", "ok": True}, {"name": "lossless_t0", **case}]}}


def test_counts_are_read_as_numbers_and_old_messages_still_render() -> None:
    counts = {"identical": 5, "answers": 8, "near_ties": 3, "reanchored": 2}
    assert _lossless(_server({"ok": True, "counts": counts, "message": "reworded"})) == \
        "5/8 identical, 3 near-tie (2 re-anchored to the end)"
    old = ("4 of 8 T=0 answers identical to the baseline, 4 differ from a near-tie on (3 of them re-anchored "
           "to their end: the target's own greedy text) (x; y)")
    assert _lossless(_server({"ok": True, "message": old})) == "4/8 identical, 4 near-tie (3 re-anchored to the end)"
    assert _lossless(_server({"ok": False, "counts": counts})) == "FAIL"
    assert _lossless({"gate": {"cases": []}}) == "—"
