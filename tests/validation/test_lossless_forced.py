"""sglfleet.validation.lossless.compare_forced: the production sequence's re-anchoring (a baseline file, no live
target-only server). At each near-tie the candidate itself is put back on the baseline's recorded path (it
continues from the baseline's text up to and including the baseline's token there) and must write the rest of
the recorded answer, up to further near-ties, each forced again.

The candidate here is a table (prefix -> what its engine writes greedily from there, with log-probs): a correct
engine follows the target's table, a broken one writes something else after some prefix."""

from __future__ import annotations

from sglfleet.validation.lossless import Continuation, compare_forced
from tests.validation._lossless_helpers import Recorder, rows, sure, tie

# the baseline's recorded greedy answer: two near-ties (sea/ocean, deep/wide), then its end of turn
BASE = rows(sure("The"), tie(" sea", " ocean"), sure(" is"), tie(" deep", " wide"), sure("."),
            sure("<|im_end|>"))
REF = "The sea is deep."


class Candidate(Recorder):
    """The candidate's greedy text from a prefix (no log-probs); " ???" where it leaves the table."""

    url = "http://candidate"

    def answer(self, prefix: str) -> Continuation:
        return Continuation(self.table.get(prefix, " ???"), None, "stop")


CORRECT = {"The sea": " is deep.", "The sea is deep": "."}


def test_a_correct_engine_walks_the_baselines_path_from_the_near_tie() -> None:
    c = Candidate(CORRECT)
    got = compare_forced("p", "The ocean was calm.", "stop", REF, BASE, 0.25, c)
    assert got.verdict == "reanchored" and got.reanchors == 1 and c.asked == ["The sea"]
    assert "reproduces the target's whole greedy text" in got.detail


def test_a_second_near_tie_on_the_forced_path_is_forced_again() -> None:
    c = Candidate({"The sea": " is wide.", "The sea is deep": "."})
    got = compare_forced("p", "The ocean was calm.", "stop", REF, BASE, 0.25, c)
    assert got.verdict == "reanchored" and got.reanchors == 2
    assert c.asked == ["The sea", "The sea is deep"]


def test_an_engine_that_leaves_the_path_where_the_target_was_sure_fails() -> None:
    c = Candidate({"The sea": " is!!!!!!"})
    got = compare_forced("p", "The ocean was calm.", "stop", REF, BASE, 0.25, c)
    assert got.verdict == "diverged" and not got.ok and "forced onto the baseline's path 1 time" in got.detail


def test_an_engine_that_does_not_stop_where_the_target_stopped_fails() -> None:
    c = Candidate({"The sea": " is deep. And more"})
    assert not compare_forced("p", "The ocean was calm.", "stop", REF, BASE, 0.25, c).ok


def test_identical_and_sure_divergences_never_ask_the_candidate() -> None:
    c = Candidate(CORRECT)
    assert compare_forced("p", REF, "stop", REF, BASE, 0.25, c).verdict == "identical"
    assert compare_forced("p", "The!!!", "stop", REF, BASE, 0.25, c).verdict == "diverged"
    assert c.asked == []


def test_failures_and_limits_are_reported_not_raised() -> None:
    got = compare_forced("p", "The ocean was calm.", "stop", REF, BASE, 0.25, Candidate(CORRECT, fail=True))
    assert got.verdict == "near_tie" and "forced continuation 1 failed" in got.detail
    got = compare_forced("p", "The ocean was calm.", "stop", REF, BASE, 0.25,
                         Candidate({"The sea": " is wide."}), max_reanchors=1)
    assert got.verdict == "near_tie" and "lossless.max_reanchors 1" in got.detail
    got = compare_forced("p", "The ocean was calm.", "stop", REF, BASE, 0.25, None)
    assert got.verdict == "near_tie" and "not compared" in got.detail
