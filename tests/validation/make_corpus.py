"""Writes corpus.jsonl: the labeled calibration corpus of the garbage detectors.

Run `python tests/validation/make_corpus.py` after editing. label: "ok" (coherent, often easy to
misjudge) or "bad" (garbled, with the failure class it represents in "class").
"""

import json
from pathlib import Path

OK = {
    "json_tech_line": '{"served_model_name": "kimi-k2.6", "attention_backend": "flashinfer", "speculative_algorithm": '
                      '"DDTREE", "nccl_p2p_level": "NVL", "kv_cache_dtype": "fp8_e4m3", "cuda_graph_max_bs": 128}',
    "numbered_same_start": "1. Use a food thermometer to check the chicken.\n2. Rest the meat for five minutes.\n"
                           "3. Slice it against the grain and serve.",
    "md_table": "| Animal | Sound |\n|--------|-------|\n| Dog    | Woof  |\n| Cat    | Meow  |\n| Cow    | Moo   |",
    "md_table_wide": "| Model | Budget | Top-k | tok/s |\n|:------|-------:|------:|------:|\n| chain | 7 | 1 | 98.2 |\n"
                     "| tree | 16 | 4 | 150.4 |\n| tree | 32 | 8 | 141.0 |",
    "python_code": "```python\ndef fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
                   "    return a\n```\nThis runs in O(n) time.",
    "cpp_code": "```cpp\n#include <vector>\nint sum(const std::vector<int>& v) {\n  int s = 0;\n  for (int x : v) s += x;\n"
                "  return s;\n}\n```",
    "json": '{"name": "kimi-k2.6", "tp": 8, "ep": 8, "speculative": {"algorithm": "DDTREE", "budget": 16, "topk": 4}}',
    "yaml": "server:\n  port: 30000\n  mem_fraction_static: 0.85\nspeculative:\n  algorithm: DFLASH\n  num_draft_tokens: 8\n",
    "bullets": "- Apple\n- Banana\n- Cherry\n- Mango\n- Orange",
    "numbered": "1. Preheat the oven to 180°C.\n2. Mix flour, sugar and eggs.\n3. Bake for 25 minutes.\n4. Let it cool.",
    "numbers": "The results were 3.14159, 2.71828, 1.41421 and 1,000,000 requests served at 99.99% availability.",
    "big_number": "A googol is 10000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000 "
                  "written out in full.",
    "chorus": "Row, row, row your boat,\nGently down the stream.\nMerrily, merrily, merrily, merrily,\nLife is but a dream.\n\n"
              "Row, row, row your boat,\nGently down the stream.\nMerrily, merrily, merrily, merrily,\nLife is but a dream.",
    "test_log": "Test 1 passed. Test 2 passed. Test 3 passed. Test 4 passed. Test 5 passed. Test 6 passed. "
                "Test 7 passed. Test 8 passed. All 8 tests passed.",
    "one_word": "Paris.",
    "one_number": "42",
    "yes": "Yes.",
    "french": "La capitale de la France est Paris. C'est une ville célèbre pour la tour Eiffel et ses musées.",
    "german": "Die Hauptstadt von Deutschland ist Berlin. Die Stadt hat viele Museen und eine lange Geschichte.",
    "spanish": "El océano es inmenso y profundo; sus olas cantan canciones antiguas a la orilla del mar.",
    "japanese": "東京は日本の首都です。人口は約1400万人で、世界有数の大都市です。",
    "chinese": "海洋覆盖了地球表面的大约百分之七十一，是地球上最大的生态系统。",
    "russian": "Москва — столица России. Это крупнейший город страны с богатой историей.",
    "arabic": "القاهرة هي عاصمة مصر وأكبر مدنها، وتقع على ضفاف نهر النيل.",
    "translation": "The word for 'hello' in Russian is 'привет', in Japanese 'こんにちは', and in Greek 'γεια σου'.",
    "emoji": "Great job! 🎉🎉🎉 The deployment passed every check ✅ and the team celebrated 🥳.",
    "urls": "See https://docs.sglang.ai/backend/speculative_decoding.html and https://github.com/sgl-project/sglang/"
            "issues/12345 for details, or mail ops-team@example.com.",
    "long_words": "Pneumonoultramicroscopicsilicovolcanoconiosis and antidisestablishmentarianism are famously long words.",
    "camel_prose": "Call getUserName() first, then pass the result to updateAccountSettings; the JavaScript client "
                   "and the iPhone app on YouTube use the same PowerPoint-style slides.",
    "identifiers": "Set CUDA_HOME, FLASHINFER_CUDA_ARCH_LIST=12.0f and SGLANG_ENABLE_JIT_DEEPGEMM=0 before launching "
                   "sglang.launch_server with --speculative-algorithm DFLASH.",
    "hr_rule": "Summary\n=======\n\nEverything passed.\n\n------------------------------------------------\n\nDetails below.",
    "ellipsis": "Wait for it... and then... silence.",
    "exclaim": "Wow!!! That is amazing!",
    "poem": "The ocean breathes in silver light,\nIts waves roll softly through the night,\nThe gulls call out, the"
            " tides obey,\nAnd dawn returns to greet the bay.",
    "prose": "The sky looks blue because molecules in the atmosphere scatter shorter wavelengths of sunlight more "
             "strongly than longer ones. This effect, called Rayleigh scattering, sends blue light in every "
             "direction, so wherever we look we see it.",
    "smollm_loop": "In the depths of the ocean, where shadows play,\nA place of endless wonder,\nThe ocean's a place of "
                   "endless love,\nA place of endless beauty,\nA place of endless mystery,\nA place of endless mystery,"
                   "\nA place of endless wonder,",
    "math": "Let x = 12 + 30. Then x = 42, and 2x = 84; (x − 2)² = 1600.",
    "chemistry": "Water is H₂O, table salt is NaCl and glucose is C₆H₁₂O₆.",
    "shell": "Run `make deploy HOST=pcie-01` and then `tail -f /var/log/sglang/server.log | grep -i error`.",
    "diff": "```diff\n- self.num_draft_tokens = args.speculative_num_draft_tokens\n+ self.num_draft_tokens = verify_width\n```",
    "csv": "id,name,score\n1,alice,93\n2,bob,88\n3,carol,97",
    "names": "Chavez met McClellan, O'Brien and Nguyen in Reykjavík before flying to Kraków and São Paulo.",
    "dialog": "\"Are you coming?\" she asked.\n\"In a minute,\" he said. \"Let me finish this email first.\"",
    "hex": "The commit is 3f9a2c1e and the digest is sha256:9b74c9897bac770ffc029102a200c5de.",
    "repeated_word_ok": "Very, very, very good.",
    "laugh": "Hahaha, that's a good one!",
    "tags": "Keywords: python docker kubernetes ansible terraform prometheus grafana nginx redis postgres",
    "comma_list": "Pack apples, bananas, cherries, mangoes, oranges, grapes, kiwis, pears, plums, figs, dates and limes.",
    "title_case": "Ten Simple Rules for Running Large Language Models in Production Without Losing Sleep",
    "poem_lines": "Silver waves on silent shores,\nWind that whispers, tide that roars,\nStars above the ocean deep,\n"
                  "Guard the dreams the sailors keep.",
    "blank_lines": "First paragraph.\n\n\n\nSecond paragraph after a few blank lines.",
}

