"""Lossless T=0 comparison against the non-speculative baseline, up to near-ties.

Speculative decoding in bf16 is not bitwise lossless: the verify pass computes the target's logits
in another batch shape than plain decoding, and where the target's two most likely tokens are within
rounding of each other the greedy choice can flip. From there on the two answers are different but
equally valid greedy paths. The serve matrix on real SGLang (docs/ddtree-serve.md) shows both kinds:
correct builds diverge from target-only only at such near-ties (top-2 gap <= 0.25 nats), the broken
build (the seeds' mask bug) diverges where the target was sure of its token.

So the baseline records each T=0 answer's tokens with their log-prob and top alternatives
(`record-baseline`, OpenAI `logprobs` / `top_logprobs`), and an answer that differs is accepted only
when, at its first difference, (a) the baseline's top-2 gap is within the near-tie limit and
(b) the candidate continues with one of the baseline's listed alternatives there.

The limit is stated in the engine's own resolution (`NearTieRule`). A bf16 engine's log-probs sit
on a grid: two tokens' log-probs differ by a difference of bf16 logits, a multiple of the logits'
bf16 spacing (0.125 nats for logits in [16, 32)), so a true gap of exactly 2 steps is common and a
limit written as 0.25 nats sits on the grid, where float32 rounding (0.2500000596) decides the
verdict. The rule is `lossless.near_tie_steps` steps of the grid, compared with a margin of
`lossless.near_tie_margin_steps` of a step (1/3 by default: past the limit's grid point by far more
than any rounding, short of the next one, and never on a finer power-of-two grid either, since a
third is no dyadic fraction). The step is `lossless.logprob_step`, or inferred from the baseline's
recorded log-probs (`infer_logprob_step`: the coarsest power-of-two grid that at least
`lossless.grid_min_fraction` of the recorded differences sit on). Without a grid (an fp32 engine, too
few recorded differences) the limit is `lossless.near_tie_nats`, and the report says which applies;
`lossless.near_tie_unit: nats` asks for that absolute limit always (0: exact comparison). Everything after
that point is another greedy path. Without recorded log-probs (an older baseline file, a server that
returns none) the comparison is exact, and the report says so.

Placing. The baseline lists a few alternatives per token (`lossless.top_logprobs`, 5). Where the target's
distribution is flat, more tokens than that lie within the near-tie limit, and a correct build's token at the
first difference may be one the file does not list (the DFLASH chain on an H100, 2026-12-06: ' realm' for
' place', the target's second likeliest token, 0.06 nats below, with five listed tokens 0.125 nats apart). Then
the gate's trusted scorer of the target (`place`: the candidate's own prefill once it reproduced the baseline's
recorded scores, the reference model for the embedded target, a live target-only server) lists the
`lossless.place_top_k` likeliest next tokens after the baseline's text up to that token. Its row must list the
baseline's own token within the near-tie limit of the recorded log-prob (else the scorer's context is not the
baseline's and nothing is placed); the gap between the baseline's token and the candidate's is measured inside
that one row and judged by the same rule. So nothing is excused that the target would not write as a near-tie.

Whose token. The first difference is a byte of text, but the decision is a token, and one text has many
tokenizations. Where the candidate took a longer token at a tie, the texts agree past it and part inside a later
baseline token, whose listed shorter alternative can be a prefix of what the candidate wrote (' well-' then
'drained' against the baseline's 'd' 'raining': the three were tied, and read from the text alone the candidate
chose 'rain', 6 nats below 'raining'; DDTree b31/k4 under the overlap scheduler was refused twice on that reading,
H100, 2026-12-07). So the gate asks each T=0 answer it compares with one listed alternative, which names the
candidate's own tokens, and the decision is the first token the candidate chose differently from the baseline
(the tokens before it are the baseline's, so it starts where the baseline's does). A faulty engine that writes the
same text as 'd' 'rain' 'ed' is still refused at 'rain'. Forced continuations and the live re-anchor's rests are
read by their own tokens the same way; with no tokens (a server that lists none, tokens that do not spell the
text) the decision is inferred from the text, at the latest baseline token one of whose listed alternatives the
candidate wrote: a guess where tokenizations differ, as above.

Re-anchoring (`lossless.reanchor_url`, a live target-only server that continues a final assistant
message: sglang's `continue_final_message`) compares that other path too. The target-only server is
asked to continue, greedily, from the candidate's own text up to and including its token at the
near-tie; the candidate's rest must equal that continuation, again up to near-ties of the
continuation's own log-probs, re-anchoring at each (at most `lossless.max_reanchors`). An answer that
survives is proven to be the target's own greedy text from start to end (`reanchored`), so a loop or
a slip in it is the model's, not the build's (the gate attributes its T=0 detector hits to the model).
Before any of it, a control checks the mechanism on this server: the baseline's own answer, cut at a
token boundary and continued, must give the baseline's own rest; when it does not (a server that
ignores `continue_final_message`, another tokenizer), nothing is re-anchored and the report says why.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglfleet.pipeline.client import TokenLogprob
from sglfleet.pipeline.errors import TargetError, UsageError
from sglfleet.pipeline.reports import Case

if TYPE_CHECKING:
    from sglfleet.validation.config import GateConfig

# A baseline file's form of TokenLogprob: [token bytes as hex, logprob, [[alt hex, logprob], ...]]
EncodedLogprobs = list[list[Any]]

GRID_TOLERANCE = 0.05  # a difference is on a grid when within 5 % of a step of a multiple of it
MIN_GRID_DIFFS = 20  # fewer recorded differences than this: no grid is inferred
STEP_CANDIDATES = tuple(2.0**-e for e in range(-1, 11))  # 2 .. 1/1024 nats, coarsest first


@dataclass(frozen=True)
class NearTieRule:
    """The near-tie limit (module docstring): ``steps`` grid steps of ``step`` nats plus a margin of
    ``margin`` step when the engine's grid is known, else ``nats`` (absolute)."""

    nats: float
    steps: int | None = None
    step: float | None = None
    margin: float = 1 / 3
    source: str = "configured in nats"

    @property
    def limit(self) -> float:
        """The largest gap that is a near-tie, in nats."""
        if self.steps is not None and self.step:
            return (self.steps + self.margin) * self.step
        return self.nats

    def allows(self, gap: float) -> bool:
        return gap <= self.limit

    @property
    def exact(self) -> bool:
        """No difference is ever excused (the absolute limit 0)."""
        return self.limit <= 0

    def describe(self) -> str:
        if self.steps is not None and self.step:
            return (f"{self.steps} steps of {self.step:g} nats ({self.source}), compared at "
                    f"{self.limit:.4g} nats")
        return f"{self.nats:g} nats ({self.source})"


