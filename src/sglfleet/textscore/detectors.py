"""Garbage detectors: pure functions from one generated text to named findings.

Each detector targets one failure *class* seen when an inference engine corrupts its own output
(wrong attention mask, stale KV cache, broken sampler), not one example string:

- ``empty``            nothing, or only whitespace
- ``char_run``         one character repeated far beyond what text uses ("!!!!!!!!")
- ``ngram_loop``       a block of words repeated back to back many times
- ``token_soup``       fragments of sub-word tokens glued together: a high rate of non-words in
                       prose, or words glued from pieces ("poemownersWrite", "Referenceuma abuma")
- ``bad_chars``        U+FFFD replacement characters, control characters, private-use / unassigned
- ``script_salad``     letters of several writing systems mixed inside words, or too many
                       writing systems in one answer
- ``collapse``         a coherent start followed by a tail that fails the soup / symbol checks

Text that is easy to misjudge is handled explicitly: fenced and inline code, URLs, e-mail
addresses, numbers, identifiers (snake_case, camelCase whose pieces are words), markdown table
rules and horizontal rules, emoji, and non-English prose (the word list follows the detected
language). Thresholds come from `textscore.config.DetectorThresholds` (the gate config's `thresholds`).
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import statistics
import unicodedata
from collections import Counter
from dataclasses import dataclass

from sglfleet.textscore.config import DetectorThresholds


@dataclass(frozen=True)
class Finding:
    """One detector verdict against one text."""

    check: str
    reason: str
    excerpt: str = ""


# ---------------------------------------------------------------------------- text preparation

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_URL = re.compile(r"\b(?:https?://|www\.)\S+", re.I)
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+\.[\w.-]+\b")
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*", re.U)
_CAMEL_SPLIT = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
# Characters that legitimately form long runs: rules, underlines, table borders, leaders, spaces.
_RULE_CHARS = set("-=_*#~.·•─━═│|+ \t\n\r")
_OPEN_CLOSE = set("()[]{}<>")

LANGS = ("en", "fr", "de", "es", "it", "pt", "nl")


def excerpt(text: str, start: int, end: int, pad: int = 30) -> str:
    """A short quote of text[start:end] with a little context, newlines shown as ⏎."""
    a, b = max(0, start - pad), min(len(text), end + pad)
    s = text[a:b].replace("\n", "⏎")
    return ("…" if a > 0 else "") + s + ("…" if b < len(text) else "")


_YAML_SCALAR = re.compile(r"^\s*(?:- )?[\w.\-/\"']+:\s*[^\s,]*\s*$", re.M)


def _json_prose(text: str) -> str | None:
    """For a text that is one JSON document: its string values that read as sentences; else None."""
    t = text.strip()
    if not t or t[0] not in "{[" or t[-1] not in "}]":
        return None
    try:
        obj = json.loads(t)
    except ValueError:
        return None
    out: list[str] = []

    def walk(o: object) -> None:
        if isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
        elif isinstance(o, str) and len(o.split()) >= 4:
            out.append(o)

    walk(obj)
    return "\n".join(out)


def prose_of(text: str) -> str:
    """The text with code, URLs, e-mail addresses and structured data (JSON, YAML scalars) blanked out."""
    js = _json_prose(text)
    if js is not None:
        return js
    text = _YAML_SCALAR.sub(" ", text)
    text = _FENCE.sub(" ", text)
    text = _INLINE_CODE.sub(" ", text)
    text = _URL.sub(" ", text)
    return _EMAIL.sub(" ", text)


@functools.cache
def _lexicon(lang: str, size: int) -> frozenset[str]:
    from wordfreq import top_n_list

    return frozenset(top_n_list(lang, size))


def in_lexicon(word: str, lang: str, size: int) -> bool:
    w = word.lower().replace("’", "'")
    lex = _lexicon(lang, size)
    if w in lex:
        return True
    # possessives / contractions / plural of a known word
    for suffix in ("'s", "'", "s", "es", "ed", "ing", "ly", "er", "ers"):
        if w.endswith(suffix) and w[: -len(suffix)] in lex:
            return True
    return "'" in w and all(p in lex for p in w.split("'") if p)


def _script(ch: str) -> str | None:
    """Writing system of a letter (coarse). CJK scripts form one group: Japanese mixes them."""
    if not ch.isalpha():
        return None
    try:
        name = unicodedata.name(ch)
    except ValueError:
        return "UNKNOWN"
    first = name.split(" ")[0]
    if first in ("CJK", "HIRAGANA", "KATAKANA", "HANGUL", "BOPOMOFO", "IDEOGRAPHIC"):
        return "CJK"
    if first in ("LATIN", "CYRILLIC", "GREEK", "ARABIC", "HEBREW", "DEVANAGARI", "THAI", "BENGALI", "TAMIL",
                 "GEORGIAN", "ARMENIAN", "ETHIOPIC", "TELUGU", "KANNADA", "MALAYALAM", "GUJARATI", "GURMUKHI"):
        return first
    if first in ("FULLWIDTH", "HALFWIDTH"):
        return "CJK"
    return first


@dataclass
class WordStats:
    """Lexical statistics of the prose part of a text."""

    lang: str
    words: int
    unknown: int
    glued: list[str]
    unknown_words: list[str]

    @property
    def unknown_rate(self) -> float:
        return self.unknown / self.words if self.words else 0.0


_SKIP_TOKEN = re.compile(r"[_\d/\\=@#$%^&*<>{}\[\]|~+]|\.\w")
_EDGE = "\"'“”‘’«»()[]{}<>.,;:!?*-–—`"


def _candidate_words(prose: str) -> list[str]:
    """Latin-script words of prose; identifiers, paths, flags, numbers and acronyms are left out."""
    out = []
    for raw in prose.split():
        tok = raw.strip(_EDGE)
        if not tok or _SKIP_TOKEN.search(tok):
            continue
        for w in re.split(r"[-–]", tok):
            if len(w) < 2 or w.isupper() or not _WORD.fullmatch(w):
                continue
            if _script(w[0]) != "LATIN":
                continue
            out.append(w)
    return out


def word_stats(text: str, lexicon_size: int) -> WordStats:
    """Unknown-word rate of Latin-script prose, in the language whose word list fits it best."""
    words = _candidate_words(prose_of(text))
    if not words:
        return WordStats("en", 0, 0, [], [])
    lowered = [w.lower() for w in words]
    best_lang, best_known = "en", -1
    # Pick the language by its most common words (large lists of one language hold many words of others).
    for lang in LANGS:
        lex = _lexicon(lang, 5000)
        known = sum(1 for w in lowered if w in lex)
        if known > best_known:
            best_lang, best_known = lang, known
    unknown_words: list[str] = []
    glued: list[str] = []
    # Distinct words: a made-up refrain ("avaid, avaid") counts once; token soup is mostly distinct anyway.
    distinct = list(dict.fromkeys(words))
    for w in distinct:
        if in_lexicon(w, best_lang, lexicon_size):
            continue
        pieces = _CAMEL_SPLIT.findall(w)
        if len(pieces) > 1 and "".join(pieces) == w:
            # camelCase / PascalCase: fine when every piece is a word (getUserName, iPhone, YouTube);
            # glued sub-word soup otherwise (poemownersWrite: "poemowners" is no word).
            bad = [p for p in pieces if (len(p) > 3 or (len(p) == 3 and p.islower()))
                   and not in_lexicon(p, best_lang, lexicon_size)]
            if not bad:
                continue
            if w[0].islower() or any(p.islower() and len(p) > 5 for p in bad):
                glued.append(w)
        unknown_words.append(w)
    return WordStats(best_lang, len(distinct), len(unknown_words), glued, unknown_words)


# ---------------------------------------------------------------------------- detectors


def detect_empty(text: str, th: DetectorThresholds) -> list[Finding]:
    if not text.strip():
        return [Finding("empty", "output is empty or whitespace only", repr(text[:40]))]
    if len(text.strip()) < th.min_chars:
        return [Finding("empty", f"output shorter than {th.min_chars} characters", repr(text[:40]))]
    return []


def _word_at(text: str, i: int) -> str:
    """The run of word characters around position i."""
    a = i
    while a > 0 and (text[a - 1].isalnum() or text[a - 1] == "_"):
        a -= 1
    return re.match(r"\w*", text[a:]).group(0)  # type: ignore[union-attr]


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_HEX_WORD = re.compile(r"0[xX][0-9a-fA-F]{1,32}(?:[uU]?[lL]{0,2})")  # C's ULL suffix included


def detect_char_run(text: str, th: DetectorThresholds) -> list[Finding]:
    m = re.search(r"\n{" + str(th.max_newline_run + 1) + ",}", text)
    if m:  # checked on the raw text: a flood of blank lines is garbage inside code fences too
        return [Finding("char_run", f"{len(m.group(0))}x '\\n' in a row (limit {th.max_newline_run})",
                        excerpt(text, m.start(), m.start() + 1))]
    scan = _FENCE.sub("\n", text) if th.skip_code_for_runs else text
    if th.skip_code_for_runs:  # code keeps its rules and padding, but not a flood of one digit or glued symbol
        for code in _FENCE.finditer(text):
            hit = _digit_flood(code.group(0), th) or _glued_symbol_flood(code.group(0), th)
            if hit:
                return [hit]
    for m in re.finditer(r"(.)\1+", scan, re.S):
        ch, n = m.group(1), len(m.group(0))
        if ch == "\n":
            limit = th.max_newline_run
        elif ch.isspace():
            limit = th.max_space_run
        elif ch in ".·•" and n > th.max_symbol_run and not scan[m.end():].split("\n", 1)[0].strip():
            limit = th.max_symbol_run  # a flood of dots to the end of the line: not a leader ("Intro ..... 5")
        elif ch in "*#~+" and m.start() > 0 and scan[m.start() - 1] not in " \t\n|+":
            limit = th.max_symbol_run  # glued to a word or sign ("piece of it.*****", "12 + 30 =****"): not a rule
        elif ch in _RULE_CHARS:
            limit = th.max_rule_run
        elif ch.isdigit() and n > th.max_digit_run:
            lead = scan[m.start() - 1] if m.start() > 0 else ""
            rest = scan[m.end():].strip()
            in_number = lead.isdigit() and lead != ch and bool(rest) and not rest[0].isdigit()
            limit = th.max_zero_run if (ch == "0" and in_number) else th.max_digit_run
        elif ch.isalpha():
            limit = th.max_letter_run
        elif ch.isdigit():
            limit = th.max_digit_run
        elif ch in _OPEN_CLOSE:
            limit = th.max_bracket_run
        else:
            limit = th.max_symbol_run
        if n > limit and not (ch in _HEX_DIGITS and _HEX_WORD.fullmatch(_word_at(scan, m.start()))):
            # (a hex literal of up to 128 bits is a number: 0xFFFFFFFFFFFFFFFF, 0x0000000000000000)
            return [Finding("char_run", f"{n}x {ch!r} in a row (limit {limit})", excerpt(scan, m.start(), m.end()))]
    return []


def _digit_flood(code: str, th: DetectorThresholds) -> Finding | None:
    """A run of one digit over max_digit_run inside a code block ("for 6666666666…"), except the zeros of a
    number (1 followed by zeros, as in prose: up to max_zero_run), binary literals (0b1111…, up to 64) and hex
    literals of up to 32 digits."""
    for m in re.finditer(r"(\d)\1{" + str(th.max_digit_run) + ",}", code):
        ch, n = m.group(1), len(m.group(0))
        before, after = re.search(r"[\w.]*$", code[:m.start()]), re.match(r"[\w.]*", code[m.end():])
        word = (before.group(0) if before else "") + m.group(0) + (after.group(0) if after else "")
        lead = code[m.start() - 1] if m.start() > 0 else ""
        limit = th.max_digit_run
        if re.fullmatch(r"0[bB][01_]+", word):
            limit = 64
        elif _HEX_WORD.fullmatch(word):
            continue  # a hex literal of up to 128 bits: 0x00000000000000000000000000000000
        elif ch == "0" and lead.isdigit() and lead != "0":
            limit = th.max_zero_run
        if n > limit:
            return Finding("char_run", f"{n}x {ch!r} in a row inside code (limit {limit})",
                           excerpt(code, m.start(), m.end()))
    return None


def _glued_symbol_flood(code: str, th: DetectorThresholds) -> Finding | None:
    """A run of one symbol glued to the end of a code token (`ValueError("…")**********`): a rule or banner
    starts a line, follows whitespace or a comment opener ("/*****", "# ====="), or sits in a string."""
    for m in re.finditer(r"([^\w\s\"'`/#])\1{" + str(th.max_rule_run // 4) + ",}", code):  # maximal runs
        if m.start() == 0 or code[m.start() - 1] in " \t\n\"'`/#":
            continue
        return Finding("char_run", f"{len(m.group(0))}x {m.group(1)!r} glued to code (limit {th.max_rule_run // 4})",
                       excerpt(code, m.start(), m.end()))
    return None


def _tokens_for_loops(text: str) -> list[str]:
    # a run of one punctuation character ("=======", "...") is one token: char_run judges those
    return [m.group(0) for m in re.finditer(r"\w+|([^\w\s])\1*", text.lower())]


def detect_ngram_loop(text: str, th: DetectorThresholds) -> list[Finding]:
    """A block of 1..max_period tokens repeated back to back >= min_repeats times (and long enough)."""
    toks = _tokens_for_loops(text)
    n = len(toks)
    best: tuple[int, int, int] | None = None  # (covered tokens, period, start)
    for period in range(1, min(th.loop_max_period, n // 2) + 1):
        run = 0
        for i in range(period, n):
            if toks[i] == toks[i - period]:
                run += 1
                repeats = 1 + run // period
                covered = run + period
                long_enough = covered >= th.loop_min_tokens or (
                    covered >= th.loop_min_share * n and covered >= 12) or (
                    period <= th.loop_short_max_period and repeats >= th.loop_short_min_repeats)
                if repeats >= th.loop_min_repeats and long_enough and (best is None or covered > best[0]):
                    best = (covered, period, i - run - period + 1)
            else:
                run = 0
    if best is None:
        return []
    covered, period, start = best
    block = " ".join(toks[start : start + period])
    return [Finding("ngram_loop", f"a {period}-token block repeats {covered // period}x back to back "
                    f"({covered} of {n} tokens)", block[:120])]


_CLAUSE_SPLIT = re.compile(r"[,;:.!?()\[\]\"“”]|\s[-–—]\s")


def function_free_runs(text: str, lang: str, min_words: int, lexicon_size: int = 200_000) -> list[str]:
    """Clauses of >= min_words words with (almost) none of the language's 50 commonest words (< 8 %).

    Natural prose cannot go ten words without "the", "of", "and", "to", "is"...; random vocabulary
    soup does. Clauses are cut at punctuation and line ends, so lists, table rows and comma-separated
    enumerations are not runs; markdown table rows and code are skipped.
    """
    common = _lexicon(lang, 50)
    runs = []
    for line in prose_of(text).splitlines():
        if line.count("|") >= 3:
            continue
        for clause in _CLAUSE_SPLIT.split(line):
            words = _candidate_words(clause)
            if len(words) < min_words or sum(w.lower() in common for w in words) >= 0.08 * len(words):
                continue
            # A keyword / tag line ("python docker kubernetes ...") has no function words either, but
            # its case is consistent and its words are real; soup mixes case or holds non-words.
            caps = sum(1 for w in words[1:] if w[0].isupper())
            lower = sum(1 for w in words if w[0].islower())
            unknown = sum(1 for w in words if not in_lexicon(w, lang, lexicon_size))
            if (caps >= 2 and lower >= 2) or unknown >= 0.15 * len(words):
                runs.append(" ".join(words))
    return runs


def detect_token_soup(text: str, th: DetectorThresholds) -> list[Finding]:
    st = word_stats(text, th.lexicon_size)
    out: list[Finding] = []
    runs = function_free_runs(text, st.lang, th.function_free_run_words, th.lexicon_size)
    if runs:
        out.append(Finding("token_soup", f"{len(runs)} clause(s) of >= {th.function_free_run_words} words with almost "
                           f"no common '{st.lang}' words (vocabulary soup)", runs[0][:120]))
    if st.words >= th.soup_min_words and st.unknown_rate > th.max_unknown_word_rate:
        out.append(Finding("token_soup", f"{st.unknown}/{st.words} words ({st.unknown_rate:.0%}) are not words of "
                           f"'{st.lang}' (limit {th.max_unknown_word_rate:.0%})", " ".join(st.unknown_words[:12])))
    if st.glued and (len(st.glued) > th.max_glued_words or len(st.glued) / st.words > th.max_glued_rate):
        out.append(Finding("token_soup", f"{len(st.glued)} words glued from sub-word pieces (limit "
                           f"{th.max_glued_words})", " ".join(st.glued[:8])))
    return out


def detect_bad_chars(text: str, th: DetectorThresholds) -> list[Finding]:
    bad = []
    for i, ch in enumerate(text):
        if ch in "\n\r\t":
            continue
        cat = unicodedata.category(ch)
        if ch == "\ufffd" or cat in ("Cc", "Co", "Cs", "Cn"):
            bad.append(i)
    if len(bad) > th.max_bad_chars:
        i = bad[0]
        names = sorted({f"U+{ord(text[j]):04X}" for j in bad})[:5]
        return [Finding("bad_chars", f"{len(bad)} replacement/control/unassigned characters ({', '.join(names)})",
                        excerpt(text, i, i + 1))]
    return []


def detect_script_salad(text: str, th: DetectorThresholds) -> list[Finding]:
    prose = prose_of(text)
    mixed = []
    for m in re.finditer(r"[^\W\d_]+", prose):
        scripts = {s for s in map(_script, m.group(0)) if s}
        if len(scripts) > 1:
            mixed.append(m.group(0))
    out = []
    if len(mixed) > th.max_mixed_script_words:
        out.append(Finding("script_salad", f"{len(mixed)} words mix writing systems", " ".join(mixed[:8])))
    counts: dict[str, int] = {}
    for ch in prose:
        s = _script(ch)
        if s:
            counts[s] = counts.get(s, 0) + 1
    total = sum(counts.values())
    if total >= 20:
        major = {s: c for s, c in counts.items() if c / total >= th.script_min_share and c >= 3}
        if len(major) > th.max_scripts:
            out.append(Finding("script_salad", f"{len(major)} writing systems in one answer "
                               f"({', '.join(sorted(major))}; limit {th.max_scripts})", ""))
    return out


def detect_collapse(text: str, th: DetectorThresholds) -> list[Finding]:
    """Coherent head, garbage tail: score the last part of long outputs on its own."""
    words = text.split()
    if len(words) < th.collapse_min_words:
        return []
    cut = int(len(words) * (1 - th.collapse_tail_fraction))
    head, tail = " ".join(words[:cut]), " ".join(words[cut:])
    h, t = word_stats(head, th.lexicon_size), word_stats(tail, th.lexicon_size)
    sym_tail = sum(1 for c in tail if not (c.isalnum() or c.isspace())) / max(1, len(tail))
    sym_head = sum(1 for c in head if not (c.isalnum() or c.isspace())) / max(1, len(head))
    if t.words >= 8 and t.unknown_rate > th.max_unknown_word_rate and h.unknown_rate <= th.max_unknown_word_rate / 2:
        return [Finding("collapse", f"tail has {t.unknown_rate:.0%} non-words after a head with {h.unknown_rate:.0%}",
                        tail[:120])]
    last = " ".join(words[-th.collapse_last_words:])
    e = word_stats(last, th.lexicon_size)
    soup_end = e.unknown_rate >= th.collapse_last_unknown_rate or len(e.glued) >= 2
    if e.words >= th.collapse_last_words // 2 and soup_end and h.unknown_rate <= th.max_unknown_word_rate / 2:
        return [Finding("collapse", f"last {th.collapse_last_words} words are {e.unknown_rate:.0%} non-words "
                        f"after a head with {h.unknown_rate:.0%}", last[:120])]
    if sym_tail > th.collapse_max_symbol_share and sym_tail > 3 * sym_head:
        return [Finding("collapse", f"tail is {sym_tail:.0%} symbols after a head with {sym_head:.0%}", tail[:120])]
    return []


# ---------------------------------------------------------------------------- sub-word loops, mojibake, glue


_UNIT_LOOP = re.compile(r"([^\W\d_]{2,8}?)\1{3,}", re.U)
# a unit that mixes letters with '_' or digits ("b_rb_rb_rb_r", "x1x1x1x1"): no word or identifier is one
_MIXED_UNIT_LOOP = re.compile(r"(\w{2,8}?)\1{3,}", re.U)
# a word glued to itself by '_' or '-' six times and more ("last_last_last_…", an identifier looped by the engine)
_JOINED_LOOP = re.compile(r"(?<![^\W_])([^\W\d_]{3,12})(?:[_-]\1){5,}", re.U)


def detect_subword_repeat(text: str, th: DetectorThresholds) -> list[Finding]:
    """A sub-word unit repeated without spaces ("refrefrefref"): a token id looped by the engine.
    Code is scanned too (a loop can start right after an opening fence), with a longer minimum span."""
    code = [(m.start(), m.end()) for m in _FENCE.finditer(text)] + [(m.start(), m.end())
                                                                   for m in _INLINE_CODE.finditer(text)]
    for pattern, mixed in ((_UNIT_LOOP, False), (_MIXED_UNIT_LOOP, True)):
        for m in pattern.finditer(text):
            unit, span = m.group(1), m.group(0)
            if mixed and (unit.isalpha() or not any(c.isalpha() for c in unit)):
                continue  # letter-only units are the first pattern's; numbers and underscores alone char_run's
            in_code = any(a <= m.start() < b for a, b in code)
            need = th.subword_min_chars_code if in_code else th.subword_min_chars
            if len(span) < need or len(span) // len(unit) < th.subword_min_repeats:
                continue
            if _HEX_WORD.fullmatch(_word_at(text, m.start())):
                continue  # a repeating mask: 0x0F0F0F0F0F0F0F0F
            if not mixed:  # a dictionary word that repeats a syllable passes
                a = m.start()
                while a > 0 and text[a - 1].isalpha():
                    a -= 1
                word = re.match(r"[^\W\d_]*", text[a:]).group(0)  # type: ignore[union-attr]
                if in_lexicon(word, "en", th.lexicon_size):
                    continue
            return [Finding("subword_repeat", f"{unit!r} repeated {len(span) // len(unit)}x without a space"
                            + (" (in code)" if in_code else ""), excerpt(text, m.start(), m.end()))]
    glued = _JOINED_LOOP.search(text)
    if glued:
        return [Finding("subword_repeat", f"{glued.group(1)!r} repeated "
                        f"{len(glued.group(0)) // (len(glued.group(1)) + 1) + 1}x, glued by '_' or '-'",
                        excerpt(text, glued.start(), glued.end()))]
    return []


_COMMON_SYMBOLS = set("©®™°✓✔✗×÷±€$£¥•…–—‘’“”«»·")
_NEUTRAL_LM = set("ー々〻ｰ")


def _odd(ch: str) -> bool:
    """A character that prose almost never uses outside mojibake: spacing modifiers, stray symbols, vulgar fractions."""
    o = ord(ch)
    if o < 0x80 or ch in _COMMON_SYMBOLS or ch in _NEUTRAL_LM:
        return False
    if o >= 0x1F000 or 0x2190 <= o <= 0x21FF or 0x2200 <= o <= 0x22FF or 0x2500 <= o <= 0x27BF or 0xFE00 <= o <= 0xFE0F:
        return False  # emoji, arrows, maths, box drawing, dingbats, variation selectors
    cat = unicodedata.category(ch)
    if ch in "²³¹" or 0x2070 <= o <= 0x209F:
        return False  # units and formulas: m², cm³, H₂O
    return cat in ("Sk", "Lm", "No", "Nl", "Sc", "So", "Sm") or ch in "¦¨¯´¸‚„†‡‰‹›ªº"


def _char_class(ch: str) -> str:
    if ch.isascii():
        return "ascii"
    if _odd(ch):
        return "odd"
    if not ch.isalpha():
        return "punct"
    s = _script(ch)
    return "latin" if s == "LATIN" else (s or "other")


def _codepage_mojibake(token: str) -> str | None:
    """The token repaired when it is UTF-8 bytes decoded with a single-byte code page ("cafÃ©" -> "café")."""
    if token.isascii():
        return None
    for cp in ("cp1252", "latin-1"):
        try:
            fixed = token.encode(cp).decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            continue
        if fixed != token and not fixed.isascii():
            return fixed
    return None


# lead bytes of UTF-8 read as cp1252 / latin-1: "Ã©" (é), "Ã\xa0" (à), "â€™" (’), "Â°" (°)
_MOJI_PAIR = re.compile("[\u00c3\u00c2][\u0080-\u00bf]|\u00e2\u20ac")


# typographic punctuation that clusters legitimately ("«…»—", "“…”")
_TYPOGRAPHIC = set("„“”‘’«»–—…•·‹›")


def _symbol_cluster(text: str) -> Finding | None:
    """A cluster of non-ASCII symbols of three or more Unicode categories within 8 characters ("˚€M§©™"),
    scanned on the raw text, code included: emoji, maths, currency or arrows cluster within one category;
    bytes decoded as the wrong characters mix categories. Typographic quotes and dashes are left out."""
    marks = [(i, unicodedata.category(c)) for i, c in enumerate(text)
             if ord(c) >= 0x80 and c not in _TYPOGRAPHIC and unicodedata.category(c)[0] in "SPN"]
    for a in range(len(marks) - 3):
        window = [m for m in marks[a:a + 8] if m[0] - marks[a][0] < 8]
        if len(window) >= 4 and len({c for _, c in window}) >= 3:
            return Finding("mojibake", f"{len(window)} stray symbols of {len({c for _, c in window})} kinds within "
                           "8 characters", excerpt(text, window[0][0], window[-1][0] + 1))
    return None


def detect_mojibake(text: str, th: DetectorThresholds) -> list[Finding]:
    """Text decoded with the wrong code page, or runs of stray symbols and mixed-script characters."""
    cluster = _symbol_cluster(text)
    if cluster:
        return [cluster]
    prose = prose_of(text)
    repaired = [m.group(0) for m in _MOJI_PAIR.finditer(prose)]
    for tok in prose.split():
        core = tok.strip(_EDGE)
        fixed = _codepage_mojibake(core)
        if fixed:
            repaired.append(f"{core} -> {fixed}")
    if repaired:
        return [Finding("mojibake", f"{len(repaired)} token(s) are UTF-8 read with a single-byte code page",
                        "; ".join(repaired[:4]))]
    pos = 0
    for tok in prose.split():
        pos = prose.find(tok, pos)
        odd = sum(1 for c in tok if _odd(c)) + sum(
            1 for a, b in itertools.pairwise(tok)
            if (a.islower() and b.isupper() and not b.isascii()) or (a in "©®™" and b.isalpha()))
        classes = {_char_class(c) for c in tok} - {"ascii", "punct"}
        if odd >= th.mojibake_token_odd or (len(classes) >= 3 and odd >= 1):
            return [Finding("mojibake", f"a token of {len(tok)} characters holds {odd} stray symbols "
                            f"({', '.join(sorted(classes))})", excerpt(prose, pos, pos + len(tok)))]
        pos += len(tok)
    odd_pos = [i for i, c in enumerate(prose) if _odd(c)]
    w = th.mojibake_window_odd
    for a in range(len(odd_pos) - w + 1):
        if odd_pos[a + w - 1] - odd_pos[a] < 24:
            return [Finding("mojibake", f"{w} stray symbols within 24 characters",
                            excerpt(prose, odd_pos[a], odd_pos[a + w - 1] + 1))]
    return []


_DETERMINERS = {"the", "a", "an"}
_FUNCTION_AFTER_DET = {"the", "a", "an", "of", "to", "and", "in", "is", "was", "for", "with", "on", "at", "by", "from",
                       "or", "but", "as", "it", "that", "are", "were", "be", "this", "then", "into", "its"}
_A_OK_AFTER = {"and", "or", "is", "was", "are", "were", "be", "it", "that", "as", "but", "then", "this", "its"}
# a word (lower-case or Capitalised, not an all-caps abbreviation) glued at punctuation to a Capitalised word
_PUNCT_GLUE = re.compile(r"(?<![\w.])([A-Z]?[a-z]{2,})[,.;:!?]([A-Z][a-z]+)\b")
_STOP_CAPS = {"The", "And", "Into", "Then", "Of", "For", "With", "From", "That", "This", "But", "Or", "A", "An", "In",
              "On", "At", "To", "Is", "Was", "It", "As", "By"}


_TABLE_SEP_CELL = re.compile(r":?-{3,}:?")


def _glued_table(prose: str) -> Finding | None:
    """A markdown table whose rows were shuffled into one line: a separator cell ("---") among cells of
    words in one row, and no separator row anywhere (a table that uses "---" as an empty value has one)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in prose.splitlines()
            if line.count("|") >= 2]
    if any(cells and all(_TABLE_SEP_CELL.fullmatch(c) or not c for c in cells) for cells in rows):
        return None
    for cells in rows:
        seps = sum(1 for c in cells if _TABLE_SEP_CELL.fullmatch(c))
        words = [c for c in cells if any(ch.isalpha() for ch in c)]
        if seps and len(words) >= 2:
            return Finding("word_order", f"a table separator cell among {len(words)} cells of words in one row, "
                           "no separator row: the table's rows are out of order", " | ".join(cells[:8])[:120])
    return None


