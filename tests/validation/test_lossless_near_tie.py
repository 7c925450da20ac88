"""sglfleet.validation.lossless: a T=0 answer that differs from the baseline only from a near-tie on is lossless;
one that differs where the baseline was sure, or with a token the baseline did not list, is not."""

from __future__ import annotations

import pytest

from sglfleet.validation.lossless import compare_answer, decode_logprobs, encode_logprobs


def rows(*toks: tuple[str, float, list[tuple[str, float]]]) -> list:
    return [(t.encode(), lp, [(a.encode(), alp) for a, alp in top]) for t, lp, top in toks]


BASE = rows(("The", -0.1, [("The", -0.1), ("A", -2.5)]),
            (" sea", -0.70, [(" sea", -0.70), (" ocean", -0.80), (" lake", -4.0)]),
            (" is", -0.05, [(" is", -0.05), (" was", -3.2)]),
            (" deep", -0.3, [(" deep", -0.3), (" blue", -1.6)]))
REF = "The sea is deep"


def test_identical() -> None:
    c = compare_answer(REF, REF, BASE, 0.25)
    assert c.ok and c.verdict == "identical"


def test_near_tie_divergence_passes_and_names_the_token() -> None:
    c = compare_answer("The ocean was calm", REF, BASE, 0.25)
    assert c.ok and c.verdict == "near_tie" and c.token == 1
    assert c.gap_nats == pytest.approx(0.10)
    assert "' sea'" in c.detail and "' ocean'" in c.detail


def test_confident_divergence_fails() -> None:
    c = compare_answer("The sea was deep", REF, BASE, 0.25)  # ' was' is 3.15 nats below ' is'
    assert not c.ok and c.verdict == "diverged" and c.token == 2
    assert "above the near-tie limit" in c.detail


def test_token_outside_the_recorded_alternatives_fails() -> None:
    c = compare_answer("The river is deep", REF, BASE, 5.0)
    assert not c.ok and "not among the baseline's top" in c.detail


def test_zero_tolerance_is_exact() -> None:
    assert not compare_answer("The ocean was calm", REF, BASE, 0.0).ok


def test_without_logprobs_the_comparison_is_exact() -> None:
    c = compare_answer("The ocean was calm", REF, None, 0.25)
    assert not c.ok and "exact comparison" in c.detail


def test_recorded_tokens_that_do_not_spell_the_answer_are_not_trusted() -> None:
    c = compare_answer("The ocean was calm", "Tha sea is deep", BASE, 0.25)
    assert not c.ok and "do not spell" in c.detail


def test_missing_answer() -> None:
    assert compare_answer(None, REF, BASE, 0.25).verdict == "missing"


def test_multibyte_tokens_align_on_bytes() -> None:
    """A character split over two byte-level tokens (an emoji) keeps the byte offsets right."""
    wave = "🌊".encode()
    base = [(b"Sea ", -0.1, [(b"Sea ", -0.1)]), (wave[:2], -0.2, [(wave[:2], -0.2)]),
            (wave[2:], -0.01, [(wave[2:], -0.01)]), (b" calm", -0.6, [(b" calm", -0.6), (b" wild", -0.7)])]
    c = compare_answer("Sea 🌊 wild", "Sea 🌊 calm", base, 0.25)
    assert c.ok and c.token == 3


def test_encoding_round_trips() -> None:
    assert decode_logprobs(encode_logprobs(BASE)) == BASE
    with pytest.raises(ValueError, match="malformed"):
        decode_logprobs([["zz", 0.0, []]])


