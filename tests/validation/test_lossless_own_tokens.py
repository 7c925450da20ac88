"""lossless_t0 reads the candidate's own tokens to find where it parted from the baseline.

Found on the H100 (2026-12-07, DDTree b31/k4 under the overlap scheduler, refused twice): at "... a well-" the
target's three likeliest tokens were tied ('drained', 'structured', 'd', all -2.038 in the baseline's bf16
log-probs); the baseline wrote 'd' 'raining', the candidate 'drained'. The texts agree through "well-drain", so
the first differing byte lies in the baseline's 'raining', where 'rain' (6 nats below, a prefix of what the
candidate wrote) read as the candidate's choice: a correct build refused. The candidate's server lists its own
tokens (top_logprobs), and those name the decision: the first token it chose differently from the baseline.

The class, not the example: any two tokenizations of one text where a later token's shorter alternative is a
prefix of the candidate's longer token. Each case below is also run without the tokens, to show what the text
alone decides."""

from __future__ import annotations

from sglfleet.validation.lossless import (
    Continuation,
    compare_answer,
    compare_forced,
    compare_path,
    control_reanchor,
    own_tokens,
    tokens_after,
)
from tests.validation._lossless_helpers import Recorder, rows, sure

# the baseline: " well" "-" "d" "raining" " soil" ".", with a three-way tie after "-" and 'rain' 6 nats
# below 'raining'
BASE = rows(sure(" a"), sure(" well"), sure("-"),
            ("d", -2.038, [("drained", -2.038), ("structured", -2.038), ("d", -2.038), ("defined", -2.288)]),
            ("raining", -0.006, [("raining", -0.006), ("rain", -6.006), ("ock", -6.631)]),
            sure(" soil"), sure("."), sure("<|im_end|>"))
REF = " a well-draining soil."
GOT = " a well-drained soil."
TIED = [b" a", b" well", b"-", b"drained", b" soil", b"."]  # a correct engine's other tie
FAULT = [b" a", b" well", b"-", b"d", b"rain", b"ed", b" soil", b"."]  # 'rain' where the target was sure


def test_the_candidates_tokens_name_the_tie_it_took() -> None:
    c = compare_answer(GOT, REF, BASE, 0.25, got_tokens=TIED)
    assert c.verdict == "near_tie" and c.token == 3 and abs(c.gap_nats) < 1e-9, c
    assert c.cut_byte == len(b" a well-drained")  # the cut ends with the candidate's own token


def test_the_same_text_written_by_a_faulty_engine_still_fails() -> None:
    c = compare_answer(GOT, REF, BASE, 0.25, got_tokens=FAULT)
    assert c.verdict == "diverged" and c.token == 4 and abs(c.gap_nats - 6.0) < 1e-9, c


def test_without_tokens_the_text_alone_reads_the_later_token() -> None:
    """What the gate decided before: the text cannot tell the two engines apart, and reads the strict one."""
    for tokens in (None, [], [b"something else"], [b" a well-drained soil"]):  # none, or not this text's
        c = compare_answer(GOT, REF, BASE, 0.25, got_tokens=tokens)
        assert c.verdict == "diverged" and c.token == 4, (tokens, c)
    # tokens that spell the text decide, even where they part at once: ' a well-' is not the baseline's ' a'
    c = compare_answer(GOT, REF, BASE, 0.25, got_tokens=[b" a well-", b"drained soil."])
    assert c.verdict == "diverged" and c.token == 0 and "not among the baseline's top" in c.detail


def test_a_token_not_listed_by_the_baseline_is_not_among_its_alternatives() -> None:
    got = " a well-dug soil."
    c = compare_answer(got, REF, BASE, 0.25, got_tokens=[b" a", b" well", b"-", b"dug", b" soil", b"."])
    assert c.verdict == "diverged" and c.token == 3 and "not among the baseline's top" in c.detail


def test_the_end_of_turn_token_past_the_text_and_tokens_after_a_cut() -> None:
    assert own_tokens([*TIED, b"<|im_end|>"], GOT) == TIED
    assert own_tokens(TIED, GOT + "x") is None
    assert tokens_after(TIED, len(b" a well-")) == [b"drained", b" soil", b"."]
    assert tokens_after(TIED, len(b" a we")) is None  # inside a token
    assert tokens_after(TIED, len(GOT.encode())) == []


