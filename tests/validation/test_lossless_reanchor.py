"""sglfleet.validation.lossless.compare_path: after a near-tie the candidate's other greedy path is checked by
continuing from its own text on the target-only server; the whole answer passes only when every later
difference is again a near-tie of that continuation, and the control refuses a server that does not
continue a final assistant message faithfully.

The target here is a tiny greedy language model written out as a table (prefix -> its greedy rest with
per-token log-probs), so every path is known exactly; the real server's continue_final_message is
exercised on the H200 (docs/incident.md)."""

from __future__ import annotations

import pytest

from sglfleet.validation.lossless import Continuation, compare_path, control_reanchor
from tests.validation._lossless_helpers import Recorder, rows, sure, tie

END = "<|im_end|>"

# The target's greedy answer, and what it writes after each near-tie flip.
BASE = rows(sure("The"), tie(" sea", " ocean"), sure(" is"), sure(" deep"), sure("."))
REF = "The sea is deep."
TARGET = {
    "The ocean": rows(sure(" was"), tie(" calm", " wide"), sure(" today"), sure(".")),
    "The ocean was wide": rows(sure(" and"), sure(" still"), sure(".")),
    "The sea": rows(sure(" is"), sure(" deep"), sure(".")),  # the control: the baseline's own middle
    "The sea is deep.": rows(sure("")),
}


class Target(Recorder):
    """The continuation the gate asks the target-only server for, with a request log."""

    url = "http://base"

    def answer(self, prefix: str) -> Continuation:
        lps = self.table.get(prefix)
        if lps is None:  # a server that ignores the prefix answers afresh
            return Continuation(REF, BASE, "stop")
        # like SGLang, the log-probs of an answer that stopped may list its end-of-turn token; the text has none
        return Continuation(b"".join(t for t, _, _ in lps if t != END.encode()).decode(), lps, "stop")


def test_a_near_tie_then_the_targets_own_text_is_reanchored_to_the_end() -> None:
    t = Target(TARGET)
    c = compare_path("p", "The ocean was calm today.", "stop", REF, BASE, 0.25, t)
    assert c.ok and c.whole_path and c.verdict == "reanchored" and c.reanchors == 1
    assert t.asked == ["The ocean"]  # continued from the candidate's text up to and including its token


def test_two_near_ties_are_both_reanchored() -> None:
    t = Target(TARGET)
    c = compare_path("p", "The ocean was wide and still.", "stop", REF, BASE, 0.25, t)
    assert c.verdict == "reanchored" and c.reanchors == 2
    assert t.asked == ["The ocean", "The ocean was wide"]


def test_a_sure_difference_after_the_near_tie_fails_and_says_where() -> None:
    c = compare_path("p", "The ocean was!!!!!!", "stop", REF, BASE, 0.25, Target(TARGET))
    assert not c.ok and c.verdict == "diverged" and c.reanchors == 1
    assert "after 1 re-anchor" in c.detail and c.char == len("The ocean was")


def test_the_target_stopping_where_the_candidate_goes_on_fails() -> None:
    c = compare_path("p", "The ocean was wide and still. And more", "stop", REF, BASE, 0.25, Target(TARGET))
    assert not c.ok and "ends here" in c.detail


def test_a_candidate_cut_by_its_token_budget_is_a_prefix_of_the_continuation() -> None:
    assert compare_path("p", "The ocean was calm to", "length", REF, BASE, 0.25, Target(TARGET)).whole_path
    # the same text ending by itself (finish 'stop') stopped where the target goes on: not the target's path
    assert not compare_path("p", "The ocean was calm to", "stop", REF, BASE, 0.25, Target(TARGET)).ok


def test_without_a_reanchor_server_the_first_near_tie_passes_and_says_the_rest_is_not_compared() -> None:
    c = compare_path("p", "The ocean was!!!!!!", "stop", REF, BASE, 0.25, None, no_reanchor="no server")
    assert c.ok and c.verdict == "near_tie" and not c.whole_path and "not compared (no server)" in c.detail


def test_the_reanchor_limit_and_a_failing_server_are_reported_not_raised() -> None:
    c = compare_path("p", "The ocean was wide and still.", "stop", REF, BASE, 0.25, Target(TARGET), max_reanchors=1)
    assert c.verdict == "near_tie" and "lossless.max_reanchors 1" in c.detail
    c = compare_path("p", "The ocean was calm today.", "stop", REF, BASE, 0.25, Target(TARGET, fail=True))
    assert c.verdict == "near_tie" and "request 1 failed" in c.detail and "timed out" in c.detail


def test_identical_and_sure_divergences_never_ask_the_server() -> None:
    t = Target(TARGET)
    assert compare_path("p", REF, "stop", REF, BASE, 0.25, t).verdict == "identical"
    assert compare_path("p", "The sea was deep.", "stop", REF, BASE, 0.25, t).verdict == "diverged"
    assert t.asked == []


