"""Seeded generators of coherent-but-tricky texts and of corrupted texts, by family.

The detectors are calibrated on *families*, not on example strings: every call with a new seed gives
new texts of the same class. Tests use a few development seeds; `bench/gate_heldout.py` scores a
held-out seed that was never looked at while tuning.

    coherent(rng) -> (family, text)          one of COHERENT_FAMILIES
    corrupt(base, family, rng) -> text       one of CORRUPTION_FAMILIES, applied to a coherent base
    generate(seed, n_per_family) -> [{"id", "label", "class", "text"}]

Corruptions are built the way a broken engine breaks output: a coherent start and then a flood, a
sub-word unit looped, bytes decoded with the wrong code page, words of the answer shuffled and glued,
a sentence repeated with small variations, vocabulary soup, a soup tail after a coherent head.
"""

from __future__ import annotations

import functools
import json
import random
import string
from collections.abc import Callable

# ----------------------------------------------------------------------------- coherent material

_SUBJECTS = ["The old lighthouse", "A small village", "The river", "Our team", "The new library", "My grandmother",
             "The morning train", "A curious fox", "The city council", "The research group", "The garden",
             "A young engineer", "The orchestra", "The bakery on the corner", "The storm", "The museum"]
_VERBS = ["stood quietly near", "welcomed visitors from", "flowed slowly past", "worked late on", "opened its doors to",
          "told stories about", "arrived early at", "watched the lights of", "voted to repair", "published a report on",
          "bloomed again after", "designed a bridge over", "played a concert for", "sold fresh bread to",
          "moved across", "displayed old maps of"]
_OBJECTS = ["the harbour", "the northern hills", "the main square", "the quarterly budget", "the children of the town",
            "the long winter", "the station", "the valley", "the damaged roads", "the effects of salt on steel",
            "the cold spring", "the wide canal", "the families in the park", "the early customers",
            "the open plains", "the ancient trade routes"]
_TAILS = ["before the sun went down", "every single weekend", "for more than twenty years",
          "while the rain kept falling",
          "with great care", "as the bells rang", "despite the cold weather", "in the middle of the night",
          "after a long discussion", "to everyone's surprise", "during the summer holidays", "without any help"]
_CONNECT = ["Later that day,", "At the same time,", "Because of this,", "In the end,", "Meanwhile,", "Afterwards,",
            "For this reason,", "Even so,", "On the other hand,", "As a result,"]

_TOPIC_SENTENCES = [
    "Salt wind over the dunes carries fine sand into the town every autumn.",
    "Speculative decoding lets a small draft model propose several tokens that the large model then verifies.",
    "To make pancakes, whisk the eggs and milk together, then fold in the flour and a pinch of salt.",
    "The moon rose above the hills and painted the lake with its silver light.",
    "A database index is a data structure that makes lookups faster at the cost of extra writes.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar and oxygen.",
    "Regular exercise improves sleep, lowers stress and strengthens the heart.",
    "The water cycle moves water from the oceans to the sky and back to the land as rain.",
    "A bicycle turns the force of your legs into motion through pedals, a chain and gears.",
    "Seasons happen because the Earth is tilted as it travels around the Sun.",
    "Recursion is when a function solves a problem by calling itself on a smaller piece of it.",
    "Use a food thermometer to check that chicken has reached a safe internal temperature.",
    "Our galaxy contains hundreds of billions of stars and at least as many planets.",
    "The committee agreed to meet again next week to review the final proposal.",
]


def _sentence(rng: random.Random) -> str:
    s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}."
    if rng.random() < 0.3:
        s = f"{rng.choice(_CONNECT)} {s[0].lower()}{s[1:]}"
    return s


def prose(rng: random.Random, n: int | None = None) -> str:
    n = n or rng.randint(3, 7)
    out = []
    for _ in range(n):
        out.append(rng.choice(_TOPIC_SENTENCES) if rng.random() < 0.35 else _sentence(rng))
    return " ".join(dict.fromkeys(out))


_IDENT_WORDS = ["user", "name", "page", "title", "count", "index", "buffer", "token", "cache", "request", "batch",
                "draft", "tree", "node", "mask", "size", "value", "result", "config", "server", "port", "path",
                "length", "budget", "score", "total", "items", "model", "layer", "weight"]