def as_rule(tol: float | NearTieRule) -> NearTieRule:
    """A rule from a rule or an absolute limit in nats."""
    return tol if isinstance(tol, NearTieRule) else NearTieRule(nats=float(tol))


def recorded_differences(rows_by_answer: list[list[TokenLogprob]]) -> list[float]:
    """Every positive log-prob difference between a recorded token and its listed alternatives (under 16
    nats: past that a grid is not what decides)."""
    out = []
    for rows in rows_by_answer:
        for _tok, lp, top in rows:
            vals = sorted({lp, *(alp for _a, alp in top)}, reverse=True)
            out += [vals[0] - v for v in vals[1:] if 0 < vals[0] - v < 16]
    return out


def infer_logprob_step(rows_by_answer: list[list[TokenLogprob]], min_fraction: float) -> tuple[float | None, str]:
    """The engine's log-prob grid from recorded log-probs: the coarsest power of two (2 .. 1/1024 nats) that at
    least `min_fraction` of the recorded differences are a multiple of (within rounding). (None, why) when none
    is: an fp32 engine, or too few differences."""
    diffs = recorded_differences(rows_by_answer)
    if len(diffs) < MIN_GRID_DIFFS:
        return None, f"{len(diffs)} recorded log-prob differences, too few to infer a grid"
    for step in STEP_CANDIDATES:
        on = sum(1 for d in diffs if abs(d / step - round(d / step)) <= GRID_TOLERANCE)
        if on / len(diffs) >= min_fraction:
            return step, f"inferred: {on} of {len(diffs)} recorded differences on it"
    return None, f"no power-of-two grid down to {STEP_CANDIDATES[-1]:g} nats holds {min_fraction:.0%} of " \
        f"{len(diffs)} recorded differences"


def near_tie_rule(cfg: Any, rows_by_answer: list[list[TokenLogprob]]) -> NearTieRule:
    """The rule a gate applies, from its `lossless` config (validation/config.py LosslessConfig) and the
    baseline's recorded log-probs."""
    if cfg.near_tie_unit == "nats":
        return NearTieRule(nats=cfg.near_tie_nats, source="lossless.near_tie_unit nats")
    if cfg.logprob_step is not None:
        return NearTieRule(nats=cfg.near_tie_nats, steps=cfg.near_tie_steps, step=cfg.logprob_step,
                           margin=cfg.near_tie_margin_steps, source="lossless.logprob_step")
    step, why = infer_logprob_step(rows_by_answer, cfg.grid_min_fraction)
    if step is None:
        return NearTieRule(nats=cfg.near_tie_nats, source=f"lossless.near_tie_nats: {why}")
    return NearTieRule(nats=cfg.near_tie_nats, steps=cfg.near_tie_steps, step=step,
                       margin=cfg.near_tie_margin_steps, source=why)


@dataclass(frozen=True)
class Continuation:
    """The target-only server's greedy continuation of a prompt + an assistant prefix."""

    text: str
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None