def test_a_near_tie_inside_a_multibyte_character_moves_the_cut_to_its_end() -> None:
    wave = "🌊".encode()
    star = "★".encode()  # 3 bytes; the near-tie token is its first 2
    base = [(b"Sea ", -0.1, [(b"Sea ", -0.1)]), (wave[:2], -0.6, [(wave[:2], -0.6), (star[:2], -0.62)]),
            (wave[2:], -0.01, [(wave[2:], -0.01)]), (b" calm", -0.01, [(b" calm", -0.01)])]
    t = Target({"Sea ★": rows(sure(" swirl"))})
    c = compare_path("p", "Sea ★ swirl", "stop", "Sea 🌊 calm", base, 0.25, t)
    assert c.verdict == "reanchored" and t.asked == ["Sea ★"]


def test_control_accepts_a_faithful_server_and_refuses_one_that_answers_afresh() -> None:
    assert control_reanchor("p", REF, BASE, Target(TARGET), 0.25) is None
    # a server that ignores continue_final_message writes its whole answer again after the prefix
    bad = control_reanchor("p", REF, BASE, Target({}), 0.25)
    assert bad is not None and "does not continue a final assistant message faithfully" in bad
    assert "failed" in (control_reanchor("p", REF, BASE, Target(TARGET, fail=True), 0.25) or "")


@pytest.mark.parametrize("got", ["The ocean was calm today.", "The ocean was wide and still."])
def test_reanchored_answers_are_ok_and_whole(got: str) -> None:
    c = compare_path("p", got, "stop", REF, BASE, 0.25, Target(TARGET))
    assert c.ok and c.whole_path


# ---------------------------------------------------------------- in the gate
LOOPING = "The ocean" + " is blue. The sea" * 30  # the candidate's T=0 answer: a near-tie, then a loop
CLEAN_REF = "The sea is deep."


def gate_with(table: dict[str, list], ref_text: str = CLEAN_REF) -> tuple[dict, dict, dict]:
    """The gate's T=0 verdict on one looping answer after a near-tie, in oracle mode (a baseline is there)."""
    from sglfleet.textscore.backstop import backstop_findings
    from sglfleet.textscore.detectors import score_text
    from sglfleet.validation.checks import GateContext, LosslessData, run_checks
    from sglfleet.validation.config import GateConfig
    from sglfleet.validation.gate import Gate, Sample

    cfg = GateConfig(judge={"enabled": False}, determinism={"enabled": False}, variation={"enabled": False},
                     temperatures=[0.0], lossless={"reanchor_url": "http://127.0.0.1:9"},
                     quality={"enabled": False}, long_copy={"enabled": False})
    gate = Gate("http://127.0.0.1:9", cfg)
    gate.baseline_logprobs = {"poem": BASE}
    gate._reanchor_fn = lambda: (Target(table), "http://127.0.0.1:9", False)  # the continuation, as above
    s = Sample("poem", 0.0, cfg.seed, "suite", 64, text=LOOPING, finish_reason="length", prompt_tokens=5,
               completion_tokens=64, findings=score_text(LOOPING), backstop=backstop_findings(LOOPING, "length"))
    comps, info = gate._lossless_paths([s], {"poem": ref_text})
    ctx = GateContext(cfg, "sglang", [s], lossless=LosslessData({"poem": ref_text}, "base.json", comps, info,
                                                                 {"poem": BASE}))
    return comps, info, {c.label: c for c in run_checks(ctx)}


LOOP_TOKENS = [sure(" is"), sure(" blue."), sure(" The"), sure(" sea")]


def test_a_loop_the_target_itself_writes_after_the_near_tie_passes_and_the_detectors_only_explain() -> None:
    from sglfleet.validation.checks import Status

    comps, info, res = gate_with({**TARGET, "The ocean": rows(*LOOP_TOKENS * 31)})
    assert comps["poem"].verdict == "reanchored" and info["control"].startswith("poem: the baseline's answer")
    assert res["lossless_t0"].status is Status.PASS
    det = res["detectors@T0"]  # oracle mode at T=0: the loop is listed, it does not decide
    assert det.status is Status.SKIP and det.mode == "oracle" and "ngram_loop" in det.message
    assert res["backstop@T0"].status is Status.PASS
    assert "ngram_loop@T0" not in res


def test_a_loop_the_target_does_not_write_fails_lossless_and_is_explained_by_the_detectors() -> None:
    from sglfleet.validation.checks import Status

    comps, _, res = gate_with({**TARGET, "The ocean": rows(sure(" is"), sure(" blue."), sure(" And"), sure(" x."))})
    assert comps["poem"].verdict == "diverged"
    verdict = res["lossless_t0"]
    assert verdict.status is Status.FAIL and "what the diverging answers hold" in verdict.message
    assert "ngram_loop" in verdict.evidence["explanations"]