def _ident(rng: random.Random, style: str) -> str:
    parts = rng.sample(_IDENT_WORDS, rng.randint(2, 3))
    if style == "snake":
        return "_".join(parts)
    if style == "camel":
        return parts[0] + "".join(p.title() for p in parts[1:])
    return "".join(p.title() for p in parts)


def code_python(rng: random.Random) -> str:
    f, a, b = _ident(rng, "snake"), _ident(rng, "snake"), _ident(rng, "snake")
    n = rng.randint(2, 9)
    body = (f"```python\ndef {f}({a}: list[int], {b}: int = {n}) -> int:\n    total = 0\n"
            f"    for i, x in enumerate({a}):\n        if i % {b} == 0:\n            total += x * {n}\n"
            f"    return total\n```\n")
    return rng.choice(["Here is the function:\n\n", "Sure, this does it:\n", ""]) + body + rng.choice(
        [f"It sums every {n}th element, scaled by {n}.", "It runs in linear time.", ""])


def code_js(rng: random.Random) -> str:
    c, m = _ident(rng, "camel"), _ident(rng, "camel")
    return (f"```js\nconst {c} = async ({m}) => {{\n  const res = await fetch(`/api/${{{m}}}`);\n"
            f"  if (!res.ok) throw new Error(res.statusText);\n  return res.json();\n}};\n```\n"
            f"Call `{c}(id)` and await the result.")


def json_line(rng: random.Random) -> str:
    obj = {"model": rng.choice(["kimi-k2.6", "llama-3.1-70b", "qwen3-32b", "deepseek-v3"]),
           "tp": rng.choice([1, 2, 4, 8]), "ep": rng.choice([1, 8]),
           "attention_backend": rng.choice(["triton", "flashinfer", "fa3", "trtllm_mha"]),
           "speculative": {"algorithm": rng.choice(["DDTREE", "DFLASH", "EAGLE3", "NGRAM"]),
                           "budget": rng.choice([7, 15, 16, 31]), "topk": rng.choice([1, 2, 4, 8]),
                           "draft_model": rng.choice(["z-lab/dflash-b8", "sgl-project/eagle3-k26", "none"])},
           "mem_fraction_static": round(rng.uniform(0.6, 0.92), 2),
           "nccl": {"NCCL_P2P_LEVEL": rng.choice(["NVL", "PHB", "SYS"]), "NCCL_IB_HCA": "mlx5_0,mlx5_1"},
           "cuda_graph_max_bs_decode": rng.choice([64, 128, 256]), "enable_dp_attention": rng.random() < 0.5}
    keys = list(obj)
    rng.shuffle(keys)
    return json.dumps({k: obj[k] for k in keys})


def yaml_doc(rng: random.Random) -> str:
    return (f"server:\n  host: 0.0.0.0\n  port: {rng.randint(8000, 40000)}\n  mem_fraction_static: "
            f"{rng.uniform(0.6, 0.9):.2f}\n  attention_backend: {rng.choice(['triton', 'flashinfer'])}\n"
            f"speculative:\n  algorithm: {rng.choice(['DDTREE', 'DFLASH'])}\n  num_draft_tokens: "
            f"{rng.choice([8, 16])}\n  topk: {rng.choice([1, 4, 8])}\nlogging:\n  level: "
            f"{rng.choice(['info', 'debug', 'warning'])}\n  file: /var/log/sglang/{_ident(rng, 'snake')}.log\n")


def md_table(rng: random.Random) -> str:
    rows = rng.sample([("Dog", "Woof"), ("Cat", "Meow"), ("Cow", "Moo"), ("Duck", "Quack"), ("Sheep", "Baa"),
                       ("Owl", "Hoot"), ("Lion", "Roar"), ("Frog", "Ribbit")], rng.randint(3, 6))
    if rng.random() < 0.5:
        out = "| Animal | Sound |\n|--------|-------|\n" + "".join(f"| {a} | {s} |\n" for a, s in rows)
    else:
        out = "| budget | top-k | accept len | tok/s |\n|---:|---:|---:|---:|\n" + "".join(
            f"| {rng.choice([7, 15, 31])} | {rng.choice([1, 4, 8])} | {rng.uniform(1, 6):.2f} | "
            f"{rng.uniform(60, 200):.1f} |\n" for _ in rows)
    return rng.choice(["", "Here is the table:\n\n"]) + out