# (prompt id, assistant prefix) -> the continuation; raises TargetError when the request fails
Continue = Callable[[str, str], Continuation]
# the assistant text before a token (the comparison's own reference text) -> the target's likeliest next tokens
# there, from a scorer of the target model (piece bytes, log p, likeliest first); None: it cannot say
Place = Callable[[str], "list[tuple[bytes, float]] | None"]
# the same for one gate's prompts: (prompt id, assistant text before the token) -> the likeliest next tokens
PlaceAt = Callable[[str, str], "list[tuple[bytes, float]] | None"]


def place_at(place: PlaceAt | None, pid: str, prefix: str = "") -> Place | None:
    """`place` for one prompt, its texts after `prefix` (a continuation compared from the middle of an answer)."""
    if place is None:
        return None
    return lambda before: place(pid, prefix + before)


def read_baseline(path: str, model: str | None, suite: str, max_tokens: int | None) -> dict[str, Any]:
    """A `record-baseline` file, checked once against the target's model (None: not checked), the gate's
    suite and max_tokens; every reader of the file (answers, log-probs, T>0 samples) starts here."""
    try:
        doc = json.loads(Path(path).read_text())
        if not isinstance(doc, dict):
            raise TypeError("not a JSON object")
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"cannot read baseline {path}: {type(exc).__name__}") from None
    if model is not None and doc.get("model") != model:
        raise UsageError(f"baseline {path} was recorded for model {doc.get('model')!r}, target serves {model!r}")
    if Path(doc.get("suite", "")).name != Path(suite).name:
        raise UsageError(f"baseline suite {doc.get('suite')} differs from gate suite {Path(suite).name}")
    if doc.get("max_tokens") != max_tokens:
        raise UsageError(f"baseline recorded with max_tokens={doc.get('max_tokens')}, gate uses {max_tokens}")
    return doc


def encode_logprobs(rows: list[TokenLogprob]) -> EncodedLogprobs:
    return [[tok.hex(), round(lp, 6), [[alt.hex(), round(alp, 6)] for alt, alp in top]] for tok, lp, top in rows]


def decode_logprobs(rows: EncodedLogprobs) -> list[TokenLogprob]:
    try:
        return [(bytes.fromhex(t), float(lp), [(bytes.fromhex(a), float(alp)) for a, alp in top])
                for t, lp, top in rows]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed recorded logprobs: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class Comparison:
    """How one T=0 answer compares with the baseline's."""

    verdict: str  # identical | near_tie | reanchored | diverged | missing
    detail: str = ""
    char: int | None = None  # first differing character
    token: int | None = None  # the baseline token holding it
    gap_nats: float | None = None  # the baseline's top-2 gap there
    cut_byte: int | None = None  # near_tie: the candidate's bytes up to and including its token there
    reanchors: int = 0  # near-ties the candidate's text was re-anchored at
    ended: bool = False  # near_tie: the candidate's token there was the end of turn (nothing follows)
    why: str = ""  # diverged: why the difference is no near-tie (the detail's closing clause)

    @property
    def ok(self) -> bool:
        return self.verdict in ("identical", "near_tie", "reanchored")

    @property
    def whole_path(self) -> bool:
        """The whole answer is proven the target's own greedy text (identical, or re-anchored to its end)."""
        return self.verdict in ("identical", "reanchored")


def _quote(text: str, limit: int = 90) -> str:
    t = text.replace("\n", "⏎")
    return repr(t[:limit] + ("…" if len(t) > limit else ""))


