"""sglfleet.validation.determinism: T=0 repeats of a batch-variant engine are identical, differ only from a numerical
near-tie, or differ for real; on constructed log-prob rows and on real llama.cpp (embedded model) answers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from sglfleet.pipeline.client import OpenAIClient
from sglfleet.pipeline.embedded import EmbeddedServer
from sglfleet.validation.determinism import Answer, judge_repeats, quote_around


def rows(*toks: tuple[str, float, list[tuple[str, float]]]) -> list:
    return [(t.encode(), lp, [(a.encode(), alp) for a, alp in top]) for t, lp, top in toks]


PREFIX = "A long shared beginning of the answer, so that the quote has to reach back. "
A_ROWS = rows((PREFIX, -0.01, [(PREFIX, -0.01)]),
              ("The", -0.1, [("The", -0.1), ("A", -2.5)]),
              (" sea", -0.70, [(" sea", -0.70), (" ocean", -0.80), (" lake", -4.0)]),
              (" is", -0.05, [(" is", -0.05), (" was", -3.2)]),
              (" deep", -0.3, [(" deep", -0.3), (" blue", -1.6)]))
A = PREFIX + "The sea is deep"
# the other answer's own row at the difference: it chose ' ocean', with ' sea' a close second
B_ROWS = rows((PREFIX, -0.01, [(PREFIX, -0.01)]),
              ("The", -0.1, [("The", -0.1), ("A", -2.5)]),
              (" ocean", -0.72, [(" ocean", -0.72), (" sea", -0.76)]),
              (" was", -0.2, [(" was", -0.2)]),
              (" calm", -0.4, [(" calm", -0.4)]))
B = PREFIX + "The ocean was calm"


def test_identical_repeats() -> None:
    v = judge_repeats([Answer("suite", A, A_ROWS), Answer("sequential 1", A, A_ROWS)], 0.25)
    assert v.ok and v.verdict == "identical" and v.distinct == 1


def test_near_tie_in_both_views_passes_and_names_everything() -> None:
    v = judge_repeats([Answer("suite", A, A_ROWS), Answer("concurrent 2", B, B_ROWS),
                       Answer("concurrent 3", B, B_ROWS)], 0.25)
    assert v.ok and v.verdict == "near_tie", v.message
    d = v.differences[0]
    assert d.char == len(PREFIX) + 4 and d.copies == 2
    assert d.ref_view.index == 2 and d.ref_view.token == " sea" and d.ref_view.logprob == pytest.approx(-0.70)
    assert d.ref_view.other_token_logprob == pytest.approx(-0.80)
    assert d.other_view.index == 2 and d.other_view.token == " ocean"
    assert d.other_view.other_token_logprob == pytest.approx(-0.76)
    # quoted around the difference, not cut before it
    assert "sea is deep" in d.ref_quote and "ocean was calm" in d.other_quote
    assert "⟦" in d.ref_quote and "reach back" in d.ref_quote
    assert "' sea'" in v.message and "' ocean'" in v.message and "char" in v.message


def test_sure_under_the_other_answers_own_logprobs_is_a_real_difference() -> None:
    # under A's row ' ocean' is 0.10 below ' sea'; under B's own row ' sea' is 2.3 below: not a tie
    b_sure = rows(*[(t.decode(), lp, [(a.decode(), alp) for a, alp in top]) for t, lp, top in B_ROWS[:2]],
                  (" ocean", -0.1, [(" ocean", -0.1), (" sea", -2.4)]), (" was calm", -0.2, [(" was calm", -0.2)]))
    v = judge_repeats([Answer("suite", A, A_ROWS), Answer("concurrent 1", B, b_sure)], 0.25)
    assert not v.ok and v.verdict == "diverged"
    assert "concurrent 1's log-probs" in v.differences[0].why and "2.300 nats" in v.differences[0].why


def test_token_outside_the_alternatives_is_a_real_difference() -> None:
    other = PREFIX + "The river is deep"
    v = judge_repeats([Answer("suite", A, A_ROWS), Answer("sequential 2", other, None)], 0.25)
    assert not v.ok and "not among its listed alternatives" in v.message
    assert "river is deep" in v.differences[0].other_quote


def test_without_logprobs_only_identical_passes() -> None:
    v = judge_repeats([Answer("suite", A), Answer("concurrent 1", B)], 0.25)
    assert not v.ok and "no log-probs on either answer" in v.message


def test_too_few_answers_never_pass() -> None:
    assert not judge_repeats([Answer("suite", A, A_ROWS)], 0.25).ok
    assert not judge_repeats([], 0.25).ok


def test_quote_keeps_both_sides() -> None:
    q = quote_around("x" * 200 + "DIFF" + "y" * 200, 200)
    assert "⟦DIFF" in q and q.count("x") == 40 and q.count("y") > 0


# ---------------------------------------------------------------------------------------------- real llama.cpp
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_real_repeats_of_the_embedded_model(embedded_target: EmbeddedServer) -> None:
    prompt = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
    with OpenAIClient(embedded_target.url, timeout_s=600, stall_s=300) as c:  # the machine is shared
        def ask(_: int) -> Answer:
            r = c.chat(prompt, max_tokens=64, temperature=0.0, seed=1234, top_logprobs=5)
            return Answer("x", r.text, r.logprobs, r.finish_reason)

        seq = [ask(i) for i in range(2)]
        with ThreadPoolExecutor(3) as pool:
            conc = list(pool.map(ask, range(3)))
    answers = [Answer(f"{k} {i}", a.text, a.logprobs, a.finish_reason)
               for k, group in (("sequential", seq), ("concurrent", conc)) for i, a in enumerate(group)]
    assert all(a.logprobs for a in answers)
    v = judge_repeats(answers, 0.25)
    assert v.ok, v.message  # a correct engine: identical, or differing only at near-ties
    ref = answers[0]
    # a real corruption: the answer with a word swapped where the model was sure of its token
    rows_ = ref.logprobs
    assert rows_ is not None
    k = next(i for i in range(len(rows_) // 3, len(rows_))
             if rows_[i][1] > -0.05 and rows_[i][0].strip() and rows_[i][0].decode(errors="ignore").isascii())
    start = sum(len(t) for t, _, _ in rows_[:k])
    bad = ref.text.encode()[:start].decode() + " banana banana banana"
    v = judge_repeats([ref, Answer("corrupted", bad, None, "stop")], 0.25)
    assert not v.ok and v.differences[0].ref_view.index == k, v.message
    assert v.differences[0].ref_view.logprob == pytest.approx(rows_[k][1])
    assert "banana" in v.differences[0].other_quote
    # a near-tie taken from the real rows: the answer continued with the listed runner-up where it is close
    ties = [(i, alt) for i, (t, lp, top) in enumerate(rows_) for alt, alp in top
            if alt != t and alt and lp - alp <= 0.25 and alt.decode(errors="ignore").isascii()]
    if ties:
        i, alt = ties[0]
        start = sum(len(t) for t, _, _ in rows_[:i])
        other = ref.text.encode()[:start] + alt + b" and so on"
        v = judge_repeats([ref, Answer("tie", other.decode(errors="replace"), None)], 0.25)
        assert v.ok and v.verdict == "near_tie", v.message
