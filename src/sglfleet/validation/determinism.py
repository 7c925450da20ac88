"""What T=0 determinism means on a batch-variant engine: identical, a numerical near-tie, or a real difference.

An engine that batches requests (llama.cpp's continuous batching, SGLang without
--enable-deterministic-inference) computes a request's logits in whatever batch shape it shares with
others, so the same T=0 request can give other logits in the last bits. Where the model's two most likely
tokens are within rounding of each other, the greedy choice flips, and from there the answer follows another,
equally greedy path. That is the engine's own batch behaviour, not corruption; a broken build differs where
the model was sure of its token.

So the gate asks for each T=0 repeat's token log-probs with their top alternatives (`top_logprobs`), and
`judge_repeats` compares every distinct answer of one prompt with the first one (the suite's T=0 answer when
there is one) with validation/lossless.py's `compare_answer`, in both directions: under the first answer's own
log-probs (is the other's token listed within the tolerance of its top-1 there?) and under the other answer's
own log-probs (the same question the other way round). A difference passes as a near-tie only when every
view that has log-probs says so; a token outside the listed alternatives, or a gap above the tolerance in either
view, is a real difference. Without log-probs on either side only identical answers pass. Nothing after the
first difference is compared: from there the answers are different greedy paths, which no repeat can check.

Each difference is reported with its first differing character, the token index in each answer, both tokens
with their log-probs (each under its own answer's row, and the other's as listed there), and both answers
quoted around the difference (from before it to after it, never cut before it).

Pure: no I/O, no gate types; the gate's determinism checks call `judge_repeats` once per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sglfleet.pipeline.client import TokenLogprob
from sglfleet.validation.lossless import compare_answer, end_tokens_of, token_bytes

QUOTE_BEFORE = 40
QUOTE_AFTER = 60


@dataclass(frozen=True)
class Answer:
    """One T=0 answer of the prompt: where it came from ('suite', 'sequential 2', 'concurrent 3', ...), its
    text, its finish reason and its tokens' log-probs (None when the server returned none)."""

    label: str
    text: str
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class TokenView:
    """One answer's token at the first difference, under that answer's own log-probs."""

    index: int | None  # the token's index in the answer's log-prob rows (None: the rows do not reach it)
    token: str | None
    logprob: float | None
    other_token_logprob: float | None  # the other answer's token there, as listed among this row's alternatives
    verdict: str  # compare_answer's verdict from this view: near_tie | diverged | (no log-probs) unknown
    gap_nats: float | None


@dataclass(frozen=True)
class Difference:
    """How one distinct answer differs from the reference answer."""

    reference: str  # label of the reference answer
    other: str  # label of the first answer with this text
    copies: int  # how many answers have this text
    verdict: str  # near_tie | diverged
    char: int  # first differing character
    ref_view: TokenView
    other_view: TokenView
    ref_quote: str
    other_quote: str
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "other": self.other, "copies": self.copies, "verdict": self.verdict,
                "char": self.char, "ref_token": self.ref_view.__dict__, "other_token": self.other_view.__dict__,
                "ref_quote": self.ref_quote, "other_quote": self.other_quote, "why": self.why}

    @property
    def detail(self) -> str:
        r, o = self.ref_view, self.other_view
        return (f"{self.other} differs from {self.reference} at char {self.char} (token {r.index} of "
                f"{self.reference}, {o.index} of {self.other}): {r.token!r} ({_lp(r.logprob)}) vs {o.token!r} "
                f"({_lp(o.logprob)}); {self.why}; {self.reference}: {self.ref_quote} / {self.other}: "
                f"{self.other_quote}")


@dataclass(frozen=True)
class RepeatsVerdict:
    """One prompt's T=0 repeats: identical, only near-ties, or a real difference (or too few answers)."""

    verdict: str  # identical | near_tie | diverged | too_few
    answers: int
    distinct: int
    tolerance: float
    differences: list[Difference] = field(default_factory=list)
    with_logprobs: int = 0

    @property
    def ok(self) -> bool:
        return self.verdict in ("identical", "near_tie")

    @property
    def message(self) -> str:
        if self.verdict == "too_few":
            return f"only {self.answers} successful T=0 answer(s): nothing to compare"
        if self.verdict == "identical":
            return f"{self.answers} identical T=0 answers"
        head = (f"{self.distinct} different T=0 answers in {self.answers}"
                + (" (all from numerical near-ties, within "
                   f"{self.tolerance:g} nats: the engine's batch-variant numerics)" if self.ok else ""))
        worst = [d for d in self.differences if d.verdict == "diverged"] or self.differences
        return f"{head}: " + "; ".join(d.detail for d in worst[:2])

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "answers": self.answers, "distinct": self.distinct,
                "tolerance_nats": self.tolerance, "with_logprobs": self.with_logprobs,
                "differences": [d.as_dict() for d in self.differences]}


def _lp(x: float | None) -> str:
    return "n/a" if x is None else f"logprob {x:.3f}"


def quote_around(text: str, char: int, before: int = QUOTE_BEFORE, after: int = QUOTE_AFTER) -> str:
    """`text` from `before` characters ahead of `char` to `after` past it, the difference marked with '⟦'."""
    lo, hi = max(0, char - before), min(len(text), char + after)
    s = ("…" if lo > 0 else "") + text[lo:char] + "⟦" + text[char:hi] + ("…" if hi < len(text) else "")
    return repr(s.replace("\n", "⏎"))


def _token_at(rows: list[TokenLogprob], byte_pos: int) -> tuple[int, bytes, float, list[tuple[bytes, float]]] | None:
    start = 0
    for k, (tok, lp, top) in enumerate(rows):
        if start <= byte_pos < start + len(tok) or (byte_pos == start and not tok):
            return k, tok, lp, top
        start += len(tok)
    if rows and byte_pos == start:  # just past the text: the end-of-turn row some servers list last
        return None
    return None