def compare_answer(got: str | None, ref: str, ref_logprobs: list[TokenLogprob] | None,
                   near_tie: float | NearTieRule, end_tokens: frozenset[bytes] = frozenset(),
                   place: Place | None = None, got_tokens: list[bytes] | None = None) -> Comparison:
    """Compare a candidate's T=0 answer with the baseline's (see the module docstring). `end_tokens`: the
    server's end-of-turn token(s) as its log-probs list them ('<|im_end|>'): a candidate that stops where
    the baseline goes on chose one of those, a near-tie when it is listed close to the baseline's token.
    `place`: a scorer of the target model, asked where the candidate's token is not among the baseline's
    recorded alternatives (module docstring, "Placing"). `got_tokens`: the candidate's own tokens as its server
    listed them; where they spell `got`, the decision is the first token the candidate chose differently from
    the baseline (see "Whose token"), else it is inferred from the text."""
    rule = as_rule(near_tie)
    if got is None:
        return Comparison("missing", "no T=0 answer")
    if got == ref:
        return Comparison("identical")
    i = next((k for k, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), min(len(got), len(ref)))
    where = (f"diverges at char {i}: got {_quote(got[max(0, i - 20):i + 60])} "
             f"baseline {_quote(ref[max(0, i - 20):i + 60])}")
    def diverged(why: str, **kw: Any) -> Comparison:
        return Comparison("diverged", f"{where} ({why})", char=i, why=why, **kw)

    if not ref_logprobs:
        return diverged("the baseline has no recorded log-probs: exact comparison")
    ref_b, got_b = ref.encode(), got.encode()
    byte_i = len(ref[:i].encode())
    joined = b"".join(t for t, _, _ in ref_logprobs)
    # the tokens must spell the answer through the first differing byte; where the baseline ended there,
    # through its end, with its end-of-turn token after it
    spelled_to = (joined[:byte_i + 1] == ref_b[:byte_i + 1]) if byte_i < len(ref_b) else (joined[:byte_i] == ref_b)
    if len(joined) <= byte_i or not spelled_to:
        return diverged("the baseline's recorded tokens do not spell its answer up to there: exact comparison")
    starts, start = [], 0
    for tok, _, _ in ref_logprobs:
        if start > byte_i:
            break
        starts.append(start)
        start += len(tok)
    j = len(starts) - 1  # the baseline token holding the first differing byte
    took, k = None, j
    own = _first_own_token(got_tokens, got, ref_logprobs)
    if own is not None:
        # Whose token: the candidate's own tokens name its decision, the first token it chose differently
        # (the tokens before it are the baseline's, so it starts at the same byte); its text can agree with the
        # baseline's for a while past it (' well-' 'drained' against 'd' 'raining': the first differing byte
        # lies in 'raining', where 'rain', 6 nats below, would read as the candidate's choice)
        k, piece = own
        took = next(((a, alp) for a, alp in ref_logprobs[k][2] if a == piece), None)
    else:
        # The candidate's own token can start before that one: where it picked a longer token (' mixture' where
        # the baseline wrote ' mix' + ' of'), the texts agree past the baseline's token and differ only in the
        # next. The decision is at the latest baseline token, from j back over a few, where one of its listed
        # alternatives is what the candidate wrote from that token's start.
        for k in range(j, max(-1, j - 4), -1):
            tok_k, _, top_k = ref_logprobs[k]
            rest = got_b[starts[k]:]
            took = next(((a, alp) for a, alp in sorted(top_k, key=lambda x: -x[1]) if a and a != tok_k
                         and rest.startswith(a) and (k == j or starts[k] + len(a) > byte_i)), None)
            if took is not None:
                break
    ended = False
    stopped = len(got_b) == byte_i < len(ref_b) and starts[j] == byte_i and bool(end_tokens)
    if took is None and stopped:
        # the candidate stopped at a token boundary where the baseline went on: it chose an end-of-turn token
        took = next(((a, alp) for a, alp in ref_logprobs[j][2] if a in end_tokens), None)
        k, ended = j, took is not None
    placed = None
    if took is None and place is not None:
        placed = _place(place, ref_b, got_b, ref_logprobs, starts, k if own else j, byte_i, rule,
                        end_tokens if stopped else frozenset(), piece=own[1] if own else None)
        if placed[0] is not None:
            k, took = placed[0], placed[1]
            ended = stopped and took is not None and took[0] in end_tokens
    if took is None and own is None:
        k = j
    tok, lp, top = ref_logprobs[k]
    j, start = k, starts[k]
    shown = tok.decode(errors="replace")
    if took is None:
        why = placed[2] if placed is not None else ""
        return diverged(f"baseline token {j} {shown!r}: the candidate's token there is not among the baseline's "
                        f"top {len(top)} alternatives{f'; {why}' if why else ''}", token=j)
    gap = lp - took[1]
    tie = (f"baseline token {j} {shown!r} vs the candidate's {took[0].decode(errors='replace')!r}: "
           f"{gap:.3f} nats apart{placed[2] if placed is not None else ''}")
    if rule.allows(gap):
        return Comparison("near_tie", f"{where}: a near-tie ({tie}{', the end of turn' if ended else ''})", char=i,
                          token=j, gap_nats=gap, cut_byte=None if ended else start + len(took[0]), ended=ended)
    return diverged(f"{tie}, above the near-tie limit {rule.describe()}", token=j, gap_nats=gap)