def bullet_list(rng: random.Random) -> str:
    items = rng.sample(["Apple", "Banana", "Cherry", "Mango", "Orange", "Pear", "Kiwi", "Grape", "Plum", "Lemon"],
                       rng.randint(3, 7))
    style = rng.choice(["- ", "* ", "num"])
    lines = [f"{i + 1}. {x}" if style == "num" else f"{style}{x}" for i, x in enumerate(items)]
    return "\n".join(lines)


def markdown_emphasis(rng: random.Random) -> str:
    """Markdown that uses stars every legitimate way: bold labels, italics, inline bullets that only open, a
    footnote mark or two with its note, a product of two numbers and a file glob."""
    fruit = rng.sample(["Apple", "Banana", "Cherry", "Mango", "Orange", "Pear", "Kiwi", "Grape", "Plum", "Lemon"], 5)
    notes = ["sweet and *crisp*", "best eaten *ripe*", "rich in vitamin C", "good in a *smoothie*", "keeps for a week"]
    parts = [rng.choice(["Here are some fruits:", "**Fruits to try:**", "Five fruits, with a note each:"])]
    parts += [f"{rng.choice(['- ', '* ', ''])}**{f}:** {n}." for f, n in zip(fruit, rng.sample(notes, 5), strict=True)]
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    extra = [f"Inline: *{fruit[0]}, *{fruit[1]}, *{fruit[2]}.",
             f"**Note:** prices* change weekly; a box of {a} * {b} = {a * b} fruits.",
             "Keep the lists in *.md files, the *originals* in *.txt.",
             f"*{fruit[3]}* and _{fruit[4]}_ are in season.\n\n*Prices exclude delivery."]
    parts += rng.sample(extra, rng.randint(1, len(extra)))
    return "\n".join(parts)


def numbered_steps(rng: random.Random) -> str:
    steps = ["Preheat the oven to 180°C.", "Mix the flour, sugar and eggs in a bowl.", "Pour the batter into a tin.",
             "Bake for 25 minutes.", "Let it cool on a rack.", "Dust with icing sugar and serve.",
             "Wash and dry your hands.", "Check the temperature with a food thermometer."]
    pick = rng.sample(steps, rng.randint(3, 6))
    return "\n".join(f"{i + 1}. {s}" for i, s in enumerate(pick))


def identifiers_prose(rng: random.Random) -> str:
    a, b, c = _ident(rng, "camel"), _ident(rng, "pascal"), _ident(rng, "snake")
    return (f"Call `{a}()` before you create the {b} object, then read {c} from the response. "
            f"The {b} class wraps getUserName and setPageTitle, and JavaScript code on iPhone and YouTube "
            f"pages uses the same helper.")


def numbers_text(rng: random.Random) -> str:
    return rng.choice([
        f"The results were {rng.uniform(0, 10):.5f}, {rng.uniform(0, 10):.5f} and {rng.randint(1, 9)},000,000 "
        f"requests served at {rng.uniform(99, 99.999):.3f}% availability.",
        f"Version {rng.randint(0, 3)}.{rng.randint(0, 30)}.{rng.randint(0, 99)} was released on "
        f"{rng.randint(2020, 2026)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}; it fixed {rng.randint(2, 90)} "
        f"bugs.",
        "A googol is 1" + "0" * 100 + " written out in full.",
        f"The hash is {''.join(rng.choice('0123456789abcdef') for _ in range(40))} and the port is "
        f"{rng.randint(1024, 65535)}.",
        f"{rng.randint(12, 99)} plus {rng.randint(10, 99)} is the answer; here it is {rng.randint(100, 999)}.",
        "Pi is about 3.14159265358979323846, and e is about 2.71828182845904523536.",
    ])


