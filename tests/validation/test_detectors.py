"""Detector unit tests and the calibration corpus (false-pass / false-fail must be zero here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglfleet.textscore.detectors import score_text, word_stats
from sglfleet.validation.config import DetectorThresholds

CORPUS = [json.loads(line) for line in Path(__file__).with_name("corpus.jsonl").read_text().splitlines()]


def test_corpus_is_current() -> None:
    """corpus.jsonl is generated from make_corpus.py; both must agree."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_corpus", Path(__file__).with_name("make_corpus.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    expected = [{"id": f"ok-{k}", "label": "ok", "text": t} for k, t in mod.OK.items()]
    expected += [{"id": f"bad-{k}", "label": "bad", "class": c, "text": t} for k, (c, t) in mod.BAD.items()]
    assert expected == CORPUS, "corpus.jsonl differs from make_corpus.py: run python tests/validation/make_corpus.py"


@pytest.mark.parametrize("item", [o for o in CORPUS if o["label"] == "ok"], ids=lambda o: o["id"])
def test_coherent_text_passes(item: dict) -> None:
    assert score_text(item["text"]) == []


@pytest.mark.parametrize("item", [o for o in CORPUS if o["label"] == "bad"], ids=lambda o: o["id"])
def test_garbled_text_fails_with_its_class(item: dict) -> None:
    findings = score_text(item["text"])
    assert findings, "garbled text passed"
    assert item["class"] in {f.check for f in findings}


def test_seed_examples_named() -> None:
    f = score_text("The.r!!!!!!!!!!!!!!!!!!!!!")
    assert [x.check for x in f] == ["char_run"]
    assert "'!'" in f[0].reason and "!!!" in f[0].excerpt


def test_char_run_limits_are_configurable() -> None:
    text = "Wow!!!!!! nice"
    assert score_text(text)  # 6 > default 5
    assert score_text(text, DetectorThresholds(max_symbol_run=6)) == []


def test_loop_limits_are_configurable() -> None:
    text = "Intro. " + "A place of endless mystery, " * 6
    assert any(f.check == "ngram_loop" for f in score_text(text))
    relaxed = DetectorThresholds(loop_min_repeats=12, loop_min_tokens=80)
    assert score_text(text, relaxed) == []


def test_disabled_detector_is_skipped() -> None:
    text = "????????????"
    assert score_text(text)
    assert score_text(text, DetectorThresholds(disabled=["char_run"])) == []


def test_runs_inside_code_fences_are_ignored_but_not_outside() -> None:
    code = "```\n" + "x = '" + "#" * 100 + "'\n```"
    assert score_text("Here:\n" + code) == []
    assert score_text("Here: " + "@" * 30)


def test_glued_pieces_vs_camel_case_identifiers() -> None:
    assert word_stats("call getUserName and setPageTitle now", 200_000).glued == []
    assert word_stats("a poemownersWrite here", 200_000).glued == ["poemownersWrite"]


def test_language_follows_the_text() -> None:
    st = word_stats("Le chat est sur la table et le chien dort dans la maison.", 200_000)
    assert st.lang == "fr" and st.unknown == 0


def test_empty_stops_other_detectors() -> None:
    assert [f.check for f in score_text("  ")] == ["empty"]


def test_collapse_after_coherent_start() -> None:
    head = "The deployment finished and every host reported a healthy server with the new image. " * 3
    tail = "qzv brmf klopt zzrq wexl pomf trunq glabe vrisk mlorp"
    assert "collapse" in {f.check for f in score_text(head + tail)}