def test_client_reads_token_bytes_not_display_text() -> None:
    """SGLang 0.5.23 (serving_chat._build_token_logprobs_from_raw) sends each token's display text and
    its true bytes: a fragment of a multi-byte character displays as U+FFFD; the bytes are kept."""
    from sglfleet.pipeline.client import _extract_logprobs
    from sglfleet.pipeline.errors import TargetError

    wave = "🌊".encode()
    choice = {"logprobs": {"content": [
        {"token": "\ufffd", "bytes": list(wave[:2]), "logprob": -0.2,
         "top_logprobs": [{"token": "\ufffd", "bytes": list(wave[:2]), "logprob": -0.2},
                          {"token": " sea", "bytes": list(b" sea"), "logprob": -1.9}]},
        {"token": "\ufffd", "bytes": list(wave[2:]), "logprob": -0.01, "top_logprobs": []},
        {"token": " calm", "logprob": -0.5, "top_logprobs": [{"token": " calm", "logprob": -0.5}]}]}}
    got = _extract_logprobs(choice)
    assert got is not None and b"".join(t for t, _, _ in got).decode() == "🌊 calm"
    assert got[0][2][1] == (b" sea", -1.9)
    assert _extract_logprobs({"delta": {"content": "x"}}) is None
    with pytest.raises(TargetError, match="malformed logprobs"):
        _extract_logprobs({"logprobs": {"content": [{"token": "x"}]}})


def test_a_longer_candidate_token_is_found_at_its_own_start() -> None:
    """The baseline wrote ' mix' + ' of', the candidate ' mixture' (a near-tie alternative at ' mix'): the
    texts differ first inside the baseline's next token, but the decision was at ' mix'."""
    base = rows(("Use", -0.1, [("Use", -0.1)]), (" a", -0.1, [(" a", -0.1)]),
                (" mix", -0.70, [(" mix", -0.70), (" mixture", -0.78), (" blend", -2.0)]),
                (" of", -0.05, [(" of", -0.05), (" with", -3.0)]))
    c = compare_answer("Use a mixture of", "Use a mix of", base, 0.25)
    assert c.ok and c.verdict == "near_tie" and c.token == 2 and c.gap_nats == pytest.approx(0.08)
    assert c.cut_byte == len("Use a mixture")
    # a shorter candidate token where the baseline wrote the long one is still decided at that token
    base2 = rows(("Use", -0.1, [("Use", -0.1)]), (" a", -0.1, [(" a", -0.1)]),
                 (" mixture", -0.70, [(" mixture", -0.70), (" mix", -0.8)]), (" of", -0.05, [(" of", -0.05)]))
    c = compare_answer("Use a mix of", "Use a mixture of", base2, 0.25)
    assert c.ok and c.token == 2 and c.cut_byte == len("Use a mix")
    # and a longer token the baseline did not list is a divergence at the token holding the difference
    assert not compare_answer("Use a mixing bowl", "Use a mix of", base, 0.25).ok


# ----------------------------------------------------------------------------- the limit in engine steps
# A bf16 engine (SGLang on the H200): log-prob gaps are multiples of 0.125 nats, seen in float32.
STEP = 0.125


def _grid_base(gap: float) -> list:
    """A baseline whose ' sea' / ' ocean' gap is `gap`, every other listed difference on the 0.125 grid."""
    return rows(("The", -0.125, [("The", -0.125), ("A", -2.625)]),
                (" sea", -0.5, [(" sea", -0.5), (" ocean", -0.5 - gap), (" lake", -4.0)]),
                (" is", -0.0625 * 2, [(" is", -0.125), (" was", -3.25)]),
                (" deep", -0.375, [(" deep", -0.375), (" blue", -1.625)]))


def _rule(**kw):
    from sglfleet.validation.lossless import NearTieRule

    return NearTieRule(nats=0.25, steps=2, step=STEP, **kw)


@pytest.mark.parametrize("gap,ok", [
    (0.25, True),  # exactly on the limit (2 steps)
    (0.2500000596, True),  # the H200's float32 reading of a 2-step gap (issue 30): refused by `gap <= 0.25`
    (0.2499999404, True),  # the same from below
    (0.125, True),  # just under: one step less
    (0.375, False),  # just over: the next gap the engine can produce
    (0.3749999404, False),  # the next step read from below
    (0.25 + STEP / 3 - 1e-4, True),  # inside the margin
    (0.25 + STEP / 3 + 1e-4, False),  # past the margin
])
def test_near_tie_limit_in_grid_steps(gap: float, ok: bool) -> None:
    c = compare_answer("The ocean was calm", REF, _grid_base(gap), _rule())
    assert c.ok is ok, c.detail
    if not ok:
        assert "2 steps of 0.125 nats" in c.detail