_FOREIGN = {
    "fr": ["La capitale de la France est Paris.", "C'est une ville célèbre pour la tour Eiffel et ses musées.",
           "Le matin, les marchés ouvrent tôt et les gens achètent du pain frais.",
           "Nous avons visité le château pendant les vacances d'été."],
    "de": ["Die Hauptstadt von Deutschland ist Berlin.", "Die Stadt hat viele Museen und eine lange Geschichte.",
           "Am Wochenende fahren wir mit dem Zug an die Küste.", "Das Wetter war kalt, aber die Sonne schien."],
    "es": ["El océano es inmenso y profundo.", "Sus olas cantan canciones antiguas a la orilla del mar.",
           "Mañana vamos a visitar a mis abuelos en el pueblo.", "La comida estaba deliciosa y barata."],
    "it": ["Roma è la capitale d'Italia.", "Ogni anno milioni di turisti visitano il Colosseo.",
           "La sera mangiamo la pizza in piazza con gli amici."],
    "ja": ["東京は日本の首都です。", "人口は約1400万人で、世界有数の大都市です。", "春には桜がとても美しく咲きます。"],
    "zh": ["海洋覆盖了地球表面的大约百分之七十一。", "它是地球上最大的生态系统。", "我们明天去公园散步。"],
    "ru": ["Москва — столица России.", "Это крупнейший город страны с богатой историей.",
           "Зимой здесь очень холодно и много снега."],
}


def foreign(rng: random.Random) -> str:
    lang = rng.choice(sorted(_FOREIGN))
    s = _FOREIGN[lang][:]
    rng.shuffle(s)
    sep = "" if lang in ("ja", "zh") else " "
    return sep.join(s[: rng.randint(2, len(s))])


def emoji_text(rng: random.Random) -> str:
    e = rng.sample(["🎉", "🌊", "🚀", "👍", "😊", "🔥", "🌧️", "👩‍💻", "🍕", "✅", "❤️"], 3)
    return f"{_sentence(rng)} {e[0]} {_sentence(rng)} {e[1]}{e[2]} Thanks for reading!"


def chorus(rng: random.Random) -> str:
    ch = rng.choice([["Row, row, row your boat,", "Gently down the stream.", "Merrily, merrily, merrily, merrily,",
                      "Life is but a dream."],
                     ["Oh the waves will roll and the wind will blow,", "And we'll sail away where the rivers go."],
                     ["Sing it loud and sing it clear,", "The summer days are finally here!"]])
    verses = [[_sentence(rng).rstrip(".") + ",", _sentence(rng)] for _ in range(rng.randint(1, 3))]
    out = []
    for v in verses:
        out += [*v, "", *ch, ""]
    return "\n".join(out).strip()


def test_log(rng: random.Random) -> str:
    n = rng.randint(5, 14)
    style = rng.choice(["sent", "pytest", "log"])
    if style == "sent":
        return " ".join(f"Test {i} passed." for i in range(1, n + 1)) + f" All {n} tests passed."
    if style == "pytest":
        return "\n".join(f"tests/test_{_ident(rng, 'snake')}.py::test_case_{i} PASSED" for i in range(n)) + (
            f"\n{n} passed in {rng.uniform(0.1, 9):.2f}s")
    return "\n".join(f"2026-11-{rng.randint(1, 28):02d}T10:{i:02d}:00Z INFO request {1000 + i} served in "
                     f"{rng.randint(5, 90)} ms" for i in range(n))


def repeated_structure(rng: random.Random) -> str:
    fruits = rng.sample([("Apples", "fiber"), ("Bananas", "potassium"), ("Oranges", "vitamin C"),
                         ("Spinach", "iron"), ("Almonds", "vitamin E"), ("Carrots", "vitamin A")], 4)
    return "\n".join(f"- {a} are rich in {b}." for a, b in fruits)


COHERENT_FAMILIES: dict[str, Callable[[random.Random], str]] = {
    "prose": prose, "code_python": code_python, "code_js": code_js, "json": json_line, "yaml": yaml_doc,
    "table": md_table, "list": bullet_list, "markdown_emphasis": markdown_emphasis, "steps": numbered_steps,
    "identifiers": identifiers_prose,
    "numbers": numbers_text, "non_english": foreign, "emoji": emoji_text, "chorus": chorus, "test_log": test_log,
    "repeated_structure": repeated_structure,
}


# ----------------------------------------------------------------------------- corruption families


