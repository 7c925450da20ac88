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
language). Thresholds come from `validation.config.DetectorThresholds`.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

from validation.config import DetectorThresholds


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


def prose_of(text: str) -> str:
    """The text with code, URLs and e-mail addresses blanked out (same length is not kept)."""
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


def detect_char_run(text: str, th: DetectorThresholds) -> list[Finding]:
    m = re.search(r"\n{" + str(th.max_newline_run + 1) + ",}", text)
    if m:  # checked on the raw text: a flood of blank lines is garbage inside code fences too
        return [Finding("char_run", f"{len(m.group(0))}x '\\n' in a row (limit {th.max_newline_run})",
                        excerpt(text, m.start(), m.start() + 1))]
    scan = _FENCE.sub("\n", text) if th.skip_code_for_runs else text
    for m in re.finditer(r"(.)\1+", scan, re.S):
        ch, n = m.group(1), len(m.group(0))
        if ch == "\n":
            limit = th.max_newline_run
        elif ch.isspace():
            limit = th.max_space_run
        elif ch in _RULE_CHARS:
            limit = th.max_rule_run
        elif ch == "0":
            limit = th.max_zero_run
        elif ch.isalpha():
            limit = th.max_letter_run
        elif ch.isdigit():
            limit = th.max_digit_run
        elif ch in _OPEN_CLOSE:
            limit = th.max_bracket_run
        else:
            limit = th.max_symbol_run
        if n > limit:
            return [Finding("char_run", f"{n}x {ch!r} in a row (limit {limit})", excerpt(scan, m.start(), m.end()))]
    return []


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
                    covered >= th.loop_min_share * n and covered >= 12)
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


DETECTORS = {
    "empty": detect_empty,
    "char_run": detect_char_run,
    "ngram_loop": detect_ngram_loop,
    "token_soup": detect_token_soup,
    "bad_chars": detect_bad_chars,
    "script_salad": detect_script_salad,
    "collapse": detect_collapse,
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
