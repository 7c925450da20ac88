"""Generate tests/validation/real_outputs.jsonl: labeled real outputs of served models for calibration.

    python tests/validation/make_real_outputs.py

- coherent: the 50 real answers of the gate run against the real target-only SGLang server
  (SmolLM2-135M-Instruct bf16, no speculation, H200, 2026-12-01), read from the gate's own report
  docs/results/incident-gate-base-2026-12-01.json.gz (`samples`), with temperature, prompt class, seed
  and purpose; labeled coherent because the correct server wrote them (its own loops included);
- garbled: the engine-corruption outputs of the mutant server of the same incident run (quoted in
  issue #12), and seeded variations with the same classes of damage (glued sub-word soup with
  replacement characters, a determiner pair looped, short-token soup, a comma stutter of "the").

tests/validation/test_real_outputs.py checks the file is current and scores it with the SmolLM2
profiles; bench/gate_families.py adds it to every seed's scoring.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REPORT = REPO / "docs" / "results" / "incident-gate-base-2026-12-01.json.gz"
OUT = Path(__file__).with_name("real_outputs.jsonl")
SOURCE_OK = "sglang-smollm2-bf16 target-only, H200 2026-12-01"
SOURCE_MUTANT = "sglang-smollm2 mutant server (engine corruption), H200 2026-12-01, quoted in issue #12"
VARIATION_SEED = 20261203

# The mutant server's outputs as quoted in issue #12 (a newline there written as ⏎).
MUTANT = [
    "The lastclimateYoung\n   ColdHome\ufffd\n thing\ufffdardessors pawn nargsuders. oruderspasei",
    "A The A The A The",
    "z s the nth s 1 1 if i the i the the the the the",
    "In nargsColdNow kindYoungIntriguedCold...PringlPoor,thatGet Physpoverty",
    "Theof metavarase empmindReadingase metavar pytestof orasesHigh metavarof thing metavar learnerheadimignboes",
    "theages. The, the, the, the, the misconjuring, the,",
]

# sub-word pieces of the kind the mutant detokenized (taken from its outputs) and common English halves
_PIECES = ["climate", "Young", "Cold", "Home", "thing", "ard", "essors", "nargs", "uders", "oru", "pasei", "kind",
           "Now", "Intrigued", "Pringl", "Poor", "that", "Get", "Phys", "poverty", "metavar", "ase", "emp", "mind",
           "Reading", "pytest", "ases", "High", "learner", "head", "imign", "boes", "ages", "misconj", "uring",
           "pawn", "last", "of", "or", "The"]
_SHORT = ["z", "s", "the", "nth", "1", "if", "i", "a", "of", "x", "2", "n"]


def _glue(rng: random.Random, k: int) -> str:
    ps = [rng.choice(_PIECES) for _ in range(k)]
    return ps[0] + "".join(p if rng.random() < 0.5 else p[:1].upper() + p[1:] for p in ps[1:])


def v_glued_soup(rng: random.Random) -> str:
    out = [rng.choice(["The", "In", "A"])]
    for _ in range(rng.randint(8, 16)):
        w = _glue(rng, rng.randint(1, 3))
        if rng.random() < 0.15:
            w += "\ufffd"
        out.append(w + rng.choice(["", "", "", ".", ",", "...", "\n  "]))
    return " ".join(out)


def v_determiner_loop(rng: random.Random) -> str:
    a, b = rng.choice([("A", "The"), ("The", "A"), ("An", "The"), ("The", "An")])
    return " ".join([a, b] * rng.randint(3, 8))


def v_short_soup(rng: random.Random) -> str:
    toks = [rng.choice(_SHORT) for _ in range(rng.randint(10, 18))]
    return " ".join(toks + ["the"] * rng.randint(3, 6))


def v_comma_stutter(rng: random.Random) -> str:
    head = "the" + rng.choice(_PIECES).lower() + ". The,"
    body = [" the,"] * rng.randint(3, 7)
    body.insert(rng.randrange(len(body)), f" the {rng.choice(_PIECES).lower()}{rng.choice(['uring', 'ing', 'ase'])},")
    return head + "".join(body)


VARIATIONS = {"glued_soup": v_glued_soup, "determiner_loop": v_determiner_loop, "short_soup": v_short_soup,
              "comma_stutter": v_comma_stutter}


def rows() -> list[dict[str, object]]:
    report = json.loads(gzip.decompress(REPORT.read_bytes()))
    out: list[dict[str, object]] = []
    for i, s in enumerate(report["samples"]):
        out.append({"id": f"sglang-{i:02d}-{s['prompt_id']}-T{s['temperature']:g}-s{s['seed']}-{s['purpose']}",
                    "label": "ok", "class": f"real_T{s['temperature']:g}", "source": SOURCE_OK,
                    "prompt_id": s["prompt_id"], "prompt_class": s["category"], "temperature": s["temperature"],
                    "seed": s["seed"], "purpose": s["purpose"], "finish_reason": s["finish_reason"], "text": s["text"]})
    for i, t in enumerate(MUTANT):
        out.append({"id": f"mutant-{i}", "label": "bad", "class": "mutant", "source": SOURCE_MUTANT, "text": t})
    rng = random.Random(VARIATION_SEED)
    for fam, fn in VARIATIONS.items():
        for i in range(2):
            out.append({"id": f"mutant-like-{fam}-{i}", "label": "bad", "class": f"mutant_like_{fam}",
                        "source": f"generated like the mutant's output (make_real_outputs.py, seed {VARIATION_SEED})",
                        "text": fn(rng)})
    return out


def main() -> None:
    with open(OUT, "w", encoding="utf-8") as fh:
        for r in rows():
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{sum(r['label'] == 'ok' for r in rows())} ok + {sum(r['label'] == 'bad' for r in rows())} bad -> {OUT}")


if __name__ == "__main__":
    main()