@functools.cache
def _pieces() -> tuple[str, ...]:
    """Sub-word pieces (2-6 letters) cut from common English words: what a detokenized random id looks like."""
    from wordfreq import top_n_list

    out = set()
    for w in top_n_list("en", 8000):
        if w.isalpha() and len(w) >= 5:
            out.add(w[: len(w) // 2])
            out.add(w[len(w) // 2 :])
    return tuple(sorted(out))


def _head(base: str, rng: random.Random, frac: tuple[float, float] = (0.3, 0.7)) -> str:
    words = base.split()
    k = max(4, int(len(words) * rng.uniform(*frac)))
    return " ".join(words[:k])


def c_digit_flood(base: str, rng: random.Random) -> str:
    d = rng.choice("0123456789" + "000")
    sep = rng.choice(["", " ", ""])
    return _head(base, rng) + " " + d * rng.randint(30, 400) + sep


def c_subword_repeat(base: str, rng: random.Random) -> str:
    words = [w.strip(string.punctuation) for w in base.split() if len(w.strip(string.punctuation)) >= 4]
    w = rng.choice(words).lower() if words else "ref"
    a = rng.randint(0, max(0, len(w) - 3))
    unit = w[a : a + rng.randint(2, 4)]
    return _head(base, rng, (0.1, 0.5)) + " " + unit * rng.randint(6, 60)


_MOJI = ("ŠŽ™''Ž€˜ˆ‚„†‡‰‹›žŸœ¢£¤¥¦§¨©ª«¬®¯°±²³´µ¶·¸¹º»¼½¾¿ÃÂâÐÞßðþ" "ドア丂乁ツ゛ヾ㊙ⅷ¤ʼˇ˘˙˚˛˜˝")


def c_mojibake_tail(base: str, rng: random.Random) -> str:
    n = rng.randint(6, 40)
    tail = "".join(rng.choice(_MOJI) if rng.random() > 0.15 else rng.choice(string.ascii_letters + " ")
                   for _ in range(n))
    return _head(base, rng, (0.4, 0.9)).rstrip(".") + tail


def c_mojibake_codepage(base: str, rng: random.Random) -> str:
    text = base.replace("'", "’").replace(" - ", " — ")
    text = text.replace("cafe", "café") + rng.choice([" It’s “done” — café, naïve, déjà vu.", " Voilà: “ok” ✓"])
    bad = text.encode("utf-8").decode(rng.choice(["cp1252", "latin-1"]), errors="replace")
    return "".join(ch for ch in bad if not (0x80 <= ord(ch) < 0xA0)) if rng.random() < 0.5 else bad


def c_glued_shuffle(base: str, rng: random.Random) -> str:
    words = base.split()
    rng.shuffle(words)
    out = [words[0]]
    for w in words[1:]:
        if rng.random() < 0.3 and w[:1].isalpha():
            out[-1] = out[-1] + w[:1].upper() + w[1:]
        else:
            out.append(w)
    return " ".join(out)


def c_word_shuffle(base: str, rng: random.Random) -> str:
    words = base.split()
    rng.shuffle(words)
    return " ".join(words)


def c_near_repeat(base: str, rng: random.Random) -> str:
    sents = [s.strip() for s in base.replace("!", ".").split(".") if len(s.split()) >= 5]
    s = rng.choice(sents) if sents else base
    words = s.split()
    out = []
    for i in range(rng.randint(3, 8)):
        v = words[:]
        for _ in range(rng.randint(0, 2)):
            j = rng.randrange(len(v))
            op = rng.random()
            if op < 0.4:
                v[j] = rng.choice(words)
            elif op < 0.7 and len(v) > 4:
                del v[j]
            else:
                v.insert(j, rng.choice(["also", "always", "really", "then", "the", "carefully"]))
        prefix = f"{i + 1}. " if rng.random() < 0.5 else ""
        out.append(prefix + " ".join(v) + ".")
    sep = rng.choice([" ", "\n"])
    return sep.join(out)


def c_word_stutter(base: str, rng: random.Random) -> str:
    words = [w.strip(string.punctuation) for w in base.split() if len(w.strip(string.punctuation)) >= 4]
    w = rng.choice(words).lower() if words else "galaxy"
    forms = [w, w, w + "s", w.capitalize(), w + ",", w + "."]
    k = rng.randint(10, 40)
    stutter = " ".join(rng.choice(forms) if rng.random() > 0.15 else rng.choice(["the", "a", "of"]) for _ in range(k))
    return _head(base, rng, (0.0, 0.5)) + " " + stutter


def c_token_soup(base: str, rng: random.Random) -> str:
    p = _pieces()
    out = []
    for _ in range(rng.randint(10, 40)):
        t = "".join(rng.choice(p) for _ in range(rng.randint(1, 3)))
        out.append(t.capitalize() if rng.random() < 0.3 else t)
    return " ".join(out)


def c_soup_tail(base: str, rng: random.Random) -> str:
    p = _pieces()
    tail = " ".join("".join(rng.choice(p) for _ in range(rng.randint(1, 2))) for _ in range(rng.randint(6, 16)))
    return _head(base, rng, (0.5, 0.9)) + " " + tail


def c_punct_flood(base: str, rng: random.Random) -> str:
    return _head(base, rng) + rng.choice("!?.,;:*~^") * rng.randint(10, 200)


def c_block_loop(base: str, rng: random.Random) -> str:
    words = base.split()
    a = rng.randrange(max(1, len(words) - 4))
    block = " ".join(words[a : a + rng.randint(1, 5)])
    return _head(base, rng) + " " + " ".join([block] * rng.randint(6, 20))


def c_bad_bytes(base: str, rng: random.Random) -> str:
    chars = list(base)
    for _ in range(rng.randint(1, 5)):
        chars.insert(rng.randrange(len(chars)), rng.choice(["\ufffd", "\x00", "\x1b", "\ue000", "\x07"]))
    return "".join(chars)


def c_homoglyph(base: str, rng: random.Random) -> str:
    table = str.maketrans({"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "x": "х", "i": "і"})
    words = base.split()
    return " ".join(w.translate(table) if rng.random() < 0.5 else w for w in words)


CORRUPTION_FAMILIES: dict[str, Callable[[str, random.Random], str]] = {
    "digit_flood": c_digit_flood, "subword_repeat": c_subword_repeat, "mojibake_tail": c_mojibake_tail,
    "mojibake_codepage": c_mojibake_codepage, "glued_shuffle": c_glued_shuffle, "word_shuffle": c_word_shuffle,
    "near_repeat": c_near_repeat, "word_stutter": c_word_stutter, "token_soup": c_token_soup,
    "soup_tail": c_soup_tail, "punct_flood": c_punct_flood, "block_loop": c_block_loop, "bad_bytes": c_bad_bytes,
    "homoglyph": c_homoglyph,
}


WORD_ORDER_FAMILIES = frozenset({"word_shuffle", "glued_shuffle"})


def corrupt(base: str, family: str, rng: random.Random, tries: int = 5) -> str:
    """The base text corrupted the way `family` corrupts output.

    A corruption that leaves the text as it was (up to whitespace) is not one: a homoglyph swap on
    "12 + 30 = 32" has no letter to swap, and such a no-op was once scored as a garbled text that
    passed. It is drawn again (`tries` times), then refused with ValueError: the caller picks
    another base. Word-order families also refuse a base with fewer than three words of letters: the
    order of "12 + 30 = 32" carries no sentence, and its shuffle "30 + 12 = 32" restates it (held-out seed
    20261213 scored that as a garbled text that passed)."""
    if family in WORD_ORDER_FAMILIES and sum(1 for w in base.split() if any(c.isalpha() for c in w)) < 3:
        raise ValueError(f"corruption {family!r} needs a sentence to shuffle, not {base[:60]!r}")
    norm = " ".join(base.split())
    for _ in range(tries):
        out = CORRUPTION_FAMILIES[family](base, rng)
        if " ".join(out.split()) != norm:
            return out
    raise ValueError(f"corruption {family!r} leaves this text unchanged: {base[:60]!r}")


def generate(seed: int, n_per_family: int = 5, bases: list[str] | None = None) -> list[dict[str, str]]:
    """Coherent texts of every family and corruptions of every family, reproducible from the seed.

    Corruptions are applied to `bases` when given (e.g. real model answers), else to generated prose.
    """
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    for fam, fn in COHERENT_FAMILIES.items():
        for i in range(n_per_family):
            rows.append({"id": f"s{seed}-ok-{fam}-{i}", "label": "ok", "class": fam, "text": fn(rng)})
    for fam in CORRUPTION_FAMILIES:
        for i in range(n_per_family):
            base = rng.choice(bases) if bases else prose(rng, rng.randint(3, 6))
            try:
                text = corrupt(base, fam, rng)
            except ValueError:  # nothing in this base for the family to corrupt: generated prose instead
                text = corrupt(prose(rng, rng.randint(3, 6)), fam, rng)
            rows.append({"id": f"s{seed}-bad-{fam}-{i}", "label": "bad", "class": fam, "text": text})
    return rows
