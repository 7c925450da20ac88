"""lossless_t0 places a candidate's token the baseline did not list (validation/lossless.py, "Placing").

A baseline records each T=0 token with a few alternatives (lossless.top_logprobs, 5). Where the target's
distribution is flat, more tokens than that lie within rounding of each other, and a correct build that picks one
the baseline did not list was refused: the DFLASH chain on the H100 run of 2026-12-06 (fixture below), which wrote
' realm' where the baseline wrote ' place', the target's second likeliest token there. The gate then asks its
trusted scorer of the target for the next tokens at that point and measures the gap there; a token the target was
sure against stays a divergence."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglfleet.pipeline.errors import TargetError
from sglfleet.validation.config import GateConfig, load_gate_config
from sglfleet.validation.lossless import (
    Continuation,
    compare_answer,
    compare_forced,
    decode_logprobs,
    near_tie_rule,
)
from sglfleet.validation.scorers import make_scorer
from sglfleet.validation.suite import load_suite
from tests.validation._lossless_helpers import Recorder, rows, sure

# a flat position: ' sea', ' ocean' listed; the candidate writes ' lake', which the baseline did not list
BASE = rows(("The", -0.1, [("The", -0.1), ("A", -2.5)]),
            (" sea", -2.0, [(" sea", -2.0), (" ocean", -2.0)]),
            (" is", -0.05, [(" is", -0.05), (" was", -3.2)]),
            (" deep", -0.3, [(" deep", -0.3), (" blue", -1.6)]))
REF = "The sea is deep"
CAND = "The lake is deep"


def placer(row: list[tuple[str, float]], asked: list[str] | None = None):
    def place(before: str) -> list[tuple[bytes, float]]:
        if asked is not None:
            asked.append(before)
        return [(a.encode(), lp) for a, lp in row]
    return place


def test_a_token_the_baseline_did_not_list_is_placed_and_a_near_tie_there_passes() -> None:
    asked: list[str] = []
    # the scorer's row runs 0.05 nats off the recorded log-probs: the gap is measured inside its own row
    c = compare_answer(CAND, REF, BASE, 0.25, place=placer([(" sea", -2.05), (" ocean", -2.05), (" lake", -2.15)],
                                                           asked))
    assert c.ok and c.verdict == "near_tie" and c.token == 1
    assert c.gap_nats == pytest.approx(0.10)
    assert "placed by the scorer of the target" in c.detail and "' lake'" in c.detail
    assert asked == ["The"]  # the text before the baseline's token


def test_without_a_scorer_it_stays_a_divergence() -> None:
    c = compare_answer(CAND, REF, BASE, 0.25)
    assert not c.ok and "not among the baseline's top 2 alternatives" in c.detail


@pytest.mark.parametrize(("row", "why"), [
    ([(" sea", -2.0), (" lake", -3.5)], "above the near-tie limit"),          # placed, but the target was sure
    ([(" sea", -2.0), (" ocean", -2.0)], "nor among the scorer's top 2"),     # the scorer does not list it either
    ([(" ocean", -2.0), (" lake", -2.0)], "does not list the baseline's token"),  # not the baseline's context
    ([(" sea", -4.0), (" lake", -4.0)], "does not list the baseline's token within"),  # nor its log-prob there
])
def test_placing_never_excuses_what_the_target_would_not_write(row, why) -> None:
    c = compare_answer(CAND, REF, BASE, 0.25, place=placer(row))
    assert not c.ok and c.verdict == "diverged" and why in c.detail


def test_a_scorer_that_fails_is_reported_not_raised() -> None:
    def place(before: str) -> list[tuple[bytes, float]]:
        raise TargetError("http://scorer: request timed out")
    c = compare_answer(CAND, REF, BASE, 0.25, place=place)
    assert not c.ok and "the scorer could not place it (TargetError" in c.detail


END = frozenset({b"<|im_end|>"})


@pytest.mark.parametrize(("gap", "ok"), [(0.1, True), (1.5, False)])
def test_a_candidate_that_stops_where_the_file_lists_no_end_of_turn_is_placed(gap, ok) -> None:
    """The candidate ends its turn at a flat position where the baseline wrote ' is' and did not list the end of
    turn among its alternatives: the scorer's row says how far the end of turn was."""
    base = rows(sure("The"), sure(" sea"), (" is", -2.0, [(" is", -2.0), (" was", -2.0)]), sure(" deep"))
    row = [(" is", -2.0), (" was", -2.0), ("<|im_end|>", -2.0 - gap)]
    c = compare_answer("The sea", REF, base, 0.25, END, place=placer(row))
    assert c.ok is ok and c.token == 2, c.detail
    if ok:
        assert c.ended and "the end of turn" in c.detail
        assert compare_forced("p", "The sea", "stop", REF, base, 0.25, None, end_tokens=END,
                              place=lambda pid, before: [(a.encode(), lp) for a, lp in row]).verdict == "reanchored"
    # without the end of turn in its row the candidate's stop stays a divergence
    assert not compare_answer("The sea", REF, base, 0.25, END, place=placer(row[:2])).ok