_STAR_RUN = re.compile(r"\*+")
_CLOSE_AFTER = frozenset(".,;:!?)]}\"'’”")
_OPEN_BEFORE = frozenset("([{\"'‘“")
_LINE_MARKER = re.compile(r"^(?:[*+-]|\d+[.)])\s+")


def _stray_emphasis(prose: str) -> list[str]:
    """Markdown stars that no writer puts there: a star glued between two words into a capitalised one
    ("Chocolate*Ginger") and a closing star with no opening one before it on its line ("Apple* *Appetizer").
    A list or emphasised text whose words were shuffled or glued leaves them; written markdown does not:
    "**bold**", "*italic*", inline bullets that only open ("*Apples, *Pears"), a footnote mark or two, "2*3",
    "*.txt" and censored words ("f*ck") give none. Table rows and each line's own bullet are left out."""
    events: list[str] = []
    for line in prose.splitlines():
        s = _LINE_MARKER.sub("", line.strip())
        if s.count("|") >= 2:
            continue
        is_open = False
        for m in _STAR_RUN.finditer(s):
            a, b = m.start(), m.end()
            left = s[a - 1] if a else " "
            right = s[b] if b < len(s) else " "
            if left.isalpha() and right.isalpha() and right.isupper():
                events.append(s[max(0, a - 12):b + 12])
            elif right.isalnum() and (left.isspace() or left in _OPEN_BEFORE):
                is_open = True
            elif (left.isalpha() or left in _CLOSE_AFTER) and (right.isspace() or right in _CLOSE_AFTER):
                if not is_open:
                    events.append(s[max(0, a - 12):b + 12])
                is_open = False
    return events


