"""Real outputs of served models (tests/validation/real_outputs.jsonl) against the SmolLM2 profiles.

The coherent items are the 50 answers of the correct, target-only SGLang server of 2026-12-01; the gate
may fail at most 1 % of them (of 50: none). The garbled items (the mutant server's output and variations
of its damage) must all fail, under the defaults and under every SmolLM2 profile.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sglfleet.textscore.detectors import score_text
from sglfleet.validation.config import DetectorThresholds, load_gate_config

HERE = Path(__file__).resolve().parent
PROFILES = HERE.parents[1] / "src" / "sglfleet" / "validation" / "profiles"
ROWS = [json.loads(line) for line in (HERE / "real_outputs.jsonl").read_text().splitlines()]
SMOLLM2_PROFILES = ["sglang-smollm2.yaml", "embedded.yaml"]
MAX_FALSE_FAIL_SHARE = 0.01


def test_real_outputs_are_current() -> None:
    spec = importlib.util.spec_from_file_location("make_real_outputs", HERE / "make_real_outputs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.rows() == ROWS, "real_outputs.jsonl differs: run python tests/validation/make_real_outputs.py"


def test_real_output_set_shape() -> None:
    ok = [r for r in ROWS if r["label"] == "ok"]
    assert len(ok) == 50 and {r["temperature"] for r in ok} == {0.0, 0.6, 0.8, 1.0}
    assert {r["prompt_class"] for r in ok} == {"poem", "prose", "code", "factual", "list", "table", "arithmetic",
                                               "long"}
    assert len([r for r in ROWS if r["label"] == "bad" and r["class"] != "mutant"]) >= 5


@pytest.mark.parametrize("profile", SMOLLM2_PROFILES)
def test_smollm2_profiles_pass_the_real_answers(profile: str) -> None:
    th = load_gate_config(PROFILES / profile).thresholds
    ok = [r for r in ROWS if r["label"] == "ok"]
    failed = {r["id"]: [f"{f.check}: {f.reason}" for f in score_text(r["text"], th)] for r in ok}
    failed = {k: v for k, v in failed.items() if v}
    assert len(failed) <= int(MAX_FALSE_FAIL_SHARE * len(ok)), failed


@pytest.mark.parametrize("profile", [None, *SMOLLM2_PROFILES])
@pytest.mark.parametrize("item", [r for r in ROWS if r["label"] == "bad"], ids=lambda r: r["id"])
def test_mutant_outputs_fail(item: dict, profile: str | None) -> None:
    th = load_gate_config(PROFILES / profile).thresholds if profile else DetectorThresholds()
    assert score_text(item["text"], th), f"garbled text passed under {profile or 'defaults'}: {item['text']!r}"


HEAD = "In the depths of the ocean, where shadows play,\nA tapestry of life, unending,\nA beautiful sight, to behold,\n"


def _near(text: str) -> bool:
    return "near_repeat" in {f.check for f in score_text(text)}


def test_refrain_is_not_a_near_copy() -> None:
    """A poem's refrain (one line template, 1-2 slots with new words) passes; see detectors._refrain."""
    refrain = "A wonder, that befits a land,\nA wonder, that befits a sea,\n" * 3
    assert not _near(HEAD + refrain)
    tale = ("A tale of love, a tale of devotion,\nA tale of salvation, a tale of redemption,\n"
            "A tale of redemption, a tale of forgiveness,\nA tale of redemption, a tale of salvation,\n")
    assert not _near(HEAD + tale)


def test_refrain_exemption_keeps_engine_near_copies() -> None:
    # the whole answer is the copies: a loop, not a refrain
    assert _near("A wonder, that befits a land,\nA wonder, that befits a sea,\n" * 4)
    # the slot copies a word of its own line (an engine's substitution), not a new word
    assert _near(HEAD + "The old lighthouse worked late on the northern hills to the hills,\n"
                 "The old lighthouse worked late on the northern lighthouse to the hills,\n"
                 "The old lighthouse worked late on the northern late to the hills,\n" * 2)
    # copies that gain and lose words are not a template
    assert _near(HEAD + "A wonder, that befits a land,\nA wonder, that really befits a land,\n"
                 "A wonder, that befits land,\nA wonder, that befits a the land,\n")
    # sentences of a paragraph are not lines of a poem
    assert _near("The story is set in the city of Verona, where the two lovers are brought together by fate. "
                 "The plot is set in the city of Verona, where the two lovers are brought together by fate. "
                 "The story is set in the city of Verona, where the two lovers are brought together by fate.")