def test_the_absolute_limit_is_what_float_rounding_decided() -> None:
    """The old rule in nats: the same true gap of 2 steps passes or fails with its last float bit."""
    assert compare_answer("The ocean was calm", REF, _grid_base(0.2499999404), 0.25).ok
    assert not compare_answer("The ocean was calm", REF, _grid_base(0.2500000596), 0.25).ok


def test_margin_is_off_every_finer_grid() -> None:
    """The compared limit is never a multiple of a power-of-two step down to 1/1024 nats (a position whose
    logits sit in a lower binade has a finer grid): rounding cannot decide there either."""
    for steps in range(0, 9):
        lim = _rule().__class__(nats=0.25, steps=steps, step=STEP).limit
        for e in range(1, 11):
            g = 2.0**-e
            assert abs(lim / g - round(lim / g)) * g > 1e-4, (steps, g)


def test_grid_is_inferred_from_recorded_logprobs() -> None:
    from sglfleet.validation.lossless import infer_logprob_step

    answers = [_grid_base(0.25 + STEP * (i % 5)) for i in range(8)]
    step, why = infer_logprob_step(answers, 0.9)
    assert step == STEP and "recorded differences" in why
    # float32 readings of the same grid (rounded as the baseline file stores them)
    noisy = [[(t, round(lp + 3e-8, 6), [(a, round(alp - 5e-8, 6)) for a, alp in top]) for t, lp, top in r]
             for r in answers]
    assert infer_logprob_step(noisy, 0.9)[0] == STEP
    # an fp32 engine (no grid): none inferred; too few differences: none
    import random

    rnd = random.Random(1)
    cont = [[(b"x", -rnd.random(), [(b"x", -0.1), (b"y", -0.1 - rnd.random() * 3), (b"z", -3.1 - rnd.random())])
             for _ in range(30)]]
    assert infer_logprob_step(cont, 0.9)[0] is None
    assert infer_logprob_step(answers[:1], 0.9)[0] is None


def test_the_real_h200_baseline_grid() -> None:
    """The incident's recorded SGLang baseline (SmolLM2 on the H200, bf16): its grid is 0.125 nats."""

    from bench.history import read_json  # the file left the tree (docs/ size); git history keeps it
    from sglfleet.validation.lossless import decode_logprobs, infer_logprob_step

    doc = read_json("docs/results/incident-gated-baseline-2026-12-02.json")
    answers = [decode_logprobs(r) for r in doc["logprobs"].values()]
    step, _why = infer_logprob_step(answers, 0.9)
    assert step == 0.125


def test_rule_from_config() -> None:
    from sglfleet.validation.config import LosslessConfig
    from sglfleet.validation.lossless import near_tie_rule

    answers = [_grid_base(0.25 + STEP * (i % 5)) for i in range(8)]
    r = near_tie_rule(LosslessConfig(), answers)
    assert (r.steps, r.step) == (2, STEP) and r.allows(0.2500000596) and not r.allows(0.375)
    r = near_tie_rule(LosslessConfig(logprob_step=0.0625), answers)
    assert r.step == 0.0625 and r.allows(0.125) and not r.allows(0.1875)
    r = near_tie_rule(LosslessConfig(near_tie_unit="nats"), answers)
    assert r.step is None and r.limit == 0.25
    r = near_tie_rule(LosslessConfig(), [])  # nothing recorded: the absolute limit, and the report says why
    assert r.step is None and r.limit == 0.25 and "too few" in r.describe()
    r = near_tie_rule(LosslessConfig(near_tie_unit="nats", near_tie_nats=0), answers)
    assert r.exact
    with pytest.raises(ValueError):
        LosslessConfig(near_tie_margin_steps=1.0)
    with pytest.raises(ValueError):
        LosslessConfig(near_tie_unit="bits")