def _place(place: Place, ref_b: bytes, got_b: bytes, rows: list[TokenLogprob], starts: list[int], j: int,
           byte_i: int, rule: NearTieRule, end_tokens: frozenset[bytes] = frozenset(), piece: bytes | None = None
           ) -> tuple[int | None, tuple[bytes, float] | None, str]:
    """The candidate's token placed by a scorer of the target where the baseline listed too few alternatives: at
    the latest baseline token k (j back over a few, as compare_answer looks) whose start the scorer can be asked
    about, the scorer's row there must list the baseline's own token within the near-tie limit of its recorded
    log-prob (else the scorer's context is not the baseline's and nothing is placed); the candidate's token is
    then the longest listed piece it wrote from there, or, where it stopped there (`end_tokens`: the end-of-turn
    token(s) it may have chosen), the end of turn. Its log-prob is returned on the baseline's scale: the
    baseline's recorded log-prob minus the two tokens' gap in the scorer's row (one row, one numeric context).
    (k, (piece, log p), note), or (None, None, why not). `piece`: the candidate's own token at baseline token j
    (its tokens are known): only that row is asked, and only that piece is placed."""
    why = "no scorer row at its start"
    for k in (range(j, max(-1, j - 4), -1) if piece is None else (j,)):
        try:
            before = ref_b[:starts[k]].decode()
        except UnicodeDecodeError:
            continue  # a token that starts inside a character: the scorer is asked about text
        try:
            row = place(before)
        except (TargetError, ValueError) as exc:
            return None, None, f"the scorer could not place it ({type(exc).__name__}: {str(exc)[:120]})"
        if not row:
            continue
        tok, lp, _ = rows[k]
        mine = next((alp for a, alp in row if a == tok), None)
        if mine is None or abs(mine - lp) > rule.limit:
            why = (f"the scorer's row at token {k} does not list the baseline's token within "
                   f"{rule.limit:.3g} nats of its recorded log-prob")
            continue
        rest = got_b[starts[k]:]
        hit = max(((a, alp) for a, alp in row if a and a != tok and rest.startswith(a)
                   and (k == j or starts[k] + len(a) > byte_i) and (piece is None or a == piece)),
                  key=lambda x: len(x[0]), default=None)
        if hit is None and k == j and not rest and end_tokens:
            hit = next(((a, alp) for a, alp in row if a in end_tokens and a != tok), None)
        if hit is None:
            return None, None, f"nor among the scorer's top {len(row)} there"
        return k, (hit[0], lp - (mine - hit[1])), f" (placed by the scorer of the target: top {len(row)})"
    return None, None, why


def _char_cut(data: bytes, cut: int) -> str | None:
    """data[:cut] as text, moved forward to the next character boundary (None past the end)."""
    for end in range(cut, min(len(data), cut + 3) + 1):
        try:
            return data[:end].decode()
        except UnicodeDecodeError:
            continue
    return None


def end_tokens_of(rows_by_text: list[tuple[list[TokenLogprob], str]]) -> frozenset[bytes]:
    """The end-of-turn token(s) a server lists after the answers that stopped (spelled() trimmed them)."""
    return frozenset(rows[-1][0] for rows, text in rows_by_text
                     if rows and (s := spelled(rows, text)) is not None and len(s) == len(rows) - 1)


def compare_path(pid: str, got: str | None, got_finish: str | None, ref: str, ref_logprobs: list[TokenLogprob] | None,
                 near_tie_nats: float | NearTieRule, cont: Continue | None = None, max_reanchors: int = 16,
                 no_reanchor: str = "no lossless.reanchor_url",
                 end_tokens: frozenset[bytes] = frozenset(), place: PlaceAt | None = None,
                 got_tokens: list[bytes] | None = None) -> Comparison:
    """compare_answer, then, at each near-tie, re-anchor on the target-only server (module docstring).

    `cont` None: the first near-tie ends the comparison (`near_tie`, the reason `no_reanchor` in the detail).
    A candidate that stops at a near-tie with the end of turn is the target's own text to its end.
    `got_tokens`: the candidate's own tokens (compare_answer), for its answer and each rest after a re-anchor."""
    stop = end_tokens if got_finish == "stop" else frozenset()
    mine = own_tokens(got_tokens, got) if got is not None else None
    first = compare_answer(got, ref, ref_logprobs, near_tie_nats, stop, place_at(place, pid), mine)
    if first.verdict != "near_tie" or got is None:
        return first
    if first.ended:
        return _replace(first, verdict="reanchored", detail=f"{first.detail}: the whole answer is the target's own "
                        "greedy text, stopping at a near-tie")
    cmp, done, steps, ties = first, 0, 0, [first.gap_nats]
    got_b = got.encode()
    while True:
        assert cmp.cut_byte is not None
        if cont is None:
            return _replace(first, detail=f"{first.detail}; the rest is not compared ({no_reanchor})")
        if steps >= max_reanchors:
            return _replace(first, detail=f"{first.detail}; re-anchored {steps} times, the rest not compared "
                            f"(lossless.max_reanchors {max_reanchors})", reanchors=steps)
        prefix = _char_cut(got_b, done + cmp.cut_byte)
        if prefix is None:
            return _replace(first, detail=f"{first.detail}; the rest is not compared (the answer ends inside a "
                            "character at the near-tie)", reanchors=steps)
        try:
            c = cont(pid, prefix)
        except TargetError as exc:  # a failed re-anchor request is reported, not raised
            return _replace(first, detail=f"{first.detail}; re-anchor request {steps + 1} failed "
                            f"({type(exc).__name__}: {str(exc)[:160]}): the rest is not compared", reanchors=steps)
        steps += 1
        done = len(prefix.encode())
        rest = got[len(prefix):]
        at = f"after {steps} re-anchor{'s' if steps > 1 else ''} (at char {len(prefix)})"
        if rest == c.text or (got_finish == "length" and c.text.startswith(rest)):
            gaps = ", ".join(f"{g:.3f}" for g in ties if g is not None)
            return Comparison("reanchored", f"the whole answer is the target's own greedy text: {steps} near-tie"
                              f"{'s' if steps > 1 else ''} ({gaps} nats), each continued on the target-only server "
                              "to the candidate's end", char=first.char, token=first.token, gap_nats=first.gap_nats,
                              reanchors=steps)
        cmp = compare_answer(rest, c.text, c.logprobs, near_tie_nats,
                             stop | end_tokens_of([(c.logprobs, c.text)]) if c.logprobs and stop else stop,
                             place_at(place, pid, prefix), tokens_after(mine, done))
        if cmp.verdict == "diverged" and rest.startswith(c.text):  # and not at a near-tie with its end of turn
            return Comparison("diverged", f"{at}: the target-only server ends here (finish_reason "
                              f"{c.finish_reason!r}), the candidate goes on: {_quote(rest[len(c.text):])}"
                              f"{f' ({cmp.why})' if cmp.why else ''}",
                              char=len(prefix) + len(c.text), reanchors=steps)
        if cmp.verdict == "near_tie" and cmp.ended:
            return Comparison("reanchored", f"the whole answer is the target's own greedy text: {steps} near-tie"
                              f"{'s' if steps > 1 else ''} re-anchored, then it stops at a near-tie with the end of "
                              "turn", char=first.char, token=first.token, gap_nats=first.gap_nats, reanchors=steps)
        if cmp.verdict == "near_tie":
            ties.append(cmp.gap_nats)
            continue
        return Comparison("diverged", f"{at}: {cmp.detail}", char=len(prefix) + (cmp.char or 0), token=cmp.token,
                          gap_nats=cmp.gap_nats, reanchors=steps)