BAD = {
    "digit_flood": ("char_run", "Salt wind over " + "0" * 64),
    "subword_loop": ("subword_repeat", "Speculative decoding " + "ref" * 16),
    "mojibake_tail": ("mojibake", "The moon rose and painted the lake with its silverŠŽ™''Ž€"
                      "ド丂˜ˆ"),
    "glued_shuffle": ("word_order", "panInto minutes,Milk for it of eggs, andThenFlour the. whisk a the pinch of"),
    "thermometer_repeat": ("near_repeat", "1. Use a food thermometer to check that the chicken is cooked through. "
                           "2. Use a food thermometer to check that the chicken is fully cooked through. 3. Use a "
                           "food thermometer to check the chicken is cooked all the way through."),
    "galaxy_stutter": ("near_repeat", "Our galaxy is huge. galaxy galaxy galaxies galaxy, galaxy the galaxies "
                       "galaxy galaxy galaxies galaxy galaxy"),
    "seed_bang": ("char_run", "The.r!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"),
    "seed_glued": ("token_soup", "poemownersWrite"),
    "seed_glued_ctx": ("token_soup", "Here is a poemownersWrite about theoceanWaves rolling in."),
    "seed_reference": ("token_soup", "The Referenceuma abuma poem about the ocean: waves abumaref oceanuma lineWrite"),
    "smollm_t3": ("token_soup", " stencilpans term Chavez facing aquatic arbitquiries anew camelsoured monkeysbling lose "
                  "croc McClell oppression radioactive hydrophobicImportant (+amoto without handles Lemon lsuitively "
                  "arrest dayWW stimulates humorous overt elif differ everything abbreviation"),
    "smollm_t20": ("token_soup", " Blueprint Photographsberg Lafayette intriguing CM marcadal coercive Autobi voy "
                   "crestadding merch Owl cic lord Arn前\ufffd FusionChem April glaucoma bluish Tucker whitening Nep "
                   "white meadowPhysDetailsieve nutrient talentrey Verde}/ vari remembers"),
    "empty": ("empty", ""),
    "whitespace": ("empty", "   \n\n  \t "),
    "word_loop": ("ngram_loop", "The ocean is " + "the the the the " * 20),
    "phrase_loop": ("ngram_loop", "Sure! " + "I am a helpful assistant. " * 12),
    "comma_loop": ("char_run", "The answer is 42" + ",,,,,,,,,,,,,,,,,,,,,,,,,,,,"),
    "question_run": ("char_run", "What?????????????????"),
    "newline_token": ("ngram_loop", "Hello\n" + "<|im_end|>\n" * 15),
    "replacement": ("bad_chars", "The ocean \ufffd\ufffd is \ufffd deep and \ufffd blue."),
    "control": ("bad_chars", "Paris is the capital\x00\x01\x02 of France\x1b."),
    "homoglyph": ("script_salad", "Тhе осеаn is vаst аnd dеер аnd full оf lіfе"),  # Cyrillic letters inside Latin words
    "script_mix": ("script_salad", "ocean海洋океанمحيط ocean海 waveволна wellالنهر sea海mar oceanokeanos"),
    "collapse_soup": ("collapse", "The ocean is a vast body of salt water that covers most of the planet. It is home "
                      "to countless creatures and shapes the weather. Its waves carry energy across thousands of "
                      "miles. zxq vrumbl plofta ghrenk skwibbet traznol quimbus flarnish dworp blenquo grattix "
                      "snorple vindex qualdro mibbet"),
    "collapse_symbols": ("collapse", "Here is the function you asked for. It computes the sum of a list of numbers "
                         "and returns the total to the caller when it is done with all of the values in the list "
                         "}]){;>)<]}{[;)]}>{;>)]}{;[);>}]{;)]]>{;)}]{;[>)}];{>)]};{"),
    "subword_soup": ("token_soup", "ingtheationedlyment ersingtion abilitying nessful izationed mentless ousing "
                     "tionally edness fulness ingly"),
    "mask_garbage": ("token_soup", "Theocean iswaves thebluedeep ofthe seaandsky wherethe fishswim andthe birdsfly"),
    "digit_run": ("char_run", "The number is 1111111111111111111111111111111111111111"),
    "letter_run": ("char_run", "Theeeeeeeeeeeeeeeeeeeee ocean"),
    "eos_spam": ("ngram_loop", "Answer: Paris" + "</s></s>" * 20),
    "bracket_run": ("char_run", "def f(x): return ((((((((((((((((x"),
    "vocab_soup": ("token_soup", "lantern Quarterly harvest Mosaic pinned velocity Granite orbit Tuesday ferment "
                   "Saxon ledger"),
    "vocab_soup_tail": ("token_soup", "Photosynthesis turns light into chemical energy, and then copper Meadow "
                        "spindle Verdict orchard Pacific tremor Ballot quartz Lantern embers"),
    "short_loop": ("ngram_loop", "Once upon a time Once upon a time Once upon a time Once upon a time "),
    "newline_flood": ("char_run", "The answer is below." + "\n" * 30),
}


def main() -> None:
    out = Path(__file__).with_name("corpus.jsonl")
    with open(out, "w", encoding="utf-8") as fh:
        for k, text in OK.items():
            fh.write(json.dumps({"id": f"ok-{k}", "label": "ok", "text": text}, ensure_ascii=False) + "\n")
        for k, (cls, text) in BAD.items():
            fh.write(json.dumps({"id": f"bad-{k}", "label": "bad", "class": cls, "text": text},
                                ensure_ascii=False) + "\n")
    print(f"{len(OK)} ok + {len(BAD)} bad -> {out}")


if __name__ == "__main__":
    main()
