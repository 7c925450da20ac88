"""The zero-tolerance backstop: what a correct inference engine never emits, whatever the model and temperature.

The gate's verdicts come from the target itself (lossless T=0 against the target-only server, the target's
own likelihood at T>0); the text detectors explain what kind of garbage a failing answer holds. This module
is the exception: four classes that no correct engine produces at T=0, so one occurrence fails the answer, with
or without a baseline. At T>0 a sampler over a byte-level vocabulary can draw a one-byte token by itself (a lone
byte of a character, a control byte): the gate then lists those two classes and lets the target's likelihood
judge (validation/checks.py); the other two fail at every temperature:

- ``invalid_utf8``  U+FFFD or a lone surrogate: bytes that are no UTF-8 (a correct detokenizer holds back a
                    partial character; only an answer cut at max_tokens may end inside one);
- ``control_char``  C0 controls other than tab / newline / carriage return, DEL, C1 controls;
- ``special_token`` a special token of a chat template in the text (``<|im_start|>assistant``,
                    ``<|endoftext|>`` followed by more text): the engine stopped too late or detokenized
                    control tokens; the model's own control tokens are read from its tokenizer where the
                    gate can (the embedded GGUF), the common template families are always known;
- ``empty``         an empty or whitespace-only answer.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from sglfleet.textscore.detectors import Finding

BACKSTOP_CHECKS = ("invalid_utf8", "control_char", "special_token", "empty")

# Template families whose control tokens are unambiguous in text: <|name|> (ChatML, Llama 3, Phi, Kimi),
# <｜name｜> (DeepSeek's full-width bars), Gemma's turn markers and Llama 2 / Mistral's instruction brackets.
_FAMILY = re.compile(r"<\|[A-Za-z0-9_.:/ -]{1,48}\|>|<｜[^｜<>\n]{1,48}｜>|<(?:start|end)_of_turn>|\[/?INST\]")
# Tokens that end a turn: after one of these nothing may follow.
_END_HINT = re.compile(r"end|eot|eos|im_end|endoftext|stop", re.I)
_ALLOWED_CONTROLS = {"\t", "\n", "\r"}


@dataclass(frozen=True)
class Backstop:
    """The backstop for one model: the template families plus that model's own control tokens."""

    special_tokens: tuple[str, ...] = ()

    def findings(self, text: str, finish_reason: str | None = None) -> list[Finding]:
        return backstop_findings(text, finish_reason, self.special_tokens)


def backstop_findings(text: str, finish_reason: str | None = None,
                      special_tokens: Iterable[str] = ()) -> list[Finding]:
    """Every backstop finding in one answer (empty list: nothing a correct engine never emits)."""
    out: list[Finding] = []
    if not text.strip():
        return [Finding("empty", "empty answer" if not text else f"whitespace-only answer ({len(text)} chars)")]
    bad = _invalid_positions(text, finish_reason)
    if bad:
        out.append(Finding("invalid_utf8", f"{len(bad)} replacement character(s) / invalid UTF-8 (first at char "
                           f"{bad[0]})", _around(text, bad[0])))
    ctrl = [i for i, ch in enumerate(text) if _is_control(ch)]
    if ctrl:
        names = sorted({f"U+{ord(text[i]):04X}" for i in ctrl})
        out.append(Finding("control_char", f"{len(ctrl)} control character(s) ({', '.join(names[:4])}; first at "
                           f"char {ctrl[0]})", _around(text, ctrl[0])))
    leak = _first_special(text, special_tokens)
    if leak is not None:
        start, tok = leak
        after = text[start + len(tok):]
        ends_turn = bool(_END_HINT.search(tok))
        if ends_turn and after.strip():
            why = f"end-of-turn token {tok!r} at char {start} followed by {len(after)} more characters"
        else:
            why = f"special token {tok!r} of a chat template in the text at char {start}"
        out.append(Finding("special_token", why, _around(text, start, len(tok))))
    return out


def _is_control(ch: str) -> bool:
    if ch in _ALLOWED_CONTROLS:
        return False
    o = ord(ch)
    return o < 0x20 or o == 0x7F or 0x80 <= o <= 0x9F


def _invalid_positions(text: str, finish_reason: str | None) -> list[int]:
    bad = [i for i, ch in enumerate(text) if ch == "\ufffd" or unicodedata.category(ch) == "Cs"]
    if bad and finish_reason == "length":
        # an answer cut at its token budget may end inside a multi-byte character (up to 3 bytes shown as U+FFFD)
        tail = len(text.rstrip("\ufffd"))
        if len(text) - tail <= 3:
            bad = [i for i in bad if i < tail]
    return bad


def _first_special(text: str, special_tokens: Iterable[str]) -> tuple[int, str] | None:
    hits: list[tuple[int, str]] = []
    m = _FAMILY.search(text)
    if m:
        hits.append((m.start(), m.group(0)))
    for tok in special_tokens:
        if tok and len(tok) >= 3:  # one- and two-character "special" tokens are ordinary text
            i = text.find(tok)
            if i >= 0:
                hits.append((i, tok))
    return min(hits) if hits else None


def _around(text: str, i: int, width: int = 1, pad: int = 30) -> str:
    s = text[max(0, i - pad):i + width + pad]
    return s.replace("\n", "⏎")


def control_tokens_of_gguf(path: str) -> tuple[str, ...]:
    """The control tokens (``tokenizer.ggml.token_type`` 3) of a GGUF model: its chat template's special tokens."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    tokens, types = r.fields.get("tokenizer.ggml.tokens"), r.fields.get("tokenizer.ggml.token_type")
    if tokens is None or types is None:
        return ()
    names, kinds = tokens.contents(), types.contents()
    return tuple(sorted({t for t, k in zip(names, kinds, strict=False) if k == 3 and len(t) >= 3}))


__all__ = ["BACKSTOP_CHECKS", "Backstop", "backstop_findings", "control_tokens_of_gguf"]
