"""The gate as a registry of checks (validation/checks.py) and the zero-tolerance backstop (textscore/backstop.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglfleet.textscore.backstop import backstop_findings
from sglfleet.textscore.detectors import score_text
from sglfleet.validation.checks import REGISTRY, GateContext, Status, run_checks
from sglfleet.validation.config import GateConfig
from sglfleet.validation.samples import Sample

HERE = Path(__file__).parent


def _cfg(**kw: object) -> GateConfig:
    base: dict[str, object] = {"judge": {"enabled": False}, "quality": {"enabled": False},
                               "long_copy": {"enabled": False}}
    return GateConfig(**{**base, **kw})


def _sample(pid: str, t: float, text: str, purpose: str = "suite", seed: int | None = 1, finish: str = "stop",
            error: str | None = None) -> Sample:
    s = Sample(pid, t, seed, purpose, 64, text=text, finish_reason=finish, prompt_tokens=5,
               completion_tokens=None if error else 12, error=error)
    if not error:
        s.findings = score_text(text)
        s.backstop = backstop_findings(text, finish)
    return s


# ------------------------------------------------------------------------------------------- backstop
@pytest.mark.parametrize(("text", "check"), [
    ("The answer is 4.\ufffd And more.", "invalid_utf8"),
    ("Lone \ud800 surrogate in the text.", "invalid_utf8"),
    ("A bell\x07 in prose.", "control_char"),
    ("C1 \x85 next line control.", "control_char"),
    ("Sure.<|im_end|>\n<|im_start|>assistant\nHere is more.", "special_token"),
    ("The poem ends here.<|endoftext|>Then a new story begins.", "special_token"),
    ("Answer<｜end▁of▁sentence｜>more", "special_token"),
    ("[INST] write a poem [/INST]", "special_token"),
    ("", "empty"),
    ("   \n\t ", "empty"),
])
def test_the_backstop_names_each_class_a_correct_engine_never_emits(text: str, check: str) -> None:
    assert [f.check for f in backstop_findings(text)] == [check]


def test_the_end_of_turn_token_followed_by_text_is_named_as_such() -> None:
    f = backstop_findings("Done.<|im_end|> and then it kept going")[0]
    assert "end-of-turn token" in f.reason and "followed by" in f.reason


def test_a_partial_character_at_the_token_budget_is_not_invalid_but_inside_the_text_it_is() -> None:
    assert backstop_findings("Cut inside a character \ufffd", "length") == []
    assert backstop_findings("Cut inside a character \ufffd", "stop")[0].check == "invalid_utf8"
    assert backstop_findings("Broken \ufffd in the middle, cut at the end", "length")[0].check == "invalid_utf8"


def test_a_models_own_extra_special_tokens_are_configurable() -> None:
    assert backstop_findings("Answer [EOS] more", special_tokens=("[EOS]",))[0].check == "special_token"
    assert backstop_findings("Answer [EOS] more") == []


def test_no_coherent_text_the_project_holds_trips_the_backstop() -> None:
    """Every coherent text of the labeled corpus and the stored real answers (Polish, code, tables, refrains)
    passes: the backstop is for what no correct engine emits, so a single hit here is a wrong rule."""
    texts = [r["text"] for f in ("corpus.jsonl", "real_outputs.jsonl")
             for r in map(json.loads, (HERE / f).read_text().splitlines()) if r.get("label") in ("ok", "coherent")]
    assert len(texts) > 80
    hits = {t[:60]: backstop_findings(t, "length") for t in texts}
    assert not {k: v for k, v in hits.items() if v}


def test_tabs_newlines_and_non_latin_scripts_are_fine() -> None:
    text = "Zażółć gęślą jaźń.\n\tKod:\r\n    x = 1  # コメント — ok ✓"
    assert backstop_findings(text) == []


# ------------------------------------------------------------------------------------------- registry
def test_every_check_is_registered_once_with_its_group() -> None:
    names = [c.name for c in REGISTRY]
    assert len(names) == len(set(names))
    assert {"request_errors", "finish_usage", "backstop", "lossless_t0", "likelihood", "detectors",
            "determinism_sequential", "spec_accept_length", "throughput"} <= set(names)
    assert all(c.group for c in REGISTRY)


def test_a_temperature_whose_requests_all_failed_is_not_run_never_passed() -> None:
    cfg = _cfg(temperatures=[0.0, 0.8], determinism={"enabled": False}, variation={"enabled": False})
    ok = _sample("poem", 0.0, "The sea is calm and deep tonight, the stars above it bright.")
    failed = [_sample("poem", 0.8, "", error="timed out"), _sample("code", 0.8, "", error="HTTP 500")]
    res = {r.label: r for r in run_checks(GateContext(cfg, "llama.cpp", [ok, *failed]))}
    assert res["request_errors"].status is Status.FAIL
    for name in ("backstop@T0.8", "ngram_loop@T0.8", "fluency@T0.8"):
        assert res[name].status is Status.NOT_RUN and "2 request(s) failed" in res[name].message
    assert res["backstop@T0"].status is Status.PASS
    cases = [r.case() for r in res.values()]
    assert all(not c.ok for c in cases if c.not_run)  # a not-run check never counts as passed


def test_zero_answers_never_pass_any_check_that_judges_answers() -> None:
    cfg = _cfg(temperatures=[0.0])
    res = run_checks(GateContext(cfg, "llama.cpp", []))
    judged = [r for r in res if r.name in ("request_errors", "finish_usage", "backstop", "throughput",
                                           "determinism_sequential", "determinism_concurrent",
                                           "variation_distinct", "ngram_loop")]
    assert judged and all(r.status is Status.NOT_RUN for r in judged), [(r.label, r.status) for r in judged]


def test_without_a_baseline_the_detectors_decide_and_every_result_says_it_is_the_weaker_mode() -> None:
    cfg = _cfg(temperatures=[0.0, 0.6], determinism={"enabled": False}, variation={"enabled": False})
    loop = "All work and no play makes Jack a dull boy. " * 20
    samples = [_sample("poem", 0.0, "Waves roll in under a silver moon, and the night is calm."),
               _sample("prose", 0.6, loop)]
    res = {r.label: r for r in run_checks(GateContext(cfg, "llama.cpp", samples))}
    assert res["ngram_loop@T0.6"].status is Status.FAIL and res["ngram_loop@T0.6"].mode == "detectors"
    assert res["likelihood@T0.6"].status is Status.SKIP and "weaker mode" in res["likelihood@T0.6"].message
    assert res["lossless_t0"].status is Status.SKIP  # not speculative, no baseline: nothing to compare


def test_a_speculative_deployment_without_a_baseline_fails_lossless() -> None:
    cfg = _cfg(temperatures=[0.0], spec={"enabled": "on"})
    s = _sample("poem", 0.0, "Waves roll in under a silver moon, and the night is calm.")
    res = {r.label: r for r in run_checks(GateContext(cfg, "sglang", [s], speculative=True))}
    assert res["lossless_t0"].status is Status.FAIL and "no lossless baseline" in res["lossless_t0"].message


def test_the_backstop_fails_an_answer_the_detectors_would_let_through() -> None:
    """Fluent text with a leaked template token: the backstop fails it in either mode."""
    cfg = _cfg(temperatures=[0.0], determinism={"enabled": False}, variation={"enabled": False})
    s = _sample("prose", 0.0, "Paris is the capital of France.<|im_end|>\n<|im_start|>user\nAnd Spain?")
    res = {r.label: r for r in run_checks(GateContext(cfg, "llama.cpp", [s]))}
    assert res["backstop@T0"].status is Status.FAIL and "special_token" in res["backstop@T0"].message


def test_reports_are_built_from_the_typed_results() -> None:
    cfg = _cfg(temperatures=[0.0], determinism={"enabled": False}, variation={"enabled": False})
    s = _sample("poem", 0.0, "Waves roll in under a silver moon, and the night is calm.")
    for r in run_checks(GateContext(cfg, "llama.cpp", [s])):
        c = r.case()
        assert c.name == r.label and c.skipped == (r.status is Status.SKIP)
        assert c.not_run == (r.status is Status.NOT_RUN)
        assert c.ok == (r.status in (Status.PASS, Status.SKIP))


def test_invalid_utf8_fails_at_t0_and_is_listed_not_failed_at_t_above_0() -> None:
    """A byte-level sampler can emit a lone byte at T>0 (measured on real answers): the likelihood judges it."""
    cfg = _cfg(temperatures=[0.0, 0.8], determinism={"enabled": False}, variation={"enabled": False})
    text = "A small café \ufffd by the sea, open late for anyone who wanders past."
    res = {r.label: r for r in run_checks(GateContext(cfg, "llama.cpp", [_sample("poem", 0.0, text),
                                                                           _sample("poem", 0.8, text)]))}
    assert res["backstop@T0"].status is Status.FAIL
    assert res["backstop@T0.8"].status is Status.PASS and "invalid UTF-8" in res["backstop@T0.8"].message
    assert res["backstop@T0.8"].evidence["sampled_invalid_utf8"]


def test_a_control_byte_fails_at_t0_and_is_listed_not_failed_at_t_above_0() -> None:
    """A byte-level vocabulary has one-byte control tokens (SmolLM2's 199 is U+000B): a correct build drew it three
    times in a code answer at T=1 on the H200 (2026-12-05). Zero tolerance at T=0; at T>0 the likelihood judges."""
    cfg = _cfg(temperatures=[0.0, 1.0], determinism={"enabled": False}, variation={"enabled": False})
    text = "assert fibonacci(num) == 2\x0b\n# Test with error handling\nassert fibonacci(num, 0) == 0"
    res = {r.label: r for r in run_checks(GateContext(cfg, "llama.cpp", [_sample("code", 0.0, text),
                                                                           _sample("code", 1.0, text)]))}
    assert res["backstop@T0"].status is Status.FAIL and "control_char" in res["backstop@T0"].message
    assert res["backstop@T1"].status is Status.PASS and "control characters" in res["backstop@T1"].message
    assert res["backstop@T1"].evidence["sampled_invalid_utf8"][0]["check"] == "control_char"
    leak = _sample("code", 1.0, "Done.<|im_end|>\n<|im_start|>user\nmore")  # what no sampler draws still fails at T>0
    res = {r.label: r for r in run_checks(GateContext(cfg, "llama.cpp", [leak]))}
    assert res["backstop@T1"].status is Status.FAIL and "special_token" in res["backstop@T1"].message


def test_stop_strings_fail_an_answer_that_holds_its_stop_string_and_skip_without_any() -> None:
    cfg = _cfg(temperatures=[0.8], determinism={"enabled": False}, variation={"enabled": False})
    ok = _sample("poem", 0.8, "The sea is calm tonight.")
    ok.sampling = {"top_p": 0.95, "top_k": 0, "min_p": 0.0, "stop": ["\n\n"]}
    ran_on = _sample("code", 0.8, "First paragraph ends here.\n\nAnd the engine went on past its stop.")
    ran_on.sampling = dict(ok.sampling)
    plain = _sample("story", 0.8, "A paragraph.\n\nAnother one, no stop string asked.")
    plain.sampling = {"top_p": 0.95, "top_k": 0, "min_p": 0.0}

    def stop_check(samples: list[Sample]) -> object:
        return next(r for r in run_checks(GateContext(cfg, "llama.cpp", samples)) if r.name == "stop_strings")

    failed = stop_check([ok, ran_on, plain])
    assert failed.status is Status.FAIL and "code@T0.8" in failed.message and "'\\n\\n'" in failed.message
    assert failed.evidence["asked"] == 2 and len(failed.evidence["problems"]) == 1
    assert stop_check([ok, plain]).status is Status.PASS
    skipped = stop_check([plain])
    assert skipped.status is Status.SKIP and "no request carried stop strings" in skipped.message


def test_an_answer_asked_with_stop_strings_is_scored_without_an_end_of_turn_token() -> None:
    """finish_reason stop after a stop string is no end-of-turn token the model drew: both sides are scored
    without one (an appended end would be a token no sampler drew)."""
    from sglfleet.validation.scorers import ended_at_end_of_turn as _stopped

    assert _stopped("stop") is True and _stopped("length") is False and _stopped(None) is None
    assert _stopped("stop", {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "stop": ["\n\n"]}) is False
    assert _stopped("stop", {"top_p": 1.0, "top_k": 0, "min_p": 0.0}) is True


def test_the_pooled_per_token_statistics_are_one_verdict_over_the_temperatures() -> None:
    """likelihood_pooled: fails with the pooled test's reason when it refuses, passes when it does not, and is
    skipped, saying why, where no temperature has a per-token test to pool."""
    from sglfleet.validation.likelihood import LikelihoodVerdict
    from sglfleet.validation.tokenlaw import PooledAlphas, pooled_test

    cfg = _cfg(temperatures=[0.6, 0.8], determinism={"enabled": False}, variation={"enabled": False})
    samples = [_sample("poem", t, "The sea is calm and deep tonight, the stars above it bright.") for t in (0.6, 0.8)]

    def verdicts(outside: int) -> dict[float, LikelihoodVerdict]:
        tests = [{"n_candidate": 2600, "outside_candidate": outside, "n_baseline": 5100, "outside_baseline": 2,
                  "serial_pairs": 2600, "serial_z": 0.2} for _ in (0.6, 0.8)]
        pooled = pooled_test(tests, PooledAlphas(outside=2e-4, edge=1e-4, serial=2e-4)).as_dict()
        return {t: LikelihoodVerdict(t, True, 0.005, 0.5, 1, 2, {}, {}, {}, "m", per_token={**tv, "pooled": pooled})
                for t, tv in zip((0.6, 0.8), tests, strict=True)}

    def case(v: dict[float, LikelihoodVerdict], **kw: object) -> object:
        res = run_checks(GateContext(cfg, "sglang", samples, likelihood=v, **kw))  # type: ignore[arg-type]
        return next(r for r in res if r.name == "likelihood_pooled")

    bad = case(verdicts(12))
    assert bad.status is Status.FAIL and "wider than the request's" in bad.message, bad.message
    good = case(verdicts(1))
    assert good.status is Status.PASS and "over 2 T>0 temperatures" in good.message
    off = case({}, likelihood_off="no scorer")
    assert off.status is Status.SKIP and "no per-token test to pool" in off.message
    broken = case({}, likelihood_error="scoring failed")
    assert broken.status is Status.NOT_RUN
