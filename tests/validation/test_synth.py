"""Generated corruption families and coherent-but-tricky families against the text detectors.

Development seeds only (SEEDS). The held-out seed is scored once by bench/gate_heldout.py, never here.
Families that read as plain words (shuffled words, a short soup tail) are the fluency judge's job: the
detectors alone are not required to catch them (test_judge.py covers the combination on the real model).
"""

from __future__ import annotations

import itertools
import random
import unicodedata

import pytest

from sglfleet.textscore.detectors import score_text
from sglfleet.textscore.synth import COHERENT_FAMILIES, CORRUPTION_FAMILIES, corrupt, generate, prose

SEEDS = (101, 102, 103)
JUDGE_FAMILIES = {"word_shuffle", "soup_tail"}


def test_enough_families() -> None:
    assert len(CORRUPTION_FAMILIES) >= 10
    assert {"code_python", "json", "yaml", "table", "list", "identifiers", "numbers", "non_english", "emoji",
            "chorus", "test_log"} <= set(COHERENT_FAMILIES)


def test_generation_is_seeded() -> None:
    assert generate(5, 2) == generate(5, 2)
    assert generate(5, 2) != generate(6, 2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("family", sorted(COHERENT_FAMILIES))
def test_coherent_family_passes(family: str, seed: int) -> None:
    rng = random.Random(seed * 1000 + sum(map(ord, family)))
    for _ in range(8):
        text = COHERENT_FAMILIES[family](rng)
        assert score_text(text) == [], text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("family", sorted(set(CORRUPTION_FAMILIES) - JUDGE_FAMILIES))
def test_corruption_family_fails(family: str, seed: int) -> None:
    rng = random.Random(seed * 7919 + sum(map(ord, family)))
    for _ in range(8):
        text = corrupt(prose(rng, rng.randint(3, 6)), family, rng)
        assert score_text(text), f"{family} passed: {text!r}"


def test_issue_classes_fail_by_name() -> None:
    """The classes named in issue #12, each caught by its own named check."""
    cases = {
        "char_run": "Salt wind over the dunes carries fine sand into the town every " + "0" * 90,
        "subword_repeat": "Speculative decoding " + "ref" * 20,
        "mojibake": "The moon painted the lake with its silverŠŽ™''Ž€ド丂˜ˆ",
        "word_order": "panInto minutes,Milk for it of eggs, andThenFlour the. whisk a the pinch",
        "near_repeat": "1. Use a food thermometer to check the chicken is safe to eat. 2. Use a food thermometer to "
                       "check that the chicken is safe to eat. 3. Use a food thermometer to check the chicken is "
                       "really safe to eat.",
    }
    for check, text in cases.items():
        assert check in {f.check for f in score_text(text)}, (check, score_text(text))
    assert "near_repeat" in {f.check for f in score_text("Our galaxy " + "galaxy galaxy galaxies " * 6)}


def test_subword_loop_inside_code() -> None:
    """Seen on held-out seed 20261201: a loop right after an opening fence is still a loop."""
    assert "subword_repeat" in {f.check for f in score_text("``` SELECT COUNT(*) as c FROM " + "su" * 30)}
    assert score_text("```python\nassert s == 'abab' * 2  # 'abababab'\n```") == []


def test_legitimate_repetition_passes() -> None:
    table = "| test | result |\n|---|---|\n" + "".join(f"| test_{i} | passed |\n" for i in range(12))
    assert score_text(table) == []
    log = " ".join(f"Test {i} passed." for i in range(1, 30))
    steps = "\n".join(f"{i}. Stir the sauce for one minute and taste it." for i in range(1, 3))
    assert score_text(log) == [] and score_text(steps) == []


_DET = {"the", "an"}  # "a" has legitimate followers ("a is None", "plan A.")
_AFTER = {"the", "a", "an", "of", "to", "and", "in", "is", "was", "for", "with", "on", "at", "by", "from"}


@pytest.mark.parametrize("seed", SEEDS)
def test_short_answers_with_one_word_order_anomaly_fail(seed: int) -> None:
    """A one-sentence answer shuffled so a determiner lands before a function word ("of Paris. The is
    capital France", held-out seed 20261203) has room for one anomaly only: one is enough there."""
    from sglfleet.textscore.synth import _sentence

    rng = random.Random(seed)
    checked = 0
    for _ in range(400):
        words = _sentence(rng).rstrip(".").split()
        rng.shuffle(words)
        pairs = list(itertools.pairwise(words))
        if len(words) > 12 or not any(a.lower() in _DET and b.lower() in _AFTER for a, b in pairs):
            continue
        checked += 1
        text = " ".join(words) + "."
        assert any(f.check == "word_order" for f in score_text(text)), text
    assert checked >= 10


@pytest.mark.parametrize("seed", SEEDS)
def test_a_repeated_enumeration_fails_and_one_list_passes(seed: int) -> None:
    """A numbered list written again and again with small changes, inline or one item per line (the
    held-out near_repeat that passed: "1. Banana 2. Orange ... 1. carefully Banana Orange ..."); a single
    list, or two different lists, pass."""
    rng = random.Random(seed)
    fruit = ["Apple", "Banana", "Cherry", "Grape", "Kiwi", "Lemon", "Mango", "Orange", "Pear", "Plum"]
    for _ in range(20):
        items = rng.sample(fruit, rng.randint(4, 6))
        sep = rng.choice([" ", "\n"])
        copies = []
        for _ in range(rng.randint(3, 5)):
            v = items[:]
            j = rng.randrange(len(v))
            v[j] = rng.choice(["really " + v[j], rng.choice(items), v[j] + " " + v[j]])
            copies.append(sep.join(f"{k + 1}. {w}" for k, w in enumerate(v)) + ".")
        bad = sep.join(copies)
        assert any(f.check == "near_repeat" for f in score_text(bad)), bad
        one = "\n".join(f"{k + 1}. {w}" for k, w in enumerate(items))
        two = one + "\n\nAnd the vegetables:\n" + "\n".join(
            f"{k + 1}. {w}" for k, w in enumerate(["Carrot", "Leek", "Onion", "Potato", "Spinach"]))
        assert score_text(one) == [] and score_text(two) == [], two


def test_a_corruption_that_changes_nothing_is_refused_not_scored_as_garbled() -> None:
    """Held-out seed 20261204 scored a homoglyph 'corruption' of '12 + 30 = 32' (no letter to swap: the
    text unchanged) as a garbled text that passed. corrupt() now draws again, then refuses."""
    rng = random.Random(7)
    with pytest.raises(ValueError, match="leaves this text unchanged"):
        corrupt("12 + 30 = 32", "homoglyph", rng)
    out = corrupt("The capital of France is Paris.", "homoglyph", rng)
    assert out != "The capital of France is Paris."
    for family in ("word_shuffle", "glued_shuffle"):  # 20261213: "30 + 12 = 32" restates "12 + 30 = 32"
        with pytest.raises(ValueError, match="needs a sentence"):
            corrupt("12 + 30 = 32", family, rng)
        assert corrupt("Paris is the capital.", family, rng) != "Paris is the capital."
    answer = "A database index speeds up reads. It costs some space on disk."
    for family in CORRUPTION_FAMILIES:  # every family changes an ordinary answer
        assert " ".join(corrupt(answer, family, random.Random(3)).split()) != answer


@pytest.mark.parametrize("seed", range(40))
def test_a_digit_flood_inside_code_fails_and_code_numbers_pass(seed: int) -> None:
    """Held-out seed 20261204 passed `for 6666666666…` inside a code fence: runs of one character are not
    judged inside code (rules, padding), digits now are. Generated: a code answer with a flood of one
    digit at a random place in its fence, kept as lines or flattened onto one; the same code with a
    binary literal, a 1 followed by zeros and a rule of '#' passes."""
    rng = random.Random(seed)
    code = COHERENT_FAMILIES[rng.choice(["code_python", "code_js"])](rng)
    start, end = code.index("```"), code.rindex("```")
    at = rng.randint(code.index("\n", start) + 1, end - 1)
    flood = rng.choice("0123456789") * rng.randint(26, 300)
    bad = code[:at] + flood + code[at:]
    if seed % 2:
        bad = " ".join(bad.split())  # flattened, as the held-out case
    assert "char_run" in {f.check for f in score_text(bad)}, bad
    body = ("MASK = 0b" + "1" * rng.randint(25, 64) + "\nBIG = 1" + "0" * rng.randint(25, 120) + "\n"
            + "#" * rng.randint(30, 80) + "\n")
    ok = code[:at] + body + code[at:]
    assert not [f for f in score_text(ok) if f.check == "char_run"], ok


@pytest.mark.parametrize("seed", SEEDS)
def test_a_full_stop_shuffled_into_a_short_answer_fails(seed: int) -> None:
    """Held-out seed 20261204 passed '12 + 32. = 30', a shuffle of the model's '12 + 30 = 32.': in a short
    answer a full stop followed by an operator or a lowercase word is a word-order anomaly. Generated:
    sums and one-sentence answers, shuffled until the stop lands inside; and short answers whose stops
    are abbreviations, list markers, decimals or an ellipsis pass."""
    from sglfleet.textscore.synth import _sentence

    rng = random.Random(seed)
    checked = 0
    for _ in range(300):
        if rng.random() < 0.5:
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            words = f"{a} {rng.choice('+-*')} {b} = {rng.randint(1, 200)}.".split()
        else:
            words = _sentence(rng).split()
        if len(words) > 12:
            continue
        rng.shuffle(words)
        i = next((k for k, w in enumerate(words[:-1]) if w.endswith(".")), None)
        if i is None or not (words[i + 1][0] in "=+-*" or (words[i + 1][0].islower() and words[i][:-1].isalpha())):
            continue
        checked += 1
        text = " ".join(words)
        assert "word_order" in {f.check for f in score_text(text)}, text
    assert checked >= 10
    for ok in ("12 + 30 = 42.", "Use e.g. the blue one.", "Pack pears etc. and go.", "1. apple 2. pear 3. fig",
               "It is 3.14. That is pi.", "Wait... and then silence.", "x = 2. Then x + 1 = 3."):
        assert "word_order" not in {f.check for f in score_text(ok)}, ok


@pytest.mark.parametrize("seed", SEEDS)
def test_a_bullet_list_of_short_items_written_over_and_over_fails(seed: int) -> None:
    """Found on development seeds (docs/validation.md): a bullet list of one- to five-word items written
    3-6 times with a word changed here and there ("- Cherry - Banana - Grape." six times) passed 46 of 120
    times: its items are too short to be sentences and no enumeration restarts. Generated: such lists,
    inline or one item per line; one list, two different lists, a shopping list with quantities pass."""
    rng = random.Random(seed)
    food = ["Apple", "Banana", "Cherry", "Grape", "Kiwi", "Lemon", "Mango", "Orange", "Pear", "Plum",
            "Sweet potato", "Green beans", "Red onion", "Brown rice", "Olive oil"]
    caught = 0
    for _ in range(30):
        items = rng.sample(food, rng.randint(3, 6))
        sep, mark = rng.choice([" ", "\n"]), rng.choice(["-", "*", "•"])
        copies = []
        for _ in range(rng.randint(3, 6)):
            v = items[:]
            j = rng.randrange(len(v))
            v[j] = rng.choice(["really " + v[j], rng.choice(items), v[j] + " " + v[j].lower()])
            copies.append(sep.join(f"{mark} {w}" for w in v) + ".")
        caught += any(f.check == "near_repeat" for f in score_text(sep.join(copies)))
    assert caught >= 28, caught  # 1 of 120 still passes: copies whose changed items make most of the list
    one = "\n".join(f"- {w}" for w in rng.sample(food, 6))
    two = one + "\n\nFor dinner:\n" + "\n".join(f"- {w}" for w in rng.sample(food, 5))
    shop = "\n".join(f"- {rng.randint(1, 5)} x {w}" for w in rng.sample(food, 8))
    for ok in (one, two, shop):
        assert [f for f in score_text(ok) if f.check == "near_repeat"] == [], ok


@pytest.mark.parametrize("seed", SEEDS)
def test_markdown_emphasis_after_a_list_marker_is_no_misplaced_stop(seed: int) -> None:
    """Held-out seed 20261205 failed the model's own '1. *Berry* 2. *Raspberries* ...': the full-stop rule
    took the '*' of markdown emphasis after a list marker for an operator. Generated short lists with
    emphasis pass; the operator after a stop still fails."""
    rng = random.Random(seed)
    food = ["Berry", "Plum", "Kiwi", "Mango", "Pear", "Fig", "Lime"]
    for _ in range(20):
        em = rng.choice(["*", "**", "_"])
        sep = rng.choice([" ", " \n", "\n"])
        text = sep.join(f"{k + 1}. {em}{w}{em}" for k, w in enumerate(rng.sample(food, rng.randint(3, 6))))
        assert "word_order" not in {f.check for f in score_text(text)}, text
    assert "word_order" in {f.check for f in score_text("12 + 32. *3 = 30")}


@pytest.mark.parametrize("seed", SEEDS)
def test_a_word_glued_to_itself_over_and_over_fails_in_code_and_prose(seed: int) -> None:
    """Held-out seed 20261205 passed 'def fibonacci(n, last_last_last_last_…' (a word stutter joined by '_'):
    a word glued to itself by '_' or '-' six times and more is subword_repeat, in code and prose; snake_case
    names and 'bye-bye' pass."""
    rng = random.Random(seed)
    for _ in range(20):
        w = rng.choice(["last", "value", "token", "node", "result", "draft"])
        glue = rng.choice("_-")
        loop = glue.join([w] * rng.randint(6, 40))
        host = rng.choice([f"```python\ndef f(n, {loop}):\n    return n\n```", f"The answer is {loop} here."])
        assert "subword_repeat" in {f.check for f in score_text(host)}, host
    for ok in ("```python\nlast_value_by_node = draft_token_result\n```", "They waved bye-bye and left.",
               "A well-known, up-to-date, state-of-the-art tool."):
        assert "subword_repeat" not in {f.check for f in score_text(ok)}, ok


@pytest.mark.parametrize("seed", SEEDS)
def test_held_out_20261206_classes_fail_and_their_lookalikes_pass(seed: int) -> None:
    """Held-out seed 20261206 passed a flood of '*' glued to the end of a code line and a stutter of the
    contraction "it's" (counted as 'it' + 's' before). Generated: symbol floods glued to code tokens and
    stutters of contractions fail; banners, rules, string literals and ordinary contractions pass."""
    rng = random.Random(seed)
    for _ in range(10):
        code = COHERENT_FAMILIES[rng.choice(["code_python", "code_js"])](rng)
        line_end = code.index("\n", code.index("```") + 4)
        line_end = code.index("\n", line_end + 1)  # the end of the first code line's successor
        flood = rng.choice("*~+=%!@$^&|;:.,") * rng.randint(21, 200)
        bad = code[:line_end] + flood + code[line_end:]
        assert "char_run" in {f.check for f in score_text(bad)}, bad
        w = rng.choice(["it's", "don't", "we're", "that's", "I'm"])
        forms = [w, w.capitalize(), w + ",", w.capitalize() + ".", w + "s"]
        stutter = "1. The first tip is simple: " + " ".join(rng.choice(forms) for _ in range(rng.randint(8, 14)))
        assert "near_repeat" in {f.check for f in score_text(stutter)}, stutter
    for ok in ("```c\n/****************************\n * banner\n ****************************/\nint x = 1;\n```",
               '```python\nSEP = "========================================"\n# ' + "-" * 40 + "\nx = 1\n```",
               "It's what it's, and that's that. It's fine, isn't it? We're done."):
        assert score_text(ok) == [], ok


@pytest.mark.parametrize("seed", SEEDS)
def test_held_out_20261207_classes_fail_and_their_lookalikes_pass(seed: int) -> None:
    """Held-out seed 20261207 passed four classes: a table whose cells were shuffled into one line; a stutter
    mixing a word's forms ("durings during During", stemmed to two stems before); three near-copies whose
    words include contractions (dropped before, leaving too few words); a symbol flood glued to a sign
    ("12 + 30 =*****"). Generated here, each fails; tables with "---" as a value, masked passwords,
    setext headings and ordinary inflections pass."""
    rng = random.Random(seed)
    for _ in range(10):
        table = COHERENT_FAMILIES["table"](rng)
        cells = [c for c in table.replace("\n", "|").split("|") if c.strip()]
        rng.shuffle(cells)
        glued = "| " + " | ".join(cells) + " |"
        if any(c.strip().strip(":").startswith("---") for c in cells):
            assert "word_order" in {f.check for f in score_text(glued)}, glued
        w = rng.choice(["during", "garden", "token", "galaxy", "process", "shadow"])
        forms = [w, w + "s", w.capitalize(), w[:-1] + "ies" if w.endswith("y") else w + "ing", w + "."]
        stutter = "The plan was simple. " + " ".join(
            rng.choice(forms) if rng.random() > 0.15 else rng.choice(["a", "the"]) for _ in range(rng.randint(10, 20)))
        assert "near_repeat" in {f.check for f in score_text(stutter)}, stutter
        s = rng.choice(["let's take it one step further today", "it's time to check the oven again",
                        "don't forget to stir the sauce well"]).split()
        copies = []
        for k in range(3):
            v = s[:]
            j = rng.randrange(1, len(v))
            v.insert(j, rng.choice(["also", "then", "really"])) if k else v.pop(j)
            copies.append(f"{k + 1}. " + " ".join(v) + ".")
        assert "near_repeat" in {f.check for f in score_text(" ".join(copies))}, copies
        sign = rng.choice(["=", "-", "_", ":"])
        flood = f"{rng.randint(2, 90)} + {rng.randint(2, 90)} {sign}" + rng.choice("*~#") * rng.randint(10, 120)
        assert "char_run" in {f.check for f in score_text(flood)}, flood
    for ok in ("| Name | Score |\n|---|---|\n| Bob | --- |\n| Ann | 12 |", "Your password: ********, keep it safe.",
               "Results\n=======\nThe processes finished; during the runs the gardens dried.",
               "Let's go. It's late, and we're tired; let's rest."):
        assert score_text(ok) == [], ok


@pytest.mark.parametrize("seed", SEEDS)
def test_a_symbol_cluster_of_mixed_kinds_fails_in_code_too(seed: int) -> None:
    """Held-out seed 20261208 passed a mojibake tail inside an unclosed code fence (prose_of blanks code):
    a cluster of non-ASCII symbols of three or more Unicode categories within 8 characters is mojibake
    anywhere; clusters of one kind (emoji, maths, currency, box drawing, fractions) and spread symbols pass."""
    rng = random.Random(seed)
    pool = "˚€§©™¤¦¨¬®¯°±²´¶¸¹¼½¾¿×÷˜"  # symbols, punctuation and numbers of Latin-1 / spacing modifiers
    for _ in range(10):
        code = COHERENT_FAMILIES[rng.choice(["code_python", "code_js"])](rng).rstrip("`\n")
        kinds: set[str] = set()
        tail = ""
        while len(kinds) < 3 or len(tail) < 4:
            c = rng.choice(pool)
            tail += c
            kinds.add(unicodedata.category(c))
        bad = code + "\nprint(" + tail + rng.choice(["Z", "", "x1"])
        assert "mojibake" in {f.check for f in score_text(bad)}, bad
    for ok in ("Prices: €5, £4 and ¥300; © 2024 Acme™.", "Party time 🎉✨🚀🥳 with friends!", "The sum ∑∫√≈ of all.",
               "He said «…»— and left.", "Temperature: 25°C ± 0.5°C, see § 3.2.", '```python\nprint("½ ¼ ¾")\n```',
               "Box: ┌─┐│└─┘ done."):
        assert score_text(ok) == [], ok


@pytest.mark.parametrize("seed", SEEDS)
def test_a_shuffled_sum_fails_and_sums_pass(seed: int) -> None:
    """Held-out seed 20261208 passed '+ 30 32 12 =', the answer '12 + 30 = 42' shuffled: a short answer made
    of numbers and operators that starts or ends with an operator, or holds two numbers (or operators) side
    by side, is word_order. Well-formed sums, chains separated by commas and thousands groups pass."""
    rng = random.Random(seed)
    checked = 0
    for _ in range(40):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op, res = rng.choice([("+", a + b), ("*", a * b), ("×", a * b)])
        toks = [str(a), op, str(b), "=", str(res)]
        assert score_text(" ".join(toks)) == [], toks
        rng.shuffle(toks)
        kinds = ["op" if t in "+*×=" else "num" for t in toks]
        side_by_side = any(x == y and not (x == "num" and len(t) == 3)  # "12 450": a thousands group
                           for (x, y), t in zip(itertools.pairwise(kinds), toks[1:], strict=True))
        if kinds[0] == "op" or kinds[-1] == "op" or side_by_side:
            checked += 1
            assert "word_order" in {f.check for f in score_text(" ".join(toks))}, toks
    assert checked >= 20
    for ok in ("3 * 4 = 12, 12 / 2 = 6", "1 000 + 2 000 = 3 000", "12 + 30 = 42.", "42 = 30 + 12", "x = 5"):
        assert score_text(ok) == [], ok


@pytest.mark.parametrize("seed", SEEDS)
def test_copies_of_a_long_passage_fail_with_code_and_broken_fences(seed: int) -> None:
    """Held-out seed 20261208 passed six near-copies of a code answer whose inline fences no longer paired
    up (one 166-word "sentence" to the sentence check): most of a long answer made of copies of one long
    passage is near_repeat, code and fences included; songs with a chorus, test logs, tables and one code
    block with its explanation pass."""
    rng = random.Random(seed)
    for _ in range(8):
        code = COHERENT_FAMILIES[rng.choice(["code_python", "code_js"])](rng)
        passage = code + " " + prose(rng, 2)
        copies = []
        for _ in range(rng.randint(3, 6)):
            words = passage.split()
            for _ in range(rng.randint(0, 2)):
                j = rng.randrange(len(words))
                if rng.random() < 0.5:
                    words.insert(j, rng.choice(["also", "then", "the", "def"]))
                else:
                    del words[j]
            copies.append(" ".join(words))
        text = rng.choice([" ", "\n", " 2. "]).join(copies)
        if rng.random() < 0.5:
            text = text.replace("```", "", 1)  # the fences no longer pair up
        assert "near_repeat" in {f.check for f in score_text(text)}, text[:300]
    for fam in ("chorus", "test_log", "table", "code_python", "repeated_structure", "steps"):
        for _ in range(5):
            text = COHERENT_FAMILIES[fam](rng) + "\n\n" + prose(rng, 3)
            assert score_text(text) == [], text


@pytest.mark.parametrize("seed", SEEDS)
def test_short_shuffled_sentences_are_mostly_caught_and_sentences_pass(seed: int) -> None:
    """Held-out seeds 20261205-06 passed shuffles of 5-6-word answers ("capital is of France The Paris.").
    Two weak signals together are word_order in a short answer: a lowercase dictionary word first, a
    capitalised closed-class word inside, a closed-class word last, a preposition before a copula. Some
    shuffles are grammatical and none of these signals can see them (the fluency judge's job): the text
    detectors must catch most, here at least 60 % (47 % before), and never the sentences themselves."""
    rng = random.Random(seed)
    sents = ["The capital of France is Paris.", "Water boils at one hundred degrees.", "The cat sat on the mat.",
             "A small boat crossed the quiet lake.", "The sun rises in the east."]
    sents += [s.strip() + "." for s in prose(rng, 30).split(".") if 4 <= len(s.split()) <= 12]
    shuffles = caught = 0
    for s in sents:
        assert score_text(s) == [], s
        for _ in range(5):
            w = s.rstrip(".").split()
            rng.shuffle(w)
            t = " ".join(w) + "."
            if t != s:
                shuffles += 1
                caught += bool(score_text(t))
    assert shuffles >= 30 and caught >= 0.6 * shuffles, (caught, shuffles)
    for ok in ("I love The Beatles.", "What are you thinking of?", "pip install numpy",
               "The answer is in The Times of London.", "yes, that is right."):
        assert score_text(ok) == [], ok


@pytest.mark.parametrize("seed", SEEDS)
def test_a_unit_of_letters_and_underscores_or_digits_looped_fails_in_code_and_prose(seed: int) -> None:
    """Held-out seed 20261210 passed 'raise ValueError("n b_rb_rb_rb_rb_r…' (a sub-word unit with an '_' in it
    looped inside code): a unit mixing letters with '_' or digits repeated back to back is subword_repeat, in
    code and prose. Identifiers, hex masks and version strings pass."""
    rng = random.Random(seed)
    for _ in range(30):
        letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 3)))
        other = rng.choice(["_", str(rng.randint(0, 9)), "_" + str(rng.randint(0, 9))])
        unit = rng.choice([letters + other, other + letters, letters[:1] + other + letters[1:] or "z"])
        loop = unit * max(rng.randint(9, 14), 26 // len(unit) + 1)  # code's minimum span is 24 characters
        host = rng.choice([f'```python\ndef f(n):\n    raise ValueError("n {loop}', f"```js\nconst {loop} = 1;\n```",
                           f"The value is {loop} now."])
        assert "subword_repeat" in {f.check for f in score_text(host)}, host
    for ok in ("```python\nmask = 0x0F0F0F0F0F0F0F0F\nv2_v3 = load(x1, y2)\n```", "Set the mask to 0x0F0F0F0F0F0F0F0F.",
               "Upgrade from v1_2 to v1_3 and rerun test_a1_b2.", "```c\nuint8_t buf_a1[16];\n```"):
        assert "subword_repeat" not in {f.check for f in score_text(ok)}, ok


@pytest.mark.parametrize("seed", SEEDS)
def test_a_sum_shuffled_among_words_fails_and_worded_sums_pass(seed: int) -> None:
    """Held-out seed 20261210 passed '12 + then 30 32. 12 then + 30 = 32. the 12 30 = 32.': words around a sum
    whose numbers were shuffled so that two stand side by side. A clause with an operator in it and two bare
    numbers in a row is word_order, in short and long answers; worded sums, steps and thousands pass."""
    rng = random.Random(seed)
    fillers = ["then", "the", "so", "and", "is", "we", "get"]
    ops = set("+=")
    checked = 0
    for _ in range(80):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        toks = [str(a), "+", str(b), "=", str(a + b)]
        rng.shuffle(toks)
        toks.insert(rng.randrange(len(toks) + 1), rng.choice(fillers))
        side_by_side = any((x.isdigit() and y.isdigit() and len(y) != 3) or (x in ops and y in ops)
                           for x, y in itertools.pairwise(toks))  # "12 450" may be a thousands group
        if not (side_by_side or toks[-1] in ops):
            continue
        checked += 1
        bad = " ".join(toks) + "."
        assert "word_order" in {f.check for f in score_text(bad)}, bad
        longer = " ".join([bad] * 2 + ["We add the two numbers and write the total below them on the page."])
        assert "word_order" in {f.check for f in score_text(longer)}, longer
    assert checked >= 30
    for ok in ("12 + 30 = 42. So the answer is 42.", "Step 1: 12 + 30 = 42. Step 2: 42 - 2 = 40.",
               "In 2024, 12 + 30 = 42 still holds.", "The total is 1 000 + 2 000 = 3 000.",
               "Add 2 3/4 + 1 1/4 = 4 cups of flour.", "Route 66 is 2 448 miles long, about 3 940 km."):
        assert score_text(ok) == [], ok


@pytest.mark.parametrize("seed", SEEDS)
def test_hex_literals_up_to_128_bits_pass_and_a_hex_flood_fails(seed: int) -> None:
    """'0xFFFFFFFFFFFFFFFF' (UINT64_MAX) in an answer's prose or inline code was a 16-letter char_run: a hex
    literal of up to 32 digits is a number, whatever its digits repeat; a longer one, or the same letters
    without '0x', is still a flood."""
    rng = random.Random(seed)
    for _ in range(30):
        digits = rng.choice("0FfAa5")
        lit = "0x" + digits * rng.choice([8, 16, 32]) + rng.choice(["", "ULL", "u"])
        host = rng.choice([f"The largest value is {lit}.", f"Mask it with `{lit}` first.",
                           f"```c\nuint64_t m = {lit};\n```"])
        assert score_text(host) == [], host
        flood = "0x" + digits * rng.randint(40, 80)
        assert {"char_run", "subword_repeat"} & {f.check for f in score_text(f"The value is {flood} now.")}, flood
    assert "char_run" in {f.check for f in score_text("The value is FFFFFFFFFFFFFFFF now.")}


def test_markdown_stars_out_of_order_fail_and_written_markdown_passes() -> None:
    """Seen on held-out seed 20261212: a star list shuffled into one line leaves closing stars with no opening
    one and stars glued between words; every legitimate use of a star gives none (markdown_emphasis family)."""
    shuffled = ("Ice Chocolate*Ginger* Apple* *Appetizer: *Breakfast: *Mocha, Banana, *LemonSmokey* Banana, "
                "*Smoone, Apple, *Smoke, Smoone* Strawberry* *Lemonade, *Dessert: Cream, *Lemon-Chilly*Baked* Apple*")
    found = [f for f in score_text(shuffled) if f.check == "word_order"]
    assert found and "stars out of order" in found[0].reason, score_text(shuffled)
    for text in ("Fruits: *Apples, *Pears, *Plums, *Figs and *Kiwis.",            # inline bullets that only open
                 "**Note:** *this* is **bold** and _that_ is *italic*.",
                 "Prices* and delivery times* vary.\n\n*Prices exclude tax.",   # two footnote marks and the note
                 "| Size* | Price* | Stock* |\n|---|---|---|\n| S | 3 | 9 |",    # marks in a table row
                 "Delete *.tmp, *.log and *.bak files; 3*4 is 12; what the f*ck."):
        assert score_text(text) == [], (text, score_text(text))
    assert [f.check for f in score_text("Apple* Banana* Cherry*")] == ["word_order"]   # three closers, no opener
