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


def test_a_build_stopped_only_by_the_reference_checks_has_their_words_quoted() -> None:
    """The unpatched build at budget 7 (2026-12-02, H200) reads as English: lossless_t0 and long_copy are what
    failed it, and the rendered table must quote them, not only the corruption detectors."""
    import json

    from bench.history import raw_text
    from bench.incident_table import render

    raw = Path(__file__).resolve().parents[1] / "docs/results/incident-smollm2-gated-2026-12-02.json.xz"
    out = render(json.loads(raw_text(raw)))
    ref = out.split("What the checks against the target itself said")[1]
    rows = [ln for ln in ref.splitlines() if ln.startswith("| unpatched-b7-k4 |")]
    assert {r.split(" | ")[1] for r in rows} == {"lossless_t0", "long_copy"}
    assert "diverges at char 56" in next(r for r in rows if "lossless_t0" in r)
    assert not [ln for ln in ref.splitlines() if ln.startswith("| patched-b16-k4 |")]  # passed: nothing quoted
