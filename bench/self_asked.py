"""What the target asks itself: a sample of ``train-drafter --self-asked`` prompts (``dflash_train.self_asked_prompts``)
with how many requests gave them, why the others were dropped, and what kinds of request they are.

Why: the drafter's validation loss bottoms out within a few thousand steps on the 2,400 pool prompts (issue 39, the
fourth run), so more distinct prompts are what it lacks; no text can be downloaded on the device, so the target
asks them itself. This shows, on any machine, what that text is before device time is spent on it.

    python bench/self_asked.py --out RAW.json [--target DIR] [--n 200] [--batch 32] [--seed 0] [--device cpu]

Without ``--target`` the embedded SmolLM2-135M is converted from its GGUF. Writes one raw JSON
(``bench.history.raw_header``); bench/render_docs.py renders it (block ``self-asked``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]
from bench.history import raw_header  # noqa: E402

# what kind of request a prompt is, by its words (the first kind that matches; the pool's kinds, roughly)
KINDS = (
    ("code", r"\b(code|function|python|javascript|ruby|java|sql|script|program|algorithm|regex|c\+\+)\b"),
    ("list or table", r"\b(list|table|steps|tips|ideas|examples|pros and cons)\b"),
    ("writing", r"\b(story|poem|essay|letter|blog|article|report|speech|email)\b"),
    ("plan or advice", r"\b(plan|planning|advice|help me|guide|recommend|suggest|should i)\b"),
    ("question", r"\?$|^(what|how|why|who|when|where|which|is|are|can|does|do)\b"),
)


def kind_of(prompt: str) -> str:
    low = prompt.lower()
    return next((name for name, rx in KINDS if re.search(rx, low)), "other")


def summary(prompts: list[str], stats: dict[str, int], pool: list[str], held: list[str]) -> dict[str, Any]:
    """The sample's figures: requests examined and kept, the drops by reason, words per prompt, the kinds, and the
    two checks the corpus relies on (none is a pool prompt, none inside or around a suite prompt)."""
    from testbed.models.dflash_train import _norm

    dropped = {k.removeprefix("dropped_"): v for k, v in stats.items() if k.startswith("dropped_")}
    examined = len(prompts) + sum(dropped.values())
    words = [len(p.split()) for p in prompts]
    pool_keys, held_keys = {_norm(p) for p in pool}, [_norm(h) for h in held]
    kinds = Counter(kind_of(p) for p in prompts)
    return {"kept": len(prompts), "examined": examined, "keep_rate": len(prompts) / examined if examined else 0.0,
            "dropped": dropped, "distinct": len({_norm(p) for p in prompts}),
            "words": {"median": statistics.median(words), "min": min(words), "max": max(words)} if words else {},
            "kinds": dict(kinds.most_common()),
            "in_pool": sum(_norm(p) in pool_keys for p in prompts),
            "around_suite": sum(any(h in _norm(p) or _norm(p) in h for h in held_keys) for p in prompts)}


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from testbed.models import dflash_train, gguf_to_hf

    with tempfile.TemporaryDirectory() as tmp:
        d = a.target or tmp
        if not a.target:
            gguf_to_hf.convert(gguf_to_hf.smollm2_gguf(), d)
        tok = AutoTokenizer.from_pretrained(d)
        target = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).to(a.device).eval()
    pool, held = dflash_train.prompt_pool(), dflash_train.held_out_prompts()
    stats: dict[str, int] = {}
    t = time.time()
    prompts = dflash_train.self_asked_prompts(target, tok, a.n, seed=a.seed, device=a.device, exclude=pool,
                                              batch=a.batch, stats=stats)
    seconds = time.time() - t
    return {**raw_header("bench/self_asked.py"), "n": a.n, "batch": a.batch, "seed": a.seed, "device": a.device,
            "seconds": seconds, "stats": stats, "summary": summary(prompts, stats, pool, held), "prompts": prompts}


def render(raw: dict[str, Any], path: str) -> str:
    s = raw["summary"]
    drops = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in s["dropped"].items() if v) or "none"
    kinds = ", ".join(f"{k} {v}" for k, v in s["kinds"].items())
    lines = [f"{s['kept']} prompts kept of {s['examined']} requests the target wrote ({s['keep_rate']:.0%}; dropped: "
             f"{drops}) in {raw['seconds']:.0f} s on {raw['device']}; {s['distinct']} distinct; words per prompt "
             f"median {s['words']['median']:g} ({s['words']['min']}-{s['words']['max']}); pool prompts among them: "
             f"{s['in_pool']}; inside or around a suite prompt: {s['around_suite']}.", "",
             f"Kinds (by their words): {kinds}.", "", "The first ten:", ""]
    lines += [f"- {p}" for p in raw["prompts"][:10]]
    lines += ["", f"Raw: {path} ({raw['date']}, {raw['machine']}; `{raw['command']}`)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="raw JSON to write")
    ap.add_argument("--target", help="Hugging Face checkpoint dir (default: the embedded SmolLM2-135M)")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    if not 1 <= a.n <= 100_000 or not 1 <= a.batch <= 4096:
        print(f"error: --n {a.n} (1 to 100000) and --batch {a.batch} (1 to 4096)", file=sys.stderr)
        return 2
    if a.target and not (Path(a.target) / "config.json").is_file():
        print(f"error: --target {a.target}: no config.json", file=sys.stderr)
        return 2
    raw = run(a)
    Path(a.out).write_text(json.dumps(raw, indent=1) + "\n")
    print(render(raw, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
