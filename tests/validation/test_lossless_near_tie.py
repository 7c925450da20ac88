"""validation.lossless: a T=0 answer that differs from the baseline only from a near-tie on is lossless;
one that differs where the baseline was sure, or with a token the baseline did not list, is not."""

from __future__ import annotations

import pytest

from validation.lossless import compare_answer, decode_logprobs, encode_logprobs


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
    from pipeline.client import _extract_logprobs
    from pipeline.errors import TargetError

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