class Candidate(Recorder):
    """The candidate's greedy text from a prefix (no log-probs)."""

    def answer(self, prefix: str) -> Continuation:
        return Continuation(self.table.get(prefix, " ???"), None, "stop")


def test_the_forced_path_places_with_the_whole_text_before_the_token() -> None:
    """After a near-tie the candidate walks the baseline's path; a flat position there is placed too, the scorer
    asked with the answer's text from its start."""
    base = rows(sure("A"), (" cat", -0.6, [(" cat", -0.6), (" dog", -0.7)]), sure(" sat"),
                (" on", -2.0, [(" on", -2.0), (" by", -2.0)]), sure(" mats"))
    ref = "A cat sat on mats"
    cont = Candidate({"A cat": " sat under mats", "A cat sat on": " mats"})
    asked: list[str] = []

    def place_at(pid: str, before: str) -> list[tuple[bytes, float]]:
        asked.append(before)
        return [(b" on", -2.0), (b" by", -2.0), (b" under", -2.1)]
    c = compare_forced("p", "A dog sat", "stop", ref, base, 0.25, cont, place=place_at)
    assert c.verdict == "reanchored" and c.reanchors == 2, c.detail
    assert asked == ["A cat sat"] and cont.asked == ["A cat", "A cat sat on"]


# ------------------------------------------------------------------ the H100 run's false refusal, on the real model
FIX = json.loads((Path(__file__).parent / "fixtures" / "h100-chain-r03-poem.json").read_text())


@pytest.fixture(scope="module")
def reference() -> Iterator:
    s = make_scorer("reference", GateConfig(), model="smollm2-135m-instruct")
    yield s
    s.close()


def _poem():
    cfg = load_gate_config(Path(__file__).parents[2] / "src/sglfleet/validation/profiles/sglang-smollm2.yaml")
    prompt = {p.id: p for p in load_suite(cfg.suite).prompts}["poem"]
    lps = decode_logprobs(FIX["baseline_logprobs"])
    return cfg, prompt, lps, near_tie_rule(cfg.lossless, [lps])


def test_the_chains_refused_answer_is_a_near_tie_under_the_target(reference) -> None:
    cfg, prompt, lps, rule = _poem()
    ref, got = FIX["baseline_answer"], FIX["candidate_answer"]
    before = compare_answer(got, ref, lps, rule)
    assert before.verdict == "diverged" and "not among the baseline's top 5" in before.detail  # what the gate said

    def place(text: str) -> list[tuple[bytes, float]]:
        return reference.next_token_row(prompt.messages(), text, cfg.lossless.place_top_k)
    c = compare_answer(got, ref, lps, rule, place=place)
    assert c.verdict == "near_tie" and c.token == 13, c.detail
    assert "' realm'" in c.detail and c.gap_nats is not None and 0 <= c.gap_nats < rule.limit


@pytest.mark.parametrize("bad", [
    "In the depths beneath the ocean",   # a token the target was sure against (' of' at -0.21)
    "In the depths of the ocean, where shadows play,\nA!!!!!!!!",   # the incident's garbage at the flat position
])
def test_a_wrong_token_stays_refused_when_placed(reference, bad) -> None:
    cfg, prompt, lps, rule = _poem()

    def place(text: str) -> list[tuple[bytes, float]]:
        return reference.next_token_row(prompt.messages(), text, cfg.lossless.place_top_k)
    c = compare_answer(bad, FIX["baseline_answer"], lps, rule, place=place)
    assert c.verdict == "diverged", c.detail
    assert "above the near-tie limit" in c.detail or "nor among the scorer's top" in c.detail