def detect_word_order(text: str, th: DetectorThresholds) -> list[Finding]:
    """Word order that English never produces: a determiner before a function word or a full stop ("the of",
    "a the", "the."), words glued at punctuation ("minutes,Milk") or to a capitalised function word
    ("panInto", "andThenFlour"), a table's rows shuffled into one line, markdown stars out of order."""
    prose = prose_of(text)
    table = _glued_table(prose)
    if table:
        return [table]
    stars = _stray_emphasis(prose)
    if len(stars) >= th.stray_emphasis_min:
        return [Finding("word_order", f"{len(stars)} markdown stars out of order (a closing star with no opening "
                        f"one, a star glued between words; limit {th.stray_emphasis_min}): the words were "
                        "shuffled or glued", "; ".join(stars[:4])[:160])]
    st_lang = word_stats(text, th.lexicon_size).lang
    events: list[str] = []
    if st_lang == "en":
        toks = []
        for raw in prose.split():
            core = raw.strip(_EDGE)
            toks.append(core if core.isascii() and core.isalpha() else "#")  # numbers, hashes: break pairs
            if raw[-1:] in ".,;:!?" and core:
                toks.append(raw[-1])
        for a, b in itertools.pairwise(toks):
            if a.lower() in _DETERMINERS and (b.lower() in _FUNCTION_AFTER_DET or b in ".,;:!?"):
                if a.lower() == "a" and (b in ".,;:!?" or b.lower() in _A_OK_AFTER):
                    continue  # "plan A.", a variable: "a, b = b, a + b", "if a and b", "a is None"
                events.append(f"{a} {b}")
    for m in _PUNCT_GLUE.finditer(prose):
        if in_lexicon(m.group(1), st_lang, th.lexicon_size) and in_lexicon(m.group(2), st_lang, th.lexicon_size):
            events.append(m.group(0))
    for tok in prose.split():
        core = tok.strip(_EDGE)
        pieces = _CAMEL_SPLIT.findall(core)
        if len(pieces) > 1 and "".join(pieces) == core and core[0].islower():
            caps = [p for p in pieces[1:] if p in _STOP_CAPS]
            if caps and all(in_lexicon(p, st_lang, th.lexicon_size) for p in pieces):
                events.append(core)
    words = max(1, len(prose.split()))
    if words <= th.word_order_short_words:
        events += _misplaced_stops(prose.split())
        broken = _broken_expression(prose.split())
        if broken:
            events.append(broken)
        shuffled = _shuffled_sentence(prose.split(), st_lang, th.lexicon_size) if st_lang == "en" else None
        if shuffled:
            events.append(shuffled)
    events += _mixed_broken_expressions(prose.split())  # each clause whose sum lost its order, at any length
    # a short answer ("of Paris. The is capital France") has room for one anomaly only: there one is enough
    need = 1 if words <= th.word_order_short_words else th.word_order_min_events
    if len(events) >= need and len(events) / words >= th.word_order_min_rate:
        return [Finding("word_order", f"{len(events)} word-order / glue anomalies in {words} words",
                        "; ".join(events[:6]))]
    return []


