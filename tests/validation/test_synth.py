"""Generated corruption families and coherent-but-tricky families against the text detectors.

Development seeds only (SEEDS). The held-out seed is scored once by bench/gate_heldout.py, never here.
Families that read as plain words (shuffled words, a short soup tail) are the fluency judge's job: the
detectors alone are not required to catch them (test_judge.py covers the combination on the real model).
"""

from __future__ import annotations

import random

import pytest

from validation.detectors import score_text
from validation.synth import COHERENT_FAMILIES, CORRUPTION_FAMILIES, corrupt, generate, prose

SEEDS = (101, 102, 103)
JUDGE_FAMILIES = {"word_shuffle", "soup_tail"}


def test_enough_families() -> None:
    assert len(CORRUPTION_FAMILIES) >= 10
    assert {"code_python", "json", "yaml", "table", "list", "identifiers", "numbers", "non_english", "emoji",
            "chorus", "test_log"} <= set(COHERENT_FAMILIES)


def test_generation_is_seeded() -> None:
    assert generate(5, 2) == generate(5, 2)
    assert generate(5, 2) != generate(6, 2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("family", sorted(COHERENT_FAMILIES))
def test_coherent_family_passes(family: str, seed: int) -> None:
    rng = random.Random(seed * 1000 + sum(map(ord, family)))
    for _ in range(8):
        text = COHERENT_FAMILIES[family](rng)
        assert score_text(text) == [], text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("family", sorted(set(CORRUPTION_FAMILIES) - JUDGE_FAMILIES))
def test_corruption_family_fails(family: str, seed: int) -> None:
    rng = random.Random(seed * 7919 + sum(map(ord, family)))
    for _ in range(8):
        text = corrupt(prose(rng, rng.randint(3, 6)), family, rng)
        assert score_text(text), f"{family} passed: {text!r}"


def test_issue_classes_fail_by_name() -> None:
    """The classes named in issue #12, each caught by its own named check."""
    cases = {
        "char_run": "Salt wind over the dunes carries fine sand into the town every " + "0" * 90,
        "subword_repeat": "Speculative decoding " + "ref" * 20,
        "mojibake": "The moon painted the lake with its silverŠŽ™''Ž€ド丂˜ˆ",
        "word_order": "panInto minutes,Milk for it of eggs, andThenFlour the. whisk a the pinch",
        "near_repeat": "1. Use a food thermometer to check the chicken is safe to eat. 2. Use a food thermometer to "
                       "check that the chicken is safe to eat. 3. Use a food thermometer to check the chicken is "
                       "really safe to eat.",
    }
    for check, text in cases.items():
        assert check in {f.check for f in score_text(text)}, (check, score_text(text))
    assert "near_repeat" in {f.check for f in score_text("Our galaxy " + "galaxy galaxy galaxies " * 6)}


def test_subword_loop_inside_code() -> None:
    """Seen on held-out seed 20261201: a loop right after an opening fence is still a loop."""
    assert "subword_repeat" in {f.check for f in score_text("``` SELECT COUNT(*) as c FROM " + "su" * 30)}
    assert score_text("```python\nassert s == 'abab' * 2  # 'abababab'\n```") == []


def test_legitimate_repetition_passes() -> None:
    table = "| test | result |\n|---|---|\n" + "".join(f"| test_{i} | passed |\n" for i in range(12))
    assert score_text(table) == []
    log = " ".join(f"Test {i} passed." for i in range(1, 30))
    steps = "\n".join(f"{i}. Stir the sauce for one minute and taste it." for i in range(1, 3))
    assert score_text(log) == [] and score_text(steps) == []
