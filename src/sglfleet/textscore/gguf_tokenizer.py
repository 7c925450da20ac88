"""The reference model's tokenizer, in process, built from the GGUF file's own vocabulary and merges.

The numpy judge engine needs token ids and pieces, nothing else from llama.cpp; a llama.cpp child server
kept only to tokenize costs its start-up on every gate run (docs/validation.md). This builds the same
byte-level BPE with the `tokenizers` library for the pre-tokenizers whose rules are known here (GGUF
`tokenizer.ggml.pre`); for any other file `cached_tokenizer` returns None and the judge keeps the
llama.cpp tokenizer. Equality with llama.cpp, token by token, is tested on every corpus and generated text
(tests/validation/test_judge.py).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from sglfleet.textscore.cachekey import source_key

# The pre-tokenizers rebuilt here, each tested token for token against llama.cpp: smollm (each digit on its
# own, then the GPT-2 byte-level split). Any other `tokenizer.ggml.pre` is left to llama.cpp.
_DIGITS_THEN_GPT2 = {"smollm"}
FORMAT = 1   # of the cached tokenizer file
CONTROL = 3  # tokenizer.ggml.token_type of a control token (<|im_start|>): matched whole, as llama.cpp does


class GGUFTokenizer:
    """Byte-level BPE tokenizer (`tokenizers`), as llama.cpp tokenizes the GGUF file it was built from."""

    def __init__(self, tok: Any) -> None:
        self._tok = tok
        self._pieces: dict[int, str] = {}

    @classmethod
    def build(cls, tokens: list[str], merges: list[str], types: list[int], pre: str) -> GGUFTokenizer:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [(a, b) for a, _, b in (m.partition(" ") for m in merges)]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre not in _DIGITS_THEN_GPT2:
            raise ValueError(f"pre-tokenizer {pre!r} is not rebuilt in process")
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, ty in zip(tokens, types, strict=True) if ty == CONTROL])
        return cls(tok)

    def piece(self, i: int) -> str:
        """A token's text (invalid UTF-8 of a partial character shown as U+FFFD, as the judge's reports do)."""
        p = self._pieces.get(i)
        if p is None:
            p = self._pieces[i] = self._tok.decode([i], skip_special_tokens=False)
        return p

    def tokenize(self, text: str) -> list[tuple[int, str]]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [(i, self.piece(i)) for i in ids]


def _from_gguf(path: Path) -> GGUFTokenizer | None:
    from gguf import GGUFReader

    r = GGUFReader(str(path))

    def field(key: str) -> Any:
        f = r.fields.get(key)
        return f.contents() if f is not None else None

    pre = field("tokenizer.ggml.pre") or "default"
    if field("tokenizer.ggml.model") != "gpt2" or pre not in _DIGITS_THEN_GPT2:
        return None
    tokens, merges = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.merges")
    types = field("tokenizer.ggml.token_type")
    if not tokens or not merges or not types:
        return None
    return GGUFTokenizer.build(list(tokens), list(merges), list(types), pre)


def cached_tokenizer(path: str | Path, cache_dir: Path) -> GGUFTokenizer | None:
    """The in-process tokenizer of a GGUF model, or None when its tokenizer is not one rebuilt here.

    Reading the vocabulary out of the GGUF file takes seconds (the Python GGUF parser); the built
    tokenizer is kept as `tokenizers` JSON beside the judge's weight cache, keyed like it by the file's
    name, size and content hash, written atomically, and loads in about 0.1 s. An unsupported file leaves a
    marker, so it is parsed once. ValueError when the file cannot be read."""
    from tokenizers import Tokenizer

    src = Path(path)
    key = cache_dir / f"{source_key(src)}.tokenizer-v{FORMAT}"
    js, none = key.with_name(key.name + ".json"), key.with_name(key.name + ".unsupported")
    if js.is_file():
        return GGUFTokenizer(Tokenizer.from_file(str(js)))
    if none.is_file():
        return None
    try:
        tk = _from_gguf(src)
    except Exception as exc:  # a truncated or foreign file fails inside the GGUF parser in many ways
        raise ValueError(f"cannot read the tokenizer of {src}: {type(exc).__name__}: {exc}") from exc
    cache_dir.mkdir(parents=True, exist_ok=True)
    dst = js if tk is not None else none
    tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}-{threading.get_ident()}")
    try:
        if tk is not None:
            tk._tok.save(str(tmp))
        else:
            tmp.write_text("tokenizer not rebuilt in process: the judge tokenizes with llama.cpp\n")
        tmp.replace(dst)
    finally:
        tmp.unlink(missing_ok=True)
    return tk