_ABBREV = frozenset(["etc", "vs", "approx", "ca", "cf", "no", "nos", "fig", "figs", "eq", "eqs", "dr", "mr", "mrs",
                     "ms", "st", "jr", "sr", "inc", "ltd", "co", "vol", "pp", "ed"])
_OPERATORS = frozenset("=+*/<>^×÷≠≤≥")


def _misplaced_stops(toks: list[str]) -> list[str]:
    """A full stop / ! / ? that ends a token inside a short answer and is followed by what cannot start a
    sentence: an operator ("12 + 32. = 30", a shuffled sum) or, after a word, a lowercase word ("Paris.
    capital the"). Not an ellipsis, an abbreviation ("etc.", "e.g."), a list marker ("1. apple") or a
    decimal; a list marker or a number only before an operator."""
    out = []
    for a, b in itertools.pairwise(toks):
        if a[-1:] not in ".!?" or len(a) < 2 or a[-2] in ".!?":  # "...", "!!!": an ellipsis or emphasis
            continue
        core = a[:-1].strip(_EDGE)
        if not core or "." in core or core.lower() in _ABBREV:
            continue
        nxt = b.lstrip("\"'([")
        if not nxt:
            continue
        word_then_lower = core.isalpha() and len(core) > 1 and nxt[0].islower() and nxt[:1].isalpha()
        # an operator on its own or before a number ("= 30", "*2"), not markdown emphasis ("1. *Berry*")
        operator = (b in _OPERATORS or b in ("-", "−")
                    or (b[0] in _OPERATORS and len(b) > 1 and (b[1].isdigit() or b[1] in "(")))
        if operator or word_then_lower:
            out.append(f"{a} {b}")
    return out


