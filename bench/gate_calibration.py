"""Calibrate the garbage detectors: false-pass and false-fail rates, written up in docs/detectors-lab.md.

    python bench/gate_calibration.py [--target URL] [--n 200] [--out docs/results/validation-calibration.json]

Two sets are scored with the gate's default thresholds:

1. the hand-labeled corpus in tests/validation/corpus.jsonl (coherent-but-tricky vs garbled); the
   detectors were tuned on it, so it measures regressions, not generalisation;
2. a held-out set built from a real served model (the embedded target unless --target is given):
   coherent = its real answers to varied prompts at T=0..1; garbled = the same answers corrupted the
   ways a broken engine corrupts them, using the model's *own vocabulary* (random token ids
   detokenized by the server): sub-word soup, a soup tail after a coherent head (collapse), one
   token repeated, a short block looped, replacement characters, empty output.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sglfleet.pipeline.client import OpenAIClient  # noqa: E402
from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer  # noqa: E402
from sglfleet.textscore.detectors import score_text  # noqa: E402

PROMPTS = [
    'Describe a sunrise over the mountains.',
    'Explain how a bicycle works.',
    'Give three tips for learning a language.',
    'Write a haiku about rain.',
    'What is photosynthesis?',
    'Write a short story about a lost cat.',
    'List the planets of the solar system.',
    'How do I boil an egg?',
    'Write a Python function that reverses a string.',
    'Summarize the plot of Romeo and Juliet.',
    'What are the benefits of exercise?',
    'Explain what a database index is.',
    'Write a limerick about a programmer.',
    'Describe the water cycle.',
    'Make a table of three countries and capitals.',
    'What causes seasons on Earth?',
    'Give a recipe for pancakes.',
    'Explain recursion to a child.',
    'Write a thank-you note to a teacher.',
    'What is the difference between weather and climate?',
]


def rates(rows: list[tuple[str, str, bool]]) -> dict[str, object]:
    """rows: (label, class, flagged). false_pass = garbled not flagged; false_fail = coherent flagged."""
    ok = [r for r in rows if r[0] == "ok"]
    bad = [r for r in rows if r[0] == "bad"]
    fp = [r for r in bad if not r[2]]
    ff = [r for r in ok if r[2]]
    per_class = Counter(r[1] for r in bad)
    missed = Counter(r[1] for r in fp)
    return {"coherent": len(ok), "garbled": len(bad),
            "false_fail_rate": len(ff) / max(1, len(ok)), "false_pass_rate": len(fp) / max(1, len(bad)),
            "false_pass_by_class": {c: f"{missed[c]}/{n}" for c, n in sorted(per_class.items())}}


def corrupt(text: str, kind: str, rng: random.Random, soup: str) -> str:
    words = text.split()
    if kind == "soup":
        return soup
    if kind == "collapse":
        keep = max(8, len(words) // 2)
        return " ".join(words[:keep]) + " " + soup
    if kind == "repeat_token":
        return " ".join(words[: max(3, len(words) // 3)]) + rng.choice(["!", "?", ",", " the", "\n", "..."]) * 40
    if kind == "loop":
        block = " ".join(words[: rng.randint(3, 8)])
        return (block + " ") * rng.randint(6, 12)
    if kind == "bad_chars":
        pos = sorted(rng.sample(range(len(text) + 1), 3))
        out = text
        for p in reversed(pos):
            out = out[:p] + "\ufffd" + out[p:]
        return out
    if kind == "empty":
        return rng.choice(["", " ", "\n\n"])
    raise ValueError(kind)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="OpenAI-compatible URL (default: start the embedded target)")
    ap.add_argument("--n", type=int, default=80, help="real answers to collect")
    ap.add_argument("--out", default=str(REPO / "docs" / "results" / "validation-calibration.json"))
    ap.add_argument("--seed", type=int, default=2, help="new seed = new held-out answers and corruptions")
    args = ap.parse_args()
    t0 = time.time()
    corpus = [json.loads(x) for x in (REPO / "tests" / "validation" / "corpus.jsonl").read_text().splitlines()]
    corpus_rows = [(o["label"], o.get("class", "ok"), bool(score_text(o["text"]))) for o in corpus]

    def collect(url: str) -> tuple[list[str], list[str]]:
        c = OpenAIClient(url, timeout_s=300)
        rng = random.Random(args.seed)
        answers = []
        for i in range(args.n):
            t = [0.0, 0.6, 0.8, 1.0][i % 4]
            prompt = PROMPTS[(i + 7 * args.seed) % len(PROMPTS)]
            r = c.chat(prompt, max_tokens=120, temperature=t, top_p=0.95 if t else None,
                       seed=1000 * args.seed + i, stream=False)
            answers.append(r.text)
        soups: list[str] = []
        with httpx.Client(timeout=30) as http:
            while len(soups) < args.n:
                ids = [rng.randrange(100, 49000) for _ in range(rng.randint(12, 40))]
                text = http.post(url + "/detokenize", json={"tokens": ids}).json()["content"]
                if len(text.split()) >= 5:  # ids that decode to whitespace / specials are no soup
                    soups.append(text)
        return answers, soups

    if args.target:
        answers, soups = collect(args.target)
    else:
        with EmbeddedServer(EmbeddedConfig(port=18690), REPO / "runs" / "calibration") as srv:
            answers, soups = collect(srv.url)
    rng = random.Random(args.seed + 100)
    kinds = ["soup", "collapse", "repeat_token", "loop", "bad_chars", "empty"]
    held = [("ok", "ok", bool(score_text(a)), a) for a in answers]
    for i, a in enumerate(answers):
        k = kinds[i % len(kinds)]
        txt = corrupt(a, k, rng, soups[i])
        held.append(("bad", k, bool(score_text(txt)), txt))
    result = {
        "date": time.strftime("%Y-%m-%d"), "seed": args.seed,
        "command": "python bench/gate_calibration.py " + " ".join(sys.argv[1:]),
        "corpus": rates(corpus_rows),
        "held_out": rates([(a, b, c) for a, b, c, _ in held]),
        "held_out_false_fails": [t for lab, _, flagged, t in held if lab == "ok" and flagged][:20],
        "held_out_false_passes": [{"class": k, "text": t[:300]} for lab, k, flagged, t in held
                                  if lab == "bad" and not flagged][:20],
        "seconds": round(time.time() - t0, 1),
    }
    Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({k: result[k] for k in ("corpus", "held_out", "seconds")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
