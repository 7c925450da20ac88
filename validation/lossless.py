"""Lossless T=0 comparison against the non-speculative baseline, up to near-ties.

Speculative decoding in bf16 is not bitwise lossless: the verify pass computes the target's logits
in another batch shape than plain decoding, and where the target's two most likely tokens are within
rounding of each other the greedy choice can flip. From there on the two answers are different but
equally valid greedy paths. The serve matrix on real SGLang (docs/ddtree-serve.md) shows both kinds:
correct builds diverge from target-only only at such near-ties (top-2 gap <= 0.25 nats), the broken
build (the seeds' mask bug) diverges where the target was sure of its token.

So the baseline records each T=0 answer's tokens with their log-prob and top alternatives
(`record-baseline`, OpenAI `logprobs` / `top_logprobs`), and an answer that differs is accepted only
when, at its first difference, (a) the baseline's top-2 gap is within `lossless.near_tie_nats` and
(b) the candidate continues with one of the baseline's listed alternatives there. Everything after
that point is another greedy path and is not compared (the rest of the gate still judges it).
Without recorded log-probs (an older baseline file, a server that returns none) the comparison is
exact, and the report says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.client import TokenLogprob
from pipeline.errors import UsageError

# A baseline file's form of TokenLogprob: [token bytes as hex, logprob, [[alt hex, logprob], ...]]
EncodedLogprobs = list[list[Any]]


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

    verdict: str  # identical | near_tie | diverged | missing
    detail: str = ""
    char: int | None = None  # first differing character
    token: int | None = None  # the baseline token holding it
    gap_nats: float | None = None  # the baseline's top-2 gap there

    @property
    def ok(self) -> bool:
        return self.verdict in ("identical", "near_tie")


def _quote(text: str, limit: int = 90) -> str:
    t = text.replace("\n", "⏎")
    return repr(t[:limit] + ("…" if len(t) > limit else ""))


def compare_answer(got: str | None, ref: str, ref_logprobs: list[TokenLogprob] | None,
                   near_tie_nats: float) -> Comparison:
    """Compare a candidate's T=0 answer with the baseline's (see the module docstring)."""
    if got is None:
        return Comparison("missing", "no T=0 answer")
    if got == ref:
        return Comparison("identical")
    i = next((k for k, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), min(len(got), len(ref)))
    where = (f"diverges at char {i}: got {_quote(got[max(0, i - 20):i + 60])} "
             f"baseline {_quote(ref[max(0, i - 20):i + 60])}")
    if not ref_logprobs:
        return Comparison("diverged", where + " (the baseline has no recorded log-probs: exact comparison)", char=i)
    ref_b, got_b = ref.encode(), got.encode()
    byte_i = len(ref[:i].encode())
    joined = b"".join(t for t, _, _ in ref_logprobs)
    if len(joined) <= byte_i or joined[:byte_i + 1] != ref_b[:byte_i + 1]:
        return Comparison("diverged", where + " (the baseline's recorded tokens do not spell its answer up to "
                          "there: exact comparison)", char=i)
    start = 0
    for j, (tok, lp, top) in enumerate(ref_logprobs):  # noqa: B007 - j, tok, lp, top name the token found
        if start + len(tok) > byte_i:
            break
        start += len(tok)
    rest = got_b[start:]
    took = next(((a, alp) for a, alp in sorted(top, key=lambda x: -x[1]) if a and a != tok and rest.startswith(a)),
                None)
    shown = tok.decode(errors="replace")
    if took is None:
        return Comparison("diverged", f"{where} (baseline token {j} {shown!r}: the candidate's token there is "
                          f"not among the baseline's top {len(top)} alternatives)", char=i, token=j)
    gap = lp - took[1]
    tie = (f"baseline token {j} {shown!r} vs the candidate's {took[0].decode(errors='replace')!r}: "
           f"{gap:.3f} nats apart")
    if gap <= near_tie_nats:
        return Comparison("near_tie", f"{where}: a near-tie ({tie})", char=i, token=j, gap_nats=gap)
    return Comparison("diverged", f"{where} ({tie}, above the near-tie limit {near_tie_nats:g})", char=i, token=j,
                      gap_nats=gap)


__all__ = ["Comparison", "EncodedLogprobs", "compare_answer", "decode_logprobs", "encode_logprobs", "read_baseline"]