_PREPOSITIONS = frozenset(["of", "to", "in", "on", "at", "by", "for", "with", "from", "into"])
_COPULAS = frozenset(["is", "are", "was", "were"])
_CLOSED_CLASS = _PREPOSITIONS | _COPULAS | _DETERMINERS | {"and", "or", "but"}


def _shuffled_sentence(toks: list[str], lang: str, lexicon_size: int) -> str | None:
    """A short English answer whose words were shuffled ("capital is of France The Paris."): two or more of
    four weak signals, each of which a real sentence shows alone now and then - it starts with a lowercase
    dictionary word; a capitalised closed-class word stands inside the sentence ("The" after "France"; "I
    love The Beatles" alone is fine); it ends on a closed-class word ("... France of"); a preposition is
    followed by a copula ("of is")."""
    words = [t.strip(_EDGE) for t in toks]
    words = [w for w in words if w]
    if len(words) < 4 or not all(w.isascii() and w.replace("'", "").isalpha() for w in words):
        return None  # numbers, code, identifiers: other checks
    signals = []
    if words[0].islower() and in_lexicon(words[0], lang, lexicon_size):
        signals.append(f"starts with {words[0]!r}")
    for i, t in enumerate(toks[1:], 1):
        w = t.strip(_EDGE)
        if w in _STOP_CAPS and toks[i - 1][-1:] not in ".!?:\"'(" and w != "I":
            signals.append(f"{w!r} inside the sentence")
            break
    if words[-1].lower() in _CLOSED_CLASS:
        signals.append(f"ends on {words[-1]!r}")
    if any(a.lower() in _PREPOSITIONS and b.lower() in _COPULAS for a, b in itertools.pairwise(words)):
        signals.append("a preposition before a copula")
    return "; ".join(signals) if len(signals) >= 2 else None


