"""Generate the quality smoke set: arithmetic and short factual questions with exact answers.

    python validation/quality/make_quality_set.py      # rewrites quality-v1.jsonl

Deterministic (fixed seed): the file in the repo is what this script prints. Arithmetic covers
small sums, differences and products; the factual part is a fixed list of unambiguous one-word
answers. Each line: {"id", "question", "answer", "kind"}.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

FACTS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of Spain?", "Madrid"),
    ("What planet do we live on?", "Earth"),
    ("What color is the sky on a clear day?", "blue"),
    ("How many days are in a week?", "7"),
    ("How many legs does a spider have?", "8"),
    ("What is the largest ocean on Earth?", "Pacific"),
    ("What gas do plants absorb from the air?", "carbon dioxide"),
    ("What is frozen water called?", "ice"),
]


def build(seed: int = 20261129, n_arith: int = 24) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n_arith):
        op = ("+", "-", "*")[i % 3]
        a, b = rng.randint(2, 50), rng.randint(2, 20 if op == "*" else 50)
        if op == "-" and b > a:
            a, b = b, a
        val = {"+": a + b, "-": a - b, "*": a * b}[op]
        word = {"+": "plus", "-": "minus", "*": "times"}[op]
        rows.append({"id": f"arith-{i:02d}", "kind": "arithmetic",
                     "question": f"What is {a} {word} {b}? Answer with just the number.", "answer": str(val)})
    for i, (q, ans) in enumerate(FACTS):
        rows.append({"id": f"fact-{i:02d}", "kind": "factual", "question": q + " Answer in one word.",
                     "answer": ans})
    return rows


def main() -> None:
    out = Path(__file__).with_name("quality-v1.jsonl")
    rows = build()
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} questions -> {out}")


if __name__ == "__main__":
    main()