class Candidate(Recorder):
    """The candidate forced onto the baseline's path: its greedy continuation of a prefix with its own tokens."""

    url = "http://candidate"

    def answer(self, prefix: str) -> Continuation:
        toks = self.table[prefix]
        return Continuation(b"".join(toks).decode(), rows(*((t.decode(), -0.1, []) for t in toks)), "stop")


def test_forced_continuations_are_read_by_their_own_tokens() -> None:
    """The incident's shape: a first near-tie earlier ('The'/'A'), the candidate forced back onto the baseline's
    path, and the continuation takes the three-way tie with its longer token; it is forced again at that tie and
    then writes the baseline's rest."""
    base = [*rows(("A", -0.6, [("A", -0.6), ("The", -0.7)])), *BASE]
    ref = "A" + REF
    correct = Candidate({"A": TIED, "A a well-d": [b"raining", b" soil", b"."]})
    got = compare_forced("p", "The end.", "stop", ref, base, 0.25, correct)
    assert got.verdict == "reanchored" and correct.asked == ["A", "A a well-d"], got
    faulty = Candidate({"A": FAULT, "A a well-d": [b"rain", b"ed", b" soil", b"."]})
    got = compare_forced("p", "The end.", "stop", ref, base, 0.25, faulty)
    assert got.verdict == "diverged" and abs(got.gap_nats - 6.0) < 1e-9 and faulty.asked == ["A"], got


class Target(Recorder):
    """The live target-only server: its greedy continuation of the candidate's own text, with log-probs."""

    def answer(self, prefix: str) -> Continuation:
        text, toks = self.table[prefix]
        return Continuation(text, toks, "stop")


def test_a_live_reanchor_reads_the_candidates_rest_by_its_tokens() -> None:
    """compare_path: after the tie the target-only server continues from the candidate's own text; the
    candidate's rest is then compared by its own tokens too (those past the cut)."""
    target = Target({" a well-drained": (" soil.", rows(sure(" soil"), sure("."), sure("<|im_end|>")))})
    got = compare_path("p", GOT, "stop", REF, BASE, 0.25, target, got_tokens=TIED)
    assert got.verdict == "reanchored" and target.asked == [" a well-drained"], got
    got = compare_path("p", GOT, "stop", REF, BASE, 0.25, target, got_tokens=FAULT)
    assert got.verdict == "diverged" and target.asked == [" a well-drained"], got


def test_on_the_recorded_baseline_the_tie_is_read_from_the_tokens() -> None:
    """Real data (tests/validation/data/lossless-own-tokens-long.json, provenance inside): the target-only server's
    recorded answer and log-probs, and the same model's own greedy continuation from the cut, which took the
    other side of the tie. Read from the text it is 'rain' 6 nats below 'raining' (the refusal); read from its
    tokens it is 'drained', tied with 'd'."""
    import json
    from pathlib import Path

    from sglfleet.validation.lossless import decode_logprobs

    d = json.loads((Path(__file__).parent / "data" / "lossless-own-tokens-long.json").read_text())
    ref_rows = decode_logprobs(d["rest_rows"])
    toks = [bytes.fromhex(t) for t in d["continuation_tokens"]]
    got = b"".join(toks).decode()
    by_text = compare_answer(got, d["rest"], ref_rows, 0.25)
    assert by_text.verdict == "diverged" and by_text.gap_nats is not None and by_text.gap_nats > 5.9, by_text
    assert ref_rows[by_text.token][0] == b"raining"
    by_tokens = compare_answer(got, d["rest"], ref_rows, 0.25, got_tokens=toks)
    assert by_tokens.verdict == "near_tie" and by_tokens.gap_nats is not None and by_tokens.gap_nats < 0.01
    assert ref_rows[by_tokens.token][0] == b"d" and toks[by_tokens.token] == b"drained"


def test_the_re_anchoring_control_reads_the_continuation_by_its_tokens() -> None:
    """The control (the baseline's answer cut at its middle and continued on this server) reads the continuation
    by its own tokens too: the other side of the tie as one token keeps re-anchoring on; 'rain' turns it off."""
    cut = " a well-"  # the first three of the baseline's seven spelled tokens
    assert control_reanchor("p", REF, BASE, Candidate({cut: TIED[3:]}), 0.25) is None
    off = control_reanchor("p", REF, BASE, Candidate({cut: FAULT[3:]}), 0.25)
    assert off is not None and "does not continue a final assistant message faithfully" in off
