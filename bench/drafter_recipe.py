"""The DFlash drafter's training recipe, side by side on one corpus (issue 39, item 2): which choices raise the
accept length before a device call is spent on a long training run.

Each variant trains a drafter for the embedded target (SmolLM2-135M-Instruct, converted from its GGUF) on the SAME
target-written corpus (``dflash_train.self_distill_corpus``: the mixed prompt pool, the gate's suite held out),
with the same seed, steps and batch, and is measured the same way: the offline chain accept length and first-token
hit on the corpus's held-out tenth, and on the target's greedy answers to the gate's suite
(``dflash_train.suite_corpus``: the figure that predicts a served accept length on the suite). Variants:

- ``uniform``: every block position's loss weighs the same (the recipe until now);
- ``decay``: position j's loss weighs exp(-(j-1)/DECAY) (``--position-decay``);
- ``init``: the draft layers start as copies of the target's last layers (``--init-from-target``);
- ``decay+init``: both.

On the CPU only a small scale fits (about 3 s a step on two cores), too small to rank recipes; the H200 runs it at
the scale of ``train-drafter`` (tests/ddtree/gpu_session.sh ``trainwarm`` with ``TRAINER=recipe``), each variant
cut to ``--seconds-per-variant``, and ``--export-best DIR`` exports the variant with the best held-out accept
length (chosen on the corpus's held-out tenth, never on the suite, which stays the independent measure) as the
drafter the later steps serve. Writes one raw JSON (``bench.history.raw_header``); ``render`` makes the table
(bench/render_docs.py, block ``drafter-recipe``).

    python bench/drafter_recipe.py --out RAW.json [--target DIR] [--device cuda --dtype bfloat16] [--seqs 96]
        [--max-new 96] [--steps 240] [--seeds 0,1] [--decay 4] [--variants uniform,decay,init,decay+init]
        [--seconds-per-variant S] [--export-best DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]
from bench.history import raw_header  # noqa: E402

VARIANTS = {"uniform": (False, False), "decay": (True, False), "init": (False, True), "decay+init": (True, True)}


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from testbed.models import dflash_train, gguf_to_hf

    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        d = a.target or tmp
        if not a.target:
            gguf_to_hf.convert(gguf_to_hf.smollm2_gguf(), d)
        tok = AutoTokenizer.from_pretrained(d)
        target = AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, a.dtype)).to(a.device).eval()
        cfg = json.loads((Path(d) / "config.json").read_text())
    corpus = dflash_train.self_distill_corpus(target, tok, n=a.seqs, max_new=a.max_new, seed=0, device=a.device,
                                              batch=a.gen_batch)
    suite = dflash_train.suite_corpus(target, tok, device=a.device, max_new=a.max_new)
    prep_s = time.time() - t0
    rows = []
    best: tuple[float, Any, dict[str, Any]] | None = None
    for seed in a.seeds:
        for name in a.variants:
            decay, init = VARIANTS[name]
            t1 = time.time()
            try:  # one variant's failure (a device out of memory) keeps the others and the export
                model, report = dflash_train.train(
                    target, corpus, cfg, block=8, layers=a.layers, steps=a.steps, anchors_per_seq=a.anchors,
                    seqs_per_step=a.seqs_per_step, lr=a.lr, seed=seed, device=a.device,
                    position_decay=a.decay if decay else 0.0, init_from_target=init, log=lambda *_: None,
                    deadline=t1 + a.seconds_per_variant if a.seconds_per_variant else None)
                suite_acc = dflash_train.suite_acceptance(model, target, suite, report["target_layer_ids"], 8,
                                                          report["mask_token_id"])
            except (RuntimeError, ValueError) as e:
                rows.append({"variant": name, "seed": seed, "error": f"{type(e).__name__}: {e}"[:500],
                             "seconds": time.time() - t1})
                print(f"{name:11s} seed {seed}: failed: {rows[-1]['error']}", flush=True)
                continue
            row = {"variant": name, "seed": seed, "held_out": report["offline"], "suite": suite_acc,
                   "steps": report["steps"], "loss_first": report["loss_first"], "loss_last": report["loss_last"],
                   "seconds": time.time() - t1}
            rows.append(row)
            report["offline_suite"] = suite_acc
            if a.export_best and (best is None or report["offline"]["accept_length"] > best[0]):
                best = (report["offline"]["accept_length"], model, {**report, "variant": name})
            del model
            print(f"{name:11s} seed {seed}: held-out accept {row['held_out']['accept_length']:.3f} "
                  f"(first {row['held_out']['first_token_hit']:.3f}), suite {suite_acc['accept_length']:.3f} "
                  f"(first {suite_acc['first_token_hit']:.3f}) in {row['seconds']:.0f}s", flush=True)
    exported = None
    if best is not None:
        dflash_train.export(best[1], cfg, a.export_best, best[2])
        exported = {"dir": a.export_best, "variant": best[2]["variant"], "seed": best[2]["seed"],
                    "held_out_accept": best[0]}
        print(f"exported {exported}", flush=True)
    return {**raw_header("bench/drafter_recipe.py"),
            "target": f"SmolLM2-135M-Instruct ({a.target or 'embedded GGUF'}, {a.dtype})", "device": a.device,
            "exported": exported,
            "corpus": {"seqs": len(corpus), "max_new": a.max_new, "tokens": int(sum(int(s.shape[0]) for s in corpus))},
            "suite": {"answers": len(suite), "tokens": int(sum(int(s.shape[0]) for s in suite))},
            "train": {"steps": a.steps, "layers": a.layers, "anchors": a.anchors, "seqs_per_step": a.seqs_per_step,
                      "lr": a.lr, "decay": a.decay, "seconds_per_variant": a.seconds_per_variant},
            "prep_seconds": prep_s, "rows": rows}


def render(raw: dict[str, Any], path: str) -> str:
    """Per variant: the mean over seeds (and each seed) of the held-out and suite accept lengths and first-token
    hits, beside ``uniform``'s."""
    by: dict[str, list[dict[str, Any]]] = {}
    failed = [r for r in raw["rows"] if "error" in r]
    for r in raw["rows"]:
        if "error" not in r:
            by.setdefault(r["variant"], []).append(r)

    def mean(rs: list[dict[str, Any]], where: str, key: str) -> float:
        return sum(float(r[where][key]) for r in rs) / len(rs)

    base = by.get("uniform")
    lines = ["| variant | seeds | steps | held-out accept | first-token hit | suite accept | suite first-token hit | "
             "suite accept − uniform's (per seed) | last loss |", "|---|---|---|---|---|---|---|---|---|"]
    for name, rs in by.items():
        diff = "—"
        if base and name != "uniform":
            ub = {r["seed"]: r for r in base}
            d = [r["suite"]["accept_length"] - ub[r["seed"]]["suite"]["accept_length"] for r in rs if r["seed"] in ub]
            diff = ", ".join(f"{x:+.3f}" for x in d) if d else "—"
        steps = ", ".join(str(r.get("steps", "?")) for r in rs)
        lines.append(f"| {name} | {len(rs)} | {steps} | {mean(rs, 'held_out', 'accept_length'):.3f} | "
                     f"{mean(rs, 'held_out', 'first_token_hit'):.3f} | {mean(rs, 'suite', 'accept_length'):.3f} | "
                     f"{mean(rs, 'suite', 'first_token_hit'):.3f} | {diff} | "
                     f"{sum(r['loss_last'] for r in rs) / len(rs):.3f} |")
    lines += [f"| {r['variant']} (seed {r['seed']}) | failed: {r['error']} |" + " |" * 7 for r in failed]
    t, c = raw["train"], raw["corpus"]
    lines += ["", f"Target: {raw['target']} on {raw['device']}. Corpus: {c['seqs']} target-written sequences "
              f"({c['tokens']} tokens, answers up to {c['max_new']} tokens), the suite's {raw['suite']['answers']} "
              f"greedy answers held out. Training: {t['steps']} steps of {t['seqs_per_step']} sequences x "
              f"{t['anchors']} blocks planned" + (f", each variant cut to {t['seconds_per_variant']} s"
                                                     if t.get("seconds_per_variant") else "")
              + f", {t['layers']} draft layer(s), lr {t['lr']}, decay length {t['decay']}."
              + (f" Exported: {raw['exported']['variant']} (seed {raw['exported']['seed']}), the best held-out accept "
                 "length." if raw.get("exported") else ""),
              "", f"Raw: {path} — {raw.get('date')}, {raw.get('machine')}, commit {raw.get('commit')}; command: "
              f"`{raw.get('command')}`"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqs", type=int, default=96)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--seqs-per-step", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--decay", type=float, default=4.0)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--target", help="a converted Hugging Face checkpoint dir (default: the embedded GGUF)")
    ap.add_argument("--seconds-per-variant", type=float, help="each variant's training ends by then (fewer steps)")
    ap.add_argument("--export-best", help="export the variant with the best held-out accept length here")
    a = ap.parse_args(argv)
    try:
        a.seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    except ValueError:
        a.seeds = []
    a.variants = [v for v in a.variants.split(",") if v.strip()]
    bad = [v for v in a.variants if v not in VARIANTS]
    if a.target and not (Path(a.target) / "config.json").is_file():
        print(f"error: --target {a.target}: no config.json (a Hugging Face checkpoint directory)", file=sys.stderr)
        return 2
    if not a.seeds or not a.variants or bad or min(a.seqs, a.max_new, a.steps, a.layers, a.anchors,
                                                    a.seqs_per_step, a.gen_batch) < 1 or not a.decay > 0 \
            or (a.seconds_per_variant is not None and not a.seconds_per_variant > 0):
        print(f"error: --seeds (integers), --variants (of {', '.join(VARIANTS)}), positive counts, --decay > 0 and "
              f"--seconds-per-variant > 0 are needed{f' (unknown variants: {bad})' if bad else ''}", file=sys.stderr)
        return 2
    raw = run(a)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(raw, indent=1))
    print(render(raw, str(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