def test_the_reference_row_is_the_models_next_token_law(reference) -> None:
    """next_token_row's log-probs are the model's: likeliest first, the listed tokens' mass at most 1, and the
    baseline's token within the near-tie limit of what the bf16 server recorded there."""
    _cfg, prompt, lps, rule = _poem()
    text = FIX["baseline_answer"]
    cut = sum(len(t) for t, _, _ in lps[:13])
    row = reference.next_token_row(prompt.messages(), text.encode()[:cut].decode(), 64)
    assert len(row) == 64 and sum(math.exp(lp) for _, lp in row) <= 1 + 1e-6
    assert [lp for _, lp in row] == sorted((lp for _, lp in row), reverse=True)
    mine = dict(row)[lps[13][0]]
    assert abs(mine - lps[13][1]) < rule.limit


# ------------------------------------------------------------------ which scorer the gate lets place tokens
def _gate(**lossless):
    from sglfleet.validation.gate import Gate

    cfg = GateConfig(lossless={"baseline": "unused.json", **lossless})
    return Gate("http://127.0.0.1:9", cfg)


def _trust(ok: bool):
    from sglfleet.validation.likelihood import ScorerTrust

    return ScorerTrust(ok, "sglang", 48, 9000, 0.0, 0.02, 0.18, {"p99_abs": 0.25}, "reproduces" if ok else "does not")


def test_the_gate_places_only_with_a_trusted_scorer_of_the_target(reference) -> None:
    from sglfleet.validation.gate import _LikelihoodPlan

    g = _gate()
    prompt = g.suite.prompts[0]
    trusted_plan = _LikelihoodPlan(reference, None, trust={"x": [0.0]})   # the candidate scoring itself
    g.scorer_trust = None
    assert g._placer(trusted_plan)[0] is None and "not trusted" in g._placer(trusted_plan)[1]
    g.scorer_trust = _trust(False)
    assert g._placer(trusted_plan)[0] is None
    g.scorer_trust = _trust(True)
    place, where = g._placer(trusted_plan)
    assert place is not None and where.startswith("reference")
    row = place(prompt.id, "")
    assert row == reference.next_token_row(prompt.messages(), "", g.cfg.lossless.place_top_k) and len(row) == 64
    # a scorer the gate needs no trust for (the reference model, a live target-only server)
    assert g._placer(_LikelihoodPlan(reference, None))[0] is not None
    g.likelihood_error = "scoring failed on sglang: HTTP 500"
    assert "the scorer failed" in g._placer(_LikelihoodPlan(reference, None))[1]
    g.likelihood_off = "no T>0 temperature configured"
    assert "no T>0 temperature" in g._placer(None)[1]
    assert "place_top_k is 0" in _gate(place_top_k=0)._placer(_LikelihoodPlan(reference, None))[1]


def test_the_control_places_too() -> None:
    """The re-anchoring control continues the baseline's own answer from its middle; a server that takes an unlisted
    near-tie on the way is faithful, and without placing the control would switch re-anchoring off."""
    from sglfleet.validation.lossless import control_reanchor

    base = rows(sure("A"), sure(" cat"), sure(" sat"), (" on", -2.0, [(" on", -2.0), (" by", -2.0)]), sure(" mats"))
    server = Candidate({"A cat": " sat under mats"})
    assert "does not continue" in (control_reanchor("p", "A cat sat on mats", base, server, 0.25) or "")
    asked: list[str] = []

    def place(pid: str, before: str) -> list[tuple[bytes, float]]:
        asked.append(before)
        return [(b" on", -2.0), (b" by", -2.0), (b" under", -2.1)]
    assert control_reanchor("p", "A cat sat on mats", base, server, 0.25, place) is None
    assert asked == ["A cat sat"]
    # a server that writes what the target would not is still caught
    wrong = Candidate({"A cat": " sat zzz mats"})
    assert control_reanchor("p", "A cat sat on mats", base, wrong, 0.25, place) is not None