_NUM = re.compile(r"[-−]?\d+(?:[.,]\d+)*%?")
_BINARY_OPS = frozenset("=+*/×÷^<>≤≥≠")


def _broken_expression(toks: list[str]) -> str | None:
    """A short answer that is an arithmetic expression (numbers and operators, as tokens of their own) in an
    order no expression has ("+ 30 32 12 =", "12 30 + = 42"): it starts or ends with a binary operator, or
    two numbers stand side by side with no operator between them (a thousands group, "1 000", excepted)."""
    segments: list[list[str]] = [[]]
    for t in toks:  # "3 * 4 = 12, 12 / 2 = 6": expressions separated by a comma or semicolon
        core = t.rstrip(".!?:,;")
        if core:
            segments[-1].append(core)
        if t[-1:] in ",;":
            segments.append([])
    flat = [t for seg in segments for t in seg]
    ops = sum(1 for t in flat if t in _BINARY_OPS)
    nums = sum(1 for t in flat if _NUM.fullmatch(t))
    if len(flat) < 3 or ops + nums < len(flat) or not ops or nums < 2:
        return None  # not an expression of numbers and operators only
    for seg in filter(None, segments):
        kinds = ["op" if t in _BINARY_OPS else "num" for t in seg]
        if kinds[0] == "op" or kinds[-1] == "op" or any(
                ka == kb and not (ka == "num" and len(b) == 3 and b.isdigit())  # "1 000": a thousands group
                for (ka, kb), b in zip(itertools.pairwise(kinds), seg[1:], strict=True)):
            return " ".join(flat)
    return None