def test_the_control_accepts_a_baseline_whose_tokens_end_with_the_end_of_turn_token() -> None:
    """SGLang lists '<|im_end|>' after an answer that stopped (tests/fixtures/sglang-0.5.23/base.json)."""
    with_eos = [*BASE, (b"<|im_end|>", -0.01, [(b"<|im_end|>", -0.01)])]
    assert control_reanchor("p", REF, with_eos, Target(TARGET), 0.25) is None
    assert "do not spell" in (control_reanchor("p", REF + "!", with_eos, Target(TARGET), 0.25) or "")


# ---------------------------------------------------------------- the end of turn
EOT = b"<|im_end|>"


def test_a_candidate_that_stops_at_a_near_tie_with_the_end_of_turn_is_the_targets_own_text() -> None:
    """The baseline went on (' Also ...') where the candidate stopped; the baseline listed its end-of-turn
    token 0.1 nats below: a near-tie, and the candidate's whole text is the target's up to its stop."""
    from sglfleet.validation.lossless import compare_answer

    base = [*BASE, (b" Also", -0.6, [(b" Also", -0.6), (EOT, -0.7)]), *rows(sure(" blue."))]
    ref = REF + " Also blue."
    c = compare_answer(REF, ref, base, 0.25, frozenset({EOT}))
    assert c.ok and c.verdict == "near_tie" and c.ended and c.token == len(BASE)
    t = Target(TARGET)
    whole = compare_path("p", REF, "stop", ref, base, 0.25, t, end_tokens=frozenset({EOT}))
    assert whole.whole_path and t.asked == []  # nothing left to continue
    assert not compare_answer(REF, ref, base, 0.25).ok  # without knowing the end token: a divergence
    assert not compare_path("p", REF, "length", ref, base, 0.25, t, end_tokens=frozenset({EOT})).ok  # cut, no stop
    far = [*BASE, (b" Also", -0.1, [(b" Also", -0.1), (EOT, -3.0)]), *rows(sure(" blue."))]
    assert not compare_answer(REF, ref, far, 0.25, frozenset({EOT})).ok  # the end was 2.9 nats below


def test_a_candidate_that_goes_on_where_the_baseline_stopped_at_a_near_tie_is_reanchored() -> None:
    """The baseline stopped (its log-probs end with the end-of-turn token, SGLang's way) with the candidate's
    ' It' 0.1 nats below: a near-tie, and the candidate's rest is checked on the target-only server."""
    base = [*BASE, (EOT, -0.6, [(EOT, -0.6), (b" It", -0.7)])]
    t = Target({**TARGET, "The sea is deep. It": rows(sure(" is"), sure(" blue."))})
    c = compare_path("p", REF + " It is blue.", "stop", REF, base, 0.25, t, end_tokens=frozenset({EOT}))
    assert c.verdict == "reanchored" and t.asked == ["The sea is deep. It"]
    bad = compare_path("p", REF + " It is!!!!", "stop", REF, base, 0.25, t, end_tokens=frozenset({EOT}))
    assert not bad.ok


def test_end_tokens_are_learned_from_answers_that_stopped() -> None:
    from sglfleet.validation.lossless import end_tokens_of

    assert end_tokens_of([([*BASE, (EOT, -0.01, [(EOT, -0.01)])], REF), (BASE, REF)]) == frozenset({EOT})
    assert end_tokens_of([(BASE, REF)]) == frozenset()


def end_listing_target(gap: float) -> Target:
    """The target stops after "The ocean was wide and still." with " And" `gap` nats behind its end of turn."""
    return Target({
        "The ocean": rows(sure(" was"), tie(" calm", " wide"), sure(" today"), sure(".")),
        "The ocean was wide": rows(sure(" and"), sure(" still"), sure("."), (END, -0.6, [(END, -0.6),
                                                                                   (" And", -0.6 - gap)])),
        "The ocean was wide and still. And": rows(sure(" more"), sure(END)),
    })


def test_the_target_stopping_at_a_near_tie_with_the_candidates_next_token_is_reanchored_past_it() -> None:
    """Seen on the H200 (2026-12-02, DFLASH chain, `code`): the continuation stopped where the candidate went on.
    Where the end of turn and the candidate's token are a near-tie, the candidate's text is continued again."""
    t = end_listing_target(gap=0.1)
    c = compare_path("p", "The ocean was wide and still. And more", "stop", REF, BASE, 0.25, t)
    assert c.verdict == "reanchored" and c.reanchors == 3, c.detail
    assert t.asked[-1] == "The ocean was wide and still. And"


def test_the_target_stopping_far_from_the_candidates_token_fails_and_says_how_far() -> None:
    t = end_listing_target(gap=2.0)
    c = compare_path("p", "The ocean was wide and still. And more", "stop", REF, BASE, 0.25, t)
    assert not c.ok and "ends here" in c.detail and "2.000 nats apart" in c.detail, c.detail