def compare_forced(pid: str, got: str | None, got_finish: str | None, ref: str, ref_logprobs: list[TokenLogprob] | None,
                   near_tie: float | NearTieRule, cont: Continue | None, max_reanchors: int = 16,
                   end_tokens: frozenset[bytes] = frozenset(), place: PlaceAt | None = None,
                   got_tokens: list[bytes] | None = None) -> Comparison:
    """compare_answer, then, at each near-tie, the candidate is put back on the baseline's path: it continues,
    greedily, from the baseline's own text up to and including the baseline's token there, and its continuation
    must equal the rest of the baseline's recorded answer, up to near-ties of the recorded log-probs, forced
    again at each (at most `max_reanchors`). No live target-only server: the recorded answer is the target's
    greedy path, and the candidate must be able to walk all of it. An answer that survives (`reanchored`) shows
    the candidate's engine reproduces the target's whole greedy text; its own answer past the first near-tie is
    another greedy path, judged by the text detectors. `got_tokens`: the candidate's own tokens of `got`; each
    continuation's own come with it (compare_answer)."""
    stop = end_tokens if got_finish == "stop" else frozenset()
    first = compare_answer(got, ref, ref_logprobs, near_tie, stop, place_at(place, pid), got_tokens)
    if first.verdict != "near_tie" or got is None or ref_logprobs is None:
        return first
    if first.ended:
        return _replace(first, verdict="reanchored", detail=f"{first.detail}: the candidate stopped at a near-tie "
                        "with the end of turn")
    rows = spelled(ref_logprobs, ref) or ref_logprobs
    ref_stopped = len(rows) == len(ref_logprobs) - 1  # the baseline's end-of-turn token was recorded after it
    toks = [t for t, _, _ in rows]
    j, steps, ties = first.token, 0, [first.gap_nats]
    assert j is not None
    while True:
        if cont is None:
            return _replace(first, detail=f"{first.detail}; the rest is not compared (no continuation)")
        if steps >= max_reanchors:
            return _replace(first, detail=f"{first.detail}; forced back onto the baseline's path {steps} times, the "
                            f"rest not compared (lossless.max_reanchors {max_reanchors})", reanchors=steps)
        cut = sum(len(t) for t in toks[:j + 1])
        prefix = _char_cut(b"".join(toks), cut)
        if prefix is None or len(prefix.encode()) != cut:
            return _replace(first, detail=f"{first.detail}; the rest is not compared (the baseline's token at the "
                            "near-tie ends inside a character)", reanchors=steps)
        try:
            c = cont(pid, prefix)
        except TargetError as exc:
            return _replace(first, detail=f"{first.detail}; forced continuation {steps + 1} failed "
                            f"({type(exc).__name__}: {str(exc)[:160]}): the rest is not compared", reanchors=steps)
        steps += 1
        rest = ref[len(prefix):]
        at = f"forced onto the baseline's path {steps} time{'s' if steps > 1 else ''} (at char {len(prefix)})"
        if c.text == rest or (c.text.startswith(rest) and not ref_stopped):  # or the baseline met its budget
            gaps = ", ".join(f"{g:.3f}" for g in ties if g is not None)
            return Comparison("reanchored", f"the candidate reproduces the target's whole greedy text: {steps} "
                              f"near-tie{'s' if steps > 1 else ''} ({gaps} nats), at each the candidate continued "
                              "the baseline's own path to its end", char=first.char, token=first.token,
                              gap_nats=first.gap_nats, reanchors=steps)
        if rest.startswith(c.text) and c.finish_reason == "length":
            return Comparison("reanchored", f"the candidate reproduces the target's greedy text up to its token "
                              f"budget after {steps} forced near-tie(s)", char=first.char, token=first.token,
                              gap_nats=first.gap_nats, reanchors=steps)
        cmp = compare_answer(c.text, rest, rows[j + 1:], near_tie, end_tokens if c.finish_reason == "stop"
                             else frozenset(), place_at(place, pid, prefix),
                             token_bytes(c.logprobs))
        if cmp.verdict == "near_tie" and not cmp.ended and cmp.token is not None:
            ties.append(cmp.gap_nats)
            j = j + 1 + cmp.token
            continue
        if cmp.verdict == "near_tie":
            return Comparison("reanchored", f"{at}: the candidate continues the baseline's path and stops at a "
                              "near-tie with the end of turn", char=first.char, token=first.token,
                              gap_nats=first.gap_nats, reanchors=steps)
        return Comparison("diverged", f"{at}: {cmp.detail}", char=len(prefix) + (cmp.char or 0), token=cmp.token,
                          gap_nats=cmp.gap_nats, reanchors=steps, why=cmp.why)