def _mixed_broken_expressions(toks: list[str]) -> list[str]:
    """Clauses of words around a sum whose numbers were shuffled ("12 + then 30 32.", "the 12 30 = 32"):
    a clause (split at . ! ? : , ;) holding an operator and two numbers side by side with nothing between
    them, two operators side by side, or ending in an operator. English writes two bare numbers in a row
    only in a thousands group ("1 000"), and a clause with an operator and numbers in it is a sum, where an
    operator always stands between two operands."""
    sentences: list[list[str]] = [[]]
    for t in toks:
        core = t.rstrip(".!?:,;")
        if core:
            sentences[-1].append(core)
        if t[-1:] in ".!?:,;":  # "Step 1: 12 + 30 = 42": the step's number ends its own clause
            sentences.append([])
    out = []
    for sent in filter(None, sentences):
        if not any(t in _BINARY_OPS for t in sent) or sum(1 for t in sent if _NUM.fullmatch(t)) < 2:
            continue
        if sent[-1] in _BINARY_OPS or any(  # "94 get + 88 182 =": a sum ends in an operand, never an operator
                (_NUM.fullmatch(a) and _NUM.fullmatch(b) and not (len(b) == 3 and b.isdigit()))
                or (a in _BINARY_OPS and b in _BINARY_OPS) for a, b in itertools.pairwise(sent)):
            out.append(" ".join(sent))
    return out


# ---------------------------------------------------------------------------- repetition with small variations

_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_LIST_MARK = re.compile(r"^\s*(?:[-*+•]|\d+[.)]|#+)\s*")
# where an enumeration starts again at 1, on its own line or inline ("... 5. Oranges. 1. Banana 2. ...")
_ENUM_RESTART = re.compile(r"(?:^|(?<=\s))(?=1[.)]\s)")


def _norm_words(sentence: str) -> list[str]:
    """Words of a sentence; numbers become '#' and paths / identifiers are dropped: the parts that
    legitimately vary between the lines of a test log or the steps of a list."""
    out = []
    for tok in _LIST_MARK.sub("", sentence).split():
        core = tok.strip(_EDGE)
        if core and all(c.isdigit() or c in ".,:%-" for c in core) and any(c.isdigit() for c in core):
            out.append("#")
            continue
        if _SKIP_TOKEN.search(tok) or any(c.isdigit() for c in tok):
            continue
        w = core.lower().replace("’", "'")
        if w.replace("'", "").isalpha():  # a contraction is a word ("let's", "it's")
            out.append(w)
    return out


def _stem(w: str) -> str:
    """A crude stem, stable under its own forms: "durings" -> "during" -> "dur" is one stem with "during",
    "galaxies" one with "galaxy" (a stutter mixes a word's forms: "durings during During")."""
    for _ in range(2):
        if w.endswith("ies") and len(w) >= 6:
            w = w[:-3] + "y"
            continue
        for suf in ("es", "s", "ed", "ing"):
            if w.endswith(suf) and len(w) - len(suf) >= 3 and not w.endswith("ss"):
                w = w[: -len(suf)]
                break
        else:
            break
    return w


def _similar(a: list[str], b: list[str]) -> float:
    import difflib

    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def _refrain(members: list[list[str]], raw: list[str], lines: set[str], th: DetectorThresholds) -> bool:
    """A refrain / anaphora of a poem or list: one line template whose 1-2 slots take different words
    ("A wonder, that befits a land, / A wonder, that befits a sea,"; "A tale of love, a tale of devotion, /
    A tale of salvation, a tale of redemption,"). It differs from the near-copies a broken engine writes in
    four ways, all required (the fourth, share <= refrain_max_share, is checked by the caller):

    - every copy has the same words at the same positions except in the slots (no word inserted or
      dropped: the engine's copies gain and lose words, "the the", "fully", "carefully");
    - a slot's words are new to the line: none repeats a word of the template (an engine's substitution
      copies a word of the same sentence: "travels happen the Sun", "northern surprise to everyone's
      surprise");
    - each copy is a whole line of a line-broken text (poem or list form), not a sentence in a paragraph;
    - the copies, with every near-copy of them, are part of the answer, not all of it.
    """
    if any(r not in lines for r in raw) or len({len(m) for m in members}) != 1:
        return False
    n = len(members[0])
    slots = [k for k in range(n) if len({m[k] for m in members}) > 1]
    if not 1 <= len(slots) <= th.refrain_max_slots or n - len(slots) < 4:
        return False
    template = {members[0][k] for k in range(n) if k not in slots}
    return all(m[k] not in template for m in members for k in slots)