def _view(got: Answer, ref: Answer, char: int, tol: float, ends: frozenset[bytes]) -> TokenView:
    """compare_answer(got vs ref) under ref's own log-probs, and ref's token (and got's, as listed) there."""
    if not ref.logprobs:
        return TokenView(None, None, None, None, "unknown", None)
    stop = ends if got.finish_reason == "stop" else frozenset()
    c = compare_answer(got.text, ref.text, ref.logprobs, tol, stop,
                       got_tokens=token_bytes(got.logprobs))  # got's own tokens
    byte_pos = len(ref.text[:char].encode())
    at = _token_at(ref.logprobs, byte_pos)
    if c.token is not None and c.token < len(ref.logprobs):
        k = c.token
        tok, lp, top = ref.logprobs[k]
    elif at is not None:
        k, tok, lp, top = at
    else:
        return TokenView(None, None, None, None, c.verdict, c.gap_nats)
    other_lp = (lp - c.gap_nats) if c.gap_nats is not None else None
    if other_lp is None:  # diverged without a listed alternative: is got's token listed at all?
        start = sum(len(t) for t, _, _ in ref.logprobs[:k])
        rest = got.text.encode()[start:]
        other_lp = next((alp for a, alp in sorted(top, key=lambda x: -x[1]) if a and a != tok and rest.startswith(a)),
                        None)
    return TokenView(k, tok.decode(errors="replace"), lp, other_lp, c.verdict, c.gap_nats)


def _own_token(a: Answer, char: int) -> tuple[int | None, str | None, float | None]:
    if not a.logprobs:
        return None, None, None
    at = _token_at(a.logprobs, len(a.text[:char].encode()))
    if at is None:
        return None, None, None
    k, tok, lp, _ = at
    return k, tok.decode(errors="replace"), lp


def compare_pair(ref: Answer, other: Answer, tol: float, ends: frozenset[bytes] = frozenset(),
                 copies: int = 1) -> Difference:
    """The first difference of two T=0 answers with different texts, judged from both answers' log-probs."""
    a, b = ref.text, other.text
    char = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    rv = _view(other, ref, char, tol, ends)  # under the reference's log-probs
    ov = _view(ref, other, char, tol, ends)  # under the other's own log-probs
    # each side's own token there, from its own rows (the views name the row the decision was made at)
    rk, rt, rl = _own_token(ref, char)
    ok_, ot, ol = _own_token(other, char)
    rv = TokenView(rv.index if rv.index is not None else rk, rv.token or rt, rv.logprob if rv.logprob is not None
                   else rl, rv.other_token_logprob, rv.verdict, rv.gap_nats)
    ov = TokenView(ov.index if ov.index is not None else ok_, ov.token or ot, ov.logprob if ov.logprob is not None
                   else ol, ov.other_token_logprob, ov.verdict, ov.gap_nats)
    views = [v for v in (rv, ov) if v.verdict != "unknown"]
    if not views:
        verdict, why = "diverged", "no log-probs on either answer: only identical answers pass"
    elif all(v.verdict == "near_tie" for v in views):
        gaps = ", ".join(f"{v.gap_nats:.3f}" for v in views if v.gap_nats is not None)
        verdict, why = "near_tie", (f"a numerical near-tie: the other token is listed within {tol:g} nats of the "
                                    f"top-1 ({gaps} nats, {len(views)} of 2 answers with log-probs)")
    else:
        bad = next(v for v in views if v.verdict != "near_tie")
        side = ref.label if bad is rv else other.label
        if bad.gap_nats is not None:
            why = f"under {side}'s log-probs the other token is {bad.gap_nats:.3f} nats below its top-1 (limit {tol:g})"
        else:
            why = f"under {side}'s log-probs the other token is not among its listed alternatives"
        verdict = "diverged"
    return Difference(ref.label, other.label, copies, verdict, char, rv, ov, quote_around(a, char),
                      quote_around(b, char), f"a real difference: {why}" if verdict == "diverged" else why)


def judge_repeats(answers: list[Answer], near_tie_nats: float) -> RepeatsVerdict:
    """Judge one prompt's T=0 answers (the suite's first, then its sequential and concurrent repeats): the first
    answer is the reference; every other distinct text is compared with it (compare_pair)."""
    n = len(answers)
    with_lp = sum(1 for a in answers if a.logprobs)
    if n < 2:
        return RepeatsVerdict("too_few", n, len({a.text for a in answers}), near_tie_nats, with_logprobs=with_lp)
    groups: dict[str, list[Answer]] = {}
    for a in answers:
        groups.setdefault(a.text, []).append(a)
    if len(groups) == 1:
        return RepeatsVerdict("identical", n, 1, near_tie_nats, with_logprobs=with_lp)
    ends = end_tokens_of([(a.logprobs, a.text) for a in answers if a.logprobs and a.finish_reason == "stop"])
    ref_group = groups[answers[0].text]
    ref = next((a for a in ref_group if a.logprobs), ref_group[0])
    diffs = []
    for text, group in groups.items():
        if text == ref.text:
            continue
        other = next((a for a in group if a.logprobs), group[0])
        diffs.append(compare_pair(ref, other, near_tie_nats, ends, copies=len(group)))
    verdict = "near_tie" if all(d.verdict == "near_tie" for d in diffs) else "diverged"
    return RepeatsVerdict(verdict, n, len(groups), near_tie_nats, diffs, with_lp)


__all__ = ["Answer", "Difference", "RepeatsVerdict", "TokenView", "compare_pair", "judge_repeats", "quote_around"]