def _replace(c: Comparison, **kw: Any) -> Comparison:
    return Comparison(**{**c.__dict__, **kw})


def _spelling(tokens: list[bytes], text: str) -> int | None:
    """How many of `tokens` spell `text`: all of them, or all but a last one past its end (SGLang lists the
    end-of-turn token, '<|im_end|>', after an answer that stopped). None when they do not spell it."""
    joined, want = b"".join(tokens), text.encode()
    if joined == want:
        return len(tokens)
    if tokens and joined.startswith(want) and len(joined) - len(want) == len(tokens[-1]):
        return len(tokens) - 1
    return None


def token_bytes(rows: list[TokenLogprob] | None) -> list[bytes] | None:
    """The tokens of log-prob rows (a server's own, as it listed them); None without rows."""
    return [t for t, _, _ in rows] if rows else None


def spelled(rows: list[TokenLogprob], text: str) -> list[TokenLogprob] | None:
    """The recorded tokens that spell `text` (`_spelling`): all of them, or all but the end-of-turn row after
    them. None otherwise."""
    n = _spelling([t for t, _, _ in rows], text)
    return None if n is None else rows[:n]


def own_tokens(tokens: list[bytes] | None, text: str) -> list[bytes] | None:
    """A candidate's tokens as its server listed them, where they spell its text (`_spelling`); None otherwise
    (none listed, or they do not spell it: the text decides)."""
    n = _spelling(tokens, text) if tokens else None
    return None if n is None or tokens is None else list(tokens[:n])


def tokens_after(tokens: list[bytes] | None, nbytes: int) -> list[bytes] | None:
    """The tokens past the first `nbytes` bytes they spell; None where no token boundary falls there."""
    if tokens is None:
        return None
    done = 0
    for i, t in enumerate(tokens):
        if done == nbytes:
            return tokens[i:]
        done += len(t)
    return [] if done == nbytes else None


def _first_own_token(tokens: list[bytes] | None, text: str, rows: list[TokenLogprob]) -> tuple[int, bytes] | None:
    """(i, the candidate's token i) for the first token where the candidate's own tokens (spelling `text`) part
    from the baseline's recorded ones; None where its tokens are unknown or end first (it stopped there)."""
    mine = own_tokens(tokens, text)
    if mine is None:
        return None
    i = 0
    while i < len(mine) and i < len(rows) and mine[i] == rows[i][0]:
        i += 1
    return (i, mine[i]) if i < len(mine) and i < len(rows) else None