def detect_near_repeat(text: str, th: DetectorThresholds) -> list[Finding]:
    """A sentence or phrase repeated with small variations ("1. Use a food thermometer ... 2. Use a food
    thermometer ..."), or one word stuttered in its forms ("galaxy galaxy galaxies"). Legitimate repetition
    keeps its repeats identical (a chorus), varies only numbers and names (test logs, numbered steps) or
    repeats a short template with different content (lists)."""
    # markdown table rows are left out: cells legitimately repeat ("| test_a | passed |" in every row);
    # a looping table is ngram_loop's to judge
    prose = "\n".join(line for line in prose_of(text).splitlines() if line.count("|") < 2)
    # 1) stutter: one stem dominating a short window of words
    # a contraction is one word ("it's" stuttered as "it's, It's it's It's"), not "it" + "s"
    words = [_stem(w.lower().replace("’", "'")) for w in re.findall(r"[^\W\d_]+(?:['’][^\W\d_]+)*|\d+", prose)]
    win = min(th.stutter_window, len(words))
    if win >= th.stutter_window // 2:
        c = Counter(words[:win])
        for i in range(win, len(words) + 1):
            if i > win:
                c[words[i - 1]] += 1
                old = words[i - win - 1]
                c[old] -= 1
                if not c[old]:
                    del c[old]
            top, k = c.most_common(1)[0]
            if k >= th.stutter_min_share * win and len(top) >= 3:
                return [Finding("near_repeat", f"{top!r} (and its forms) is {k} of {win} words in a row",
                                " ".join(words[i - win:i])[:120])]
    # 2) sentences that are near-copies of each other
    pairs = [(w, " ".join(_LIST_MARK.sub("", x).lower().split())) for x in _SENT_SPLIT.split(prose)
             for w in [_norm_words(x)] if len(w) >= th.near_repeat_min_words][: th.near_repeat_max_sentences]
    sents = [w for w, _ in pairs]
    raw = [r for _, r in pairs]
    total = sum(len(s) for s in sents)
    # refrain lines (see _refrain) are set aside before near-copies are grouped
    lines = {" ".join(_LIST_MARK.sub("", x).lower().split()) for x in prose.splitlines()}
    refrain: set[int] = set()
    for i, a in enumerate(sents):
        if i in refrain:
            continue
        same = [j for j, b in enumerate(sents) if len(b) == len(a)
                and sum(x != y for x, y in zip(a, b, strict=True)) <= th.refrain_max_slots]
        if len(same) < th.near_repeat_min_copies or not _refrain([sents[j] for j in same], [raw[j] for j in same],
                                                                 lines, th):
            continue
        # the share counts every near-copy of the refrain, those with words inserted or dropped too
        near = set(same) | {k for k, c in enumerate(sents) if _similar(a, c) >= th.near_repeat_similarity}
        if sum(len(sents[k]) for k in near) / max(1, total) <= th.refrain_max_share:
            refrain.update(same)
    best: list[int] = []
    for i, a in enumerate(sents):
        if i in refrain:
            continue
        group = [i] + [j for j, b in enumerate(sents) if j != i and j not in refrain
                       and _similar(a, b) >= th.near_repeat_similarity]
        if len(group) > len(best):
            best = group
    if len(best) >= th.near_repeat_min_copies:
        variants = {tuple(sents[j]) for j in best}
        covered = sum(len(sents[j]) for j in best) / max(1, total)
        varied = len(variants) >= 2
        exact = max(Counter(raw[j] for j in best).values())  # copies identical with their numbers
        if (varied and covered >= th.near_repeat_min_share) or (
                not varied and exact >= th.exact_repeat_min_copies and covered >= th.exact_repeat_min_share):
            return [Finding("near_repeat", f"{len(best)} sentences are {'near-' if varied else ''}copies of one "
                            f"({len(variants)} variants, {covered:.0%} of the words)",
                            " | ".join(" ".join(sents[j]) for j in best[:3])[:160])]
    # 3) a whole enumeration repeated with small variations: its items are too short to be sentences
    runs = [u for u in (_norm_words(r) for r in _ENUM_RESTART.split(prose)) if len(u) >= th.near_repeat_min_words]
    run_words = sum(len(u) for u in runs)
    for run in runs if len(runs) >= th.near_repeat_min_copies else []:
        copies = [other for other in runs if _similar(run, other) >= th.near_repeat_similarity]
        kinds = {tuple(other) for other in copies}
        share = sum(len(other) for other in copies) / max(1, run_words)
        if len(copies) >= th.near_repeat_min_copies and len(kinds) >= 2 and share >= th.near_repeat_min_share:
            return [Finding("near_repeat", f"an enumeration restarts {len(copies)} times as near-copies of itself "
                            f"({len(kinds)} variants, {share:.0%} of its words)",
                            " | ".join(" ".join(other) for other in copies[:3])[:160])]
    # 4) a list of short items written again and again: its item sequence repeats with a period
    hit = _periodic_items(prose, th) or _repeated_passage(text, th)
    return [hit] if hit else []


def _repeated_passage(text: str, th: DetectorThresholds) -> Finding | None:
    """Most of a long answer is one long passage written three times and more, copies varied or not, code
    included ("```python def fibonacci(n): …``` This function works by …" six times over). On the words
    (numbers and punctuation left out): every run of th.passage_run_words words that occurs three times or
    more is marked; the marked words are th.passage_min_share of the text and the copies stand
    th.passage_min_period words apart or more (median). Sentence splitting cannot see this when the copies
    hold code or their fences no longer pair up. Table rows, test-log lines and refrain lines repeat with a
    short period; a back-to-back loop is ngram_loop's."""
    words = re.findall(r"[^\W\d_]+", text.lower())
    k = th.passage_run_words
    if len(words) < th.passage_min_words:
        return None
    where: dict[tuple[str, ...], list[int]] = {}
    for i in range(len(words) - k + 1):
        where.setdefault(tuple(words[i:i + k]), []).append(i)
    marked = [False] * len(words)
    gaps: list[int] = []
    for pos in where.values():
        if len(pos) >= 3:
            for i in pos:
                marked[i:i + k] = [True] * k
            gaps += [b - a for a, b in itertools.pairwise(pos)]
    share = sum(marked) / len(words)
    period = statistics.median_low(gaps) if gaps else 0
    if share < th.passage_min_share or period < th.passage_min_period:
        return None
    return Finding("near_repeat", f"{share:.0%} of {len(words)} words are copies of one passage of about {period} "
                   "words (written three times or more)", " ".join(words[:12]))


# a list item's marker: at a line start, or inline after whitespace (bullets, "1." / "1)")
_ITEM_MARK = re.compile(r"(?:^|(?<=\s))(?:[-*•+]|\d+[.)])\s+", re.M)


def _periodic_items(prose: str, th: DetectorThresholds) -> Finding | None:
    """List items (1-6 words each) whose sequence repeats with a period of 2+ items at least
    near_repeat_min_copies times, most items equal to the one a period before ("- Cherry - Banana - Grape."
    six times with a word changed here and there). One list, two different lists, or a list whose items
    share a template but not their content, do not repeat so."""
    parts = _ITEM_MARK.split(prose)
    if len(parts) < 2:
        return None
    items = []
    for part in parts[1:]:  # the text before the first marker is no item
        w = [x for x in _norm_words(part) if x not in _FILLERS]
        if 1 <= len(w) <= 6:
            items.append(tuple(w))
    n, copies = len(items), th.near_repeat_min_copies
    for period in range(2, n // copies + 1):
        pairs = n - period
        same = sum(1 for i in range(pairs) if _item_like(items[i], items[i + period]))
        if same / pairs >= 0.6 and len(set(items)) < n * 0.6:
            return Finding("near_repeat", f"a list of {period} items written {n / period:.1f} times over with small "
                           f"changes ({same} of {pairs} items equal to the one {period} before)",
                           " | ".join(" ".join(x) for x in items[: 2 * period])[:160])
    return None


_FILLERS = frozenset(["also", "always", "really", "then", "carefully", "and", "the", "a"])


def _item_like(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return a == b or (len(set(a) & set(b)) / max(1, len(set(a) | set(b)))) >= 0.5


DETECTORS = {
    "empty": detect_empty,
    "char_run": detect_char_run,
    "ngram_loop": detect_ngram_loop,
    "token_soup": detect_token_soup,
    "bad_chars": detect_bad_chars,
    "script_salad": detect_script_salad,
    "collapse": detect_collapse,
    "subword_repeat": detect_subword_repeat,
    "mojibake": detect_mojibake,
    "word_order": detect_word_order,
    "near_repeat": detect_near_repeat,
}


def score_text(text: str, th: DetectorThresholds | None = None) -> list[Finding]:
    """Run every enabled detector; an empty list means the text looks coherent."""
    th = th or DetectorThresholds()
    findings: list[Finding] = []
    for name, fn in DETECTORS.items():
        if name in th.disabled:
            continue
        findings.extend(fn(text, th))
        if name == "empty" and findings:
            break  # nothing else is meaningful on an empty answer
    return findings
