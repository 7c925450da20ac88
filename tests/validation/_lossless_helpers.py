"""Shared by the lossless tests (test_lossless_forced.py, test_lossless_reanchor.py): recorded greedy tokens
written out by hand, and a continuation function with a request log.

A token row is (token bytes, its log-prob, the top alternatives with theirs), as a baseline file records it."""

from __future__ import annotations

from typing import Any

from sglfleet.pipeline.errors import TargetError
from sglfleet.validation.lossless import Continuation

Tok = tuple[str, float, list[tuple[str, float]]]


def rows(*toks: Tok) -> list[Any]:
    """Token rows (bytes) from (text, log-prob, [(alternative, log-prob), ...]) written as text."""
    return [(t.encode(), lp, [(a.encode(), alp) for a, alp in top]) for t, lp, top in toks]


def tie(tok: str, other: str, gap: float = 0.1) -> Tok:
    """A near-tie: `other` `gap` nats below `tok`."""
    return (tok, -0.6, [(tok, -0.6), (other, -0.6 - gap)])


def sure(tok: str) -> Tok:
    """A token the model was sure of (the next alternative 6 nats below)."""
    return (tok, -0.01, [(tok, -0.01), (" zzz", -6.0)])


class Recorder:
    """A continuation function (pid, prefix) -> Continuation as the gate calls it, keeping every prefix it was
    asked in `asked`; with fail=True each request raises TargetError ("URL: request timed out").
    Subclasses answer a prefix from their `table`."""

    url = "http://server"

    def __init__(self, table: dict[str, Any], fail: bool = False) -> None:
        self.table, self.fail = table, fail
        self.asked: list[str] = []

    def __call__(self, pid: str, prefix: str) -> Continuation:
        self.asked.append(prefix)
        if self.fail:
            raise TargetError(f"{self.url}: request timed out")
        return self.answer(prefix)

    def answer(self, prefix: str) -> Continuation:
        raise NotImplementedError