def control_reanchor(pid: str, ref: str, ref_logprobs: list[TokenLogprob], cont: Continue,
                     near_tie_nats: float | NearTieRule, place: PlaceAt | None = None) -> str | None:
    """Check re-anchoring itself on this server: the baseline's answer `ref`, cut after about half of its
    tokens and continued, must give its own rest (up to near-ties). None when it does; else the reason."""
    rows = spelled(ref_logprobs, ref)
    if rows is None or len(rows) < 4:
        return f"control {pid}: the baseline's recorded tokens do not spell its answer (or it is too short)"
    ref_logprobs = rows
    toks = [t for t, _, _ in rows]
    joined = b"".join(toks)
    cut = sum(len(t) for t in toks[:len(toks) // 2])
    prefix = _char_cut(joined, cut)
    if prefix is None:
        return f"control {pid}: no character boundary near the cut"
    try:
        c = cont(pid, prefix)
    except TargetError as exc:  # reported as the reason re-anchoring is off
        return f"control {pid}: the continuation request failed ({type(exc).__name__}: {str(exc)[:160]})"
    rest = ref[len(prefix):]
    if c.text.startswith(rest):  # equal, or longer: the baseline's answer ended at its token budget
        return None
    k, acc, n = len(prefix.encode()), 0, None
    for idx, t in enumerate(toks):  # n: the first token after the prefix (None: the cut moved inside one)
        if acc == k:
            n = idx
            break
        acc += len(t)
    cmp = compare_answer(c.text, rest, ref_logprobs[n:] if n is not None else None, near_tie_nats,
                         place=place_at(place, pid, prefix),
                         got_tokens=token_bytes(c.logprobs))
    if cmp.ok:
        return None
    return (f"control {pid}: continuing the baseline's own answer from char {len(prefix)} does not give its rest "
            f"({cmp.detail}): this server does not continue a final assistant message faithfully")


__all__ = ["Comparison", "Continuation", "Continue", "EncodedLogprobs", "NearTieRule", "Place", "PlaceAt", "as_rule",
           "compare_answer", "compare_forced", "compare_path", "control_reanchor", "decode_logprobs", "encode_logprobs",
           "end_tokens_of", "infer_logprob_step", "near_tie_rule", "own_tokens", "place_at", "read_baseline",
           "recorded_differences", "spelled", "token_bytes", "tokens_after"]


# ------------------------------------------------------------------------------------------- the check's case
def lossless_missing_case(cfg: GateConfig, speculative: bool) -> Case:
    """lossless_t0 when there is nothing to compare against: skipped with its reason, waived, or failed.

    A speculative deployment is never promoted without the lossless check unless its config waives it
    explicitly (`lossless.waiver: "<reason>"`); the waiver is shown in every report.
    """
    from sglfleet.validation.config import lossless_requirement

    problem = lossless_requirement(cfg, speculative)
    if problem:
        return Case("lossless_t0", "speculative", False, problem, {"speculative": True})
    if speculative and cfg.lossless.waiver:
        return Case("lossless_t0", "speculative", True, f"WAIVED by config (lossless.waiver): {cfg.lossless.waiver}",
                    {"waiver": {"check": "lossless_t0", "reason": cfg.lossless.waiver}}, skipped=True)
    if not cfg.lossless.enabled:
        return Case("lossless_t0", "speculative", True, "disabled by config (lossless.enabled: false); the deployment "
                    "is not speculative", skipped=True)
    return Case("lossless_t0", "speculative", True, "no baseline (lossless.baseline / --baseline / baseline_url) and "
                "the deployment is not speculative: nothing to compare T=0 answers against", skipped=True)


def lossless_case(ref: dict[str, str], cfg: GateConfig, source: str, comps: dict[str, Comparison],
                  reanchor: dict[str, Any], ref_logprobs: dict[str, list[Any]] | None = None) -> Case:
    """T=0 answers must equal those of the non-speculative deployment (file or live), up to near-ties
    of the baseline where its token log-probs were recorded, each re-anchored on a target-only server
    where one can continue (`comps` and `reanchor` from Gate._lossless_paths; validation/lossless.py)."""
    lps = ref_logprobs or {}
    tol = near_tie_rule(cfg.lossless, list(lps.values()))
    diffs = [f"{pid}: {c.detail}" for pid, c in comps.items() if not c.ok]
    ties = [f"{pid}: {c.detail}" for pid, c in comps.items() if c.verdict in ("near_tie", "reanchored")]
    identical = sum(1 for c in comps.values() if c.verdict == "identical")
    whole = sum(1 for c in comps.values() if c.verdict == "reanchored")
    same = 1 - len(diffs) / max(1, len(ref))
    ok = not diffs if cfg.lossless.require_identical else same >= cfg.lossless.min_identical_fraction
    if not lps:
        basis = "exact comparison (no recorded log-probs)"
    elif tol.exact:
        basis = f"exact comparison (near-tie limit {tol.describe()})"
    else:
        basis = (f"near-ties up to {tol.describe()} from the baseline's log-probs ({len(lps)} of {len(ref)} "
                 "answers recorded with them)")
    ra = reanchor
    if ties and ra.get("url") and not ra.get("off"):
        basis += f"; re-anchored on {ra['url']}"
    elif ties and ra.get("off"):
        basis += f"; not re-anchored: {ra['off']}"
    msg = "; ".join(diffs[:5]) if diffs else (
        f"{identical} of {len(ref)} T=0 answers identical to the baseline, {len(ties)} differ from a near-tie on"
        + (f" ({whole} of them re-anchored to their end: the target's own greedy text)" if ties else "")
        + f" ({source}; {basis})")
    return Case("lossless_t0", "speculative", ok, msg,
                {"identical_fraction": same, "identical": identical, "near_ties": ties, "diffs": diffs,
                 "baseline": source, "basis": basis, "reanchored": whole, "reanchor": ra,
                 "per_prompt": {pid: {"verdict": c.verdict, "char": c.char, "piece": c.token, "gap_nats": c.gap_nats,
                                      "reanchors": c.reanchors} for pid, c in comps.items()}})
