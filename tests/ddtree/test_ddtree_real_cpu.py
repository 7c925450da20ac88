"""The CPU half of bench/ddtree_real.py's churn check (the overlap scheduler's exactness test on the H200): the
request plan every server gets, the per-answer comparison against the target alone, and its rendered table."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def real(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "ddtree"))
    sys.modules.pop("ddtree_real", None)
    return importlib.import_module("ddtree_real")


PROMPTS = [{"id": f"p{i}", "ids": [i, i + 1]} for i in range(8)]


def test_the_churn_plan_is_the_same_for_every_server_and_mixes_lengths(real) -> None:
    a, b = real.churn_plan(PROMPTS, 256), real.churn_plan(PROMPTS, 256)
    assert a == b and len(a) == real.CHURN_REQUESTS
    assert {r["id"] for r in a} == {p["id"] for p in PROMPTS}
    lens = [r["max_new"] for r in a]
    assert min(lens) >= 8 and max(lens) <= 256 and len(set(lens)) > real.CHURN_REQUESTS // 2
    assert real.churn_plan(PROMPTS, 256, seed=1) != a
    assert all(r["max_new"] == 4 for r in real.churn_plan(PROMPTS, 4)), "lengths stay within --new"


def test_an_answer_is_compared_with_the_target_alones_up_to_its_length(real) -> None:
    ref = {"id": "p0", "output_ids": [5, 6, 7, 8, 9], "top2": [[(-0.1, 5), (-3.0, 1)], [(-0.5, 6), (-0.55, 2)],
                                                              [(-0.2, 7), (-2.0, 3)], [], []]}
    assert real.compare_prefix(ref, [5, 6, 7], 3)["identical"]
    assert real.compare_prefix(ref, [5, 6, 7, 8, 9], 40)["identical"], "the reference ended sooner: all of it"
    row = real.compare_prefix(ref, [5, 2, 7], 3)
    assert not row["identical"] and row["diverge_at"] == 1 and row["top2_gap"] == pytest.approx(0.05)
    short = real.compare_prefix(ref, [5, 6], 3)
    assert not short["identical"] and short["diverge_at"] == 2, "an answer that stops early parts where it stops"
    longer = real.compare_prefix(ref, [5, 6, 7, 8, 9, 4], 40)
    assert not longer["identical"] and longer["diverge_at"] == 5 and longer["top2_gap"] is None


def test_the_churn_table_names_each_server_and_where_answers_part(real, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.render_ddtree_real import churn_lines

    def server(name, kind, budget, overlap, rows):
        cell = {"churn": True, "requests": len(rows), "identical": sum(1 for r in rows if r.get("identical")),
                "errors": [r["error"] for r in rows if "error" in r], "wall_s": 12.34, "rows": rows}
        return {"name": name, "kind": kind, "budget": budget, "overlap": overlap, "cells": [cell]}

    raw = {"churn": {"requests": 3, "streams": 6}, "servers": [
        server("target", "target", None, False, [{"identical": True}] * 3),
        server("ddtree-b16-overlap", "ddtree", 16, True,
               [{"identical": True}, {"identical": False, "diverge_at": 4, "top2_gap": 0.125},
                {"identical": False, "diverge_at": 9, "top2_gap": 2.5}]),
        server("chain-b8", "chain", None, False, [{"identical": True}, {"error": "boom"}, {"identical": True}]),
        {"name": "ddtree-b8", "kind": "ddtree", "budget": 8, "cells": [{"temperature": 0.0}]},
    ]}
    text = "\n".join(churn_lines(raw))
    assert "| target alone | 3/3 | — | 0 | 12.3 |" in text
    assert "| DDTree b16 (overlap scheduler) | 1/3 | 2, at top-2 gap ≤ 2.500 | 0 |" in text
    assert "| DFLASH chain (block 8) | 2/3 | — | 1 |" in text
    assert "b8" not in text, "a server without a churn cell has no row"
    assert churn_lines({"servers": raw["servers"][3:]}) == []


def test_quick_cells_are_t0_at_top_k_4_and_the_full_set_keeps_every_cell(real) -> None:
    tree = real.RealServer("ddtree-b16", "ddtree", 16, 1, 0.1)
    target = real.RealServer("target", "target", None, 2, 0.1)
    quick = real.cells_for(tree, quick=True)
    assert [(c["temperature"], c["streams"], c["topk"]) for c in quick] == [(0.0, 1, 4), (0.0, 4, 4)]
    assert all("ddtree_test_path" not in c["cp"] for c in quick)
    assert [(c["temperature"], c["streams"]) for c in real.cells_for(target, quick=True)] == [(0.0, 1), (0.0, 4)]
    full = real.cells_for(tree)
    assert len(full) == 2 * 2 * 2 + 2 and {c.get("path") for c in full} == {None, "host", "graphed"}


def test_a_whole_answer_compares_as_its_own_prefix_with_the_near_tie_flag(real) -> None:
    ref = [{"id": "p0", "output_ids": [5, 6, 7], "top2": [[(-0.1, 5), (-3.0, 1)], [(-0.5, 6), (-0.52, 2)], []]},
           {"id": "p1", "output_ids": [1, 2], "top2": [[(-0.1, 1), (-2.0, 3)], [(-0.1, 2), (-2.0, 4)]]},
           {"id": "p2", "error": "boom"}]
    rows = real.compare(ref, {"p0": [5, 2, 7], "p1": [1, 2]})
    assert rows[0] == {"id": "p0", "tokens": 3, "identical": False, "diverge_at": 1,
                       "top2_gap": pytest.approx(0.02), "near_tie": True}
    assert rows[1] == {"id": "p1", "tokens": 2, "identical": True}
    assert rows[2] == {"id": "p2", "error": "boom"}
    assert real.compare(ref[:1], {"p0": [5, 6, 7, 9]})[0] == {"id": "p0", "tokens": 3, "identical": False,
                                                             "diverge_at": 3}


def test_servers_started_but_not_measured_are_named_with_why() -> None:
    """A table without a server's rows says why: not measured before the deadline, failed, or never up."""
    from bench.render_ddtree_real import unmeasured_lines

    raw = {"servers": [{"name": "small", "cells": [], "up_s": 60.0, "error": None},
                       {"name": "target", "cells": [{"tok_s": 1.0}], "up_s": 90.0, "error": None},
                       {"name": "chain-b8", "cells": [], "up_s": 225.2, "error": None},
                       # the log's tail, the out-of-memory line far past its first 120 characters
                       {"name": "ddtree-b16-overlap", "cells": [], "up_s": None,
                        "error": "exited rc=-9: " + "File model_runner.py, load_model\n" * 20
                        + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB"},
                       {"name": "ddtree-b31", "cells": [], "up_s": None, "error": "exited rc=1: bad server arg"},
                       {"name": "ddtree-b8", "cells": [], "up_s": None, "error": None}]}
    text = "\n".join(unmeasured_lines(raw))
    assert "chain-b8 (up at 225 s, not measured before the deadline)" in text
    assert "ddtree-b16-overlap (failed: CUDA out of memory (too many servers for the GPU at this --mem))" in text
    assert "ddtree-b31 (failed: exited rc=1: bad server arg)" in text
    assert "ddtree-b8 (never came up)" in text
    assert "small" not in text and "target" not in text
    assert unmeasured_lines({"servers": raw["servers"][:2]}) == []


def test_the_server_plan_keeps_its_order_and_can_measure_only_the_overlap_servers(real) -> None:
    default = real.server_plan([16, 8, 31], [16])
    assert [n for n, *_ in default] == ["ddtree-b16", "chain-b8", "ddtree-b16-overlap", "ddtree-b8", "ddtree-b31"]
    assert [ov for *_, ov in default] == [False, False, True, False, False]
    only = real.server_plan([], [8, 16, 31], chain=False)
    assert only == [("ddtree-b8-overlap", "ddtree", 8, True), ("ddtree-b16-overlap", "ddtree", 16, True),
                    ("ddtree-b31-overlap", "ddtree", 31, True)]
    assert [n for n, *_ in real.server_plan([16], [], overlap_chain=True)] == ["ddtree-b16", "chain-b8",
                                                                              "chain-b8-overlap"]


@pytest.mark.parametrize("argv", [["--budgets", ""], ["--budgets", "", "--overlap-budgets", "0"],
                                  ["--budgets", "x"], ["--new", "0"]])
def test_no_ddtree_server_or_a_bad_budget_is_bad_input_before_anything_starts(real, argv, monkeypatch,
                                                                               capsys) -> None:
    monkeypatch.setattr(real, "inflate", lambda: pytest.fail("started work on bad input"))
    monkeypatch.setattr(sys, "argv", ["ddtree_real.py", *argv])
    assert real.main() == 2 and "error: --budgets" in capsys.readouterr().err


def _totals(parts: bool) -> dict:
    gpu = {"draft": 100.0, "verify": 700.0, "prepare": 30.0, "end": 0.0}
    host = {"draft": 130.0, "verify": 20.0, "prepare": 60.0, "end": 1.0}
    if parts:
        gpu.update(lens=50.0, draft_prep=30.0)
        host.update(lens=390.0, draft_prep=110.0)
    return {"steps": 100, "gpu_ms": gpu, "host_ms": host, "gap_ms": 40.0, "gaps": 100}


def test_the_breakdown_keeps_the_draft_column_whole_and_splits_the_hosts_draft_time_where_marked() -> None:
    """A worker that marks the draft stage's parts (lens, draft_prep) has them counted in the draft column (so its
    rows compare with older ones) and shown as the host's split; an older worker's row shows no split."""
    from bench.render_ddtree_real import breakdown_lines

    raw = {"servers": [{"name": f"ddtree-b16-{i}", "kind": "ddtree", "budget": 16, "overlap": parts,
                        "profiles": {"p.json": {"totals": {"kernel/k4/bs1/t0.0-k4-s1": _totals(parts)}}}}
                       for i, parts in enumerate((True, False))]}
    new, old = breakdown_lines(raw)[2:]
    cells = [c.strip() for c in new.strip("|").split("|")]
    assert cells[2] == "1.80" and cells[-3] == "26%" and cells[-2] == "6.30" and cells[-1] == "3.90 / 1.10 / 1.30"
    old_cells = [c.strip() for c in old.strip("|").split("|")]
    assert old_cells[2] == "1.00" and old_cells[-3] == "20%" and old_cells[-2] == "1.30" and old_cells[-1] == "—"


def test_a_sync_twin_follows_its_overlap_server_and_only_an_overlap_budget_may_have_one(real, monkeypatch,
                                                                                       capsys) -> None:
    plan = real.server_plan([], [16, 31], chain=False, overlap_chain=True, sync_budgets=[16])
    assert [n for n, *_ in plan] == ["ddtree-b16-overlap", "ddtree-b16-overlap-sync", "ddtree-b31-overlap",
                                     "chain-b8-overlap"]
    assert all(ov for *_, ov in plan)
    monkeypatch.setattr(real, "inflate", lambda: pytest.fail("started work on bad input"))
    monkeypatch.setattr(sys, "argv", ["ddtree_real.py", "--overlap-budgets", "16", "--overlap-sync-budgets", "31"])
    assert real.main() == 2 and "--overlap-sync-budgets only budgets of --overlap-budgets" in capsys.readouterr().err


def test_the_bench_names_the_workers_switch() -> None:
    from sglang_ddtree.lens import SYNC_ENV

    sys.path.insert(0, str(ROOT / "bench"))
    import ddtree_real

    assert ddtree_real.SYNC_ENV == SYNC_ENV


def test_the_sync_twin_is_labelled_apart_in_every_table() -> None:
    from bench.render_ddtree_real import _label, breakdown_lines

    def server(name: str, env: dict) -> dict:
        return {"name": name, "kind": "ddtree", "budget": 16, "overlap": True, "env": env,
                "profiles": {"p.json": {"totals": {"kernel/k4/bs1/t0.0-k4-s1": _totals(True)}}}}

    cut, synced = server("ddtree-b16-overlap", {}), server("ddtree-b16-overlap-sync",
                                                           {"SGLANG_DDTREE_SYNC_LENS": "1"})
    assert _label(cut, 4) == "DDTree b16 / top-k 4 (overlap scheduler)"
    assert _label(synced, 4) == "DDTree b16 / top-k 4 (overlap scheduler, lengths synced)"
    rows = breakdown_lines({"servers": [cut, synced]})[2:]
    assert rows[0].startswith("| b16/k4 overlap |") and rows[1].startswith("| b16/k4 overlap, synced |")
