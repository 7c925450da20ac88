"""Gate depth: answer grading, copy scoring, the shipped quality set, sweep config validation."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sglfleet.flow.sweep import SweepConfig, _embedded_cell_config, load_sweep_config
from sglfleet.pipeline.errors import UsageError
from sglfleet.validation.depth import copy_passage, copy_scores, is_correct, load_quality_set

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("answer", "expected", "ok"), [
    ("42", "42", True), ("The answer is 42.", "42", True), ("12 + 30 = 42", "42", False),
    ("1,200", "1200", True), ("Paris.", "Paris", True), ("It is paris", "Paris", True),
    ("Parisian food", "Paris", False), ("", "7", False), ("seven", "7", False),
    ("carbon dioxide (CO2)", "carbon dioxide", True),
])
def test_is_correct(answer: str, expected: str, ok: bool) -> None:
    assert is_correct(answer, expected) is ok


def test_quality_set_matches_its_generator() -> None:
    quality = REPO / "src" / "sglfleet" / "validation" / "quality"
    spec = importlib.util.spec_from_file_location("mq", quality / "make_quality_set.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    shipped = [json.loads(x) for x in (quality / "quality-v1.jsonl").read_text().splitlines()]
    assert shipped == mod.build()
    for row in shipped:
        if row["kind"] == "arithmetic":
            q = row["question"].split("?")[0].replace("What is ", "")
            a, word, b = q.split()
            value = {"plus": int(a) + int(b), "minus": int(a) - int(b), "times": int(a) * int(b)}[word]
            assert str(value) == row["answer"]


def test_bad_quality_set(tmp_path: Path) -> None:
    p = tmp_path / "q.jsonl"
    p.write_text('{"id": 1, "question": "x"}\n')
    with pytest.raises(UsageError, match=":1: expected"):
        load_quality_set(str(p))


def test_copy_passage_is_deterministic_and_sized() -> None:
    a, b = copy_passage(500, 7), copy_passage(500, 7)
    assert a == b and 500 <= len(a.split()) < 540 and copy_passage(500, 8) != a


def test_copy_scores() -> None:
    p = copy_passage(200, 1)
    assert copy_scores(p, p)["longest_span_fraction"] == 1.0
    words = p.split()
    half = " ".join(words[:100]) + " zzz " + " ".join(words[100:])
    s = copy_scores(p, half)
    assert 0.45 < s["longest_span_fraction"] < 0.55 and s["agreement"] == 1.0
    assert copy_scores(p, "!!!!!!!!")["agreement"] == 0.0


def test_shipped_grids_load_and_expand() -> None:
    g = load_sweep_config(str(REPO / "src" / "sglfleet" / "validation" / "grids" / "embedded-draft.yaml"))
    cells = g.expand()
    assert len(cells) == 6 and cells[0].settings == {"draft_max": 2, "draft_p_min": 0.0}
    e = load_sweep_config(str(REPO / "src" / "sglfleet" / "validation" / "grids" / "sglang-ddtree.example.yaml"))
    budgets = {c.settings["budget"] for c in e.expand()}
    assert 7 in budgets and any(b + 1 != 8 for b in budgets)


def test_grid_errors() -> None:
    with pytest.raises(ValueError, match="needs `axes`"):
        SweepConfig(kind="embedded")
    with pytest.raises(ValueError, match="baseline_url"):
        SweepConfig(kind="endpoints", cells=[{"url": "http://x:1"}])


def test_unknown_cell_setting_is_a_clear_error() -> None:
    with pytest.raises(UsageError, match=r"unknown setting\(s\) \['budget'\]"):
        _embedded_cell_config({"budget": 16}, {"spec_type": "draft"}, 18999)
    with pytest.raises(UsageError, match="invalid cell settings"):
        _embedded_cell_config({"draft_max": 0}, {"spec_type": "draft"}, 18999)
