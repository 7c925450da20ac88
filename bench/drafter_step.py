"""The DFlash drafter's training step, side by side: one drafter pass per sequence (the loop until 2026-12-07)
against one packed pass for all the step's sequences (``dflash_train._packed_loss``), and the packed pass with
TF32 matmuls (what ``train-drafter`` now uses on CUDA). Same drafter shape, corpus, sequences and anchors; each
variant takes a full optimizer step (forward, backward, clip, AdamW). Rounds alternate the variants (A B C A B C
...), so the ratios are measured side by side on one machine in one run.

Why: every figure of issue 39 waits on a better drafter, and device time is short; a drafter step of 8 sequences x
64 anchors took about 90 ms on the H100 (2026-12-07) while its matmuls are small, so the step was bound by its
kernel launches (8 drafter passes, each two layers of small kernels, forward and backward).

    python bench/drafter_step.py --out RAW.json [--target DIR] [--corpus corpus.pt] [--device cuda] [--rounds 8]
        [--steps-per-round 5] [--seqs-per-step 8] [--anchors 64] [--layers 2]

Without ``--target`` the embedded SmolLM2-135M is converted from its GGUF; without ``--corpus`` the tracked
corpus (testbed/models/corpora/) is read. Writes one raw JSON (``bench.history.raw_header``) with every step's
time; the table is rendered by bench/render_docs.py (block ``drafter-step``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]
from bench.history import raw_header  # noqa: E402

VARIANTS = ("per-sequence", "packed", "packed+tf32")


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from testbed.models import dflash_train, drafter, gguf_to_hf

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device")
    with tempfile.TemporaryDirectory() as tmp:
        d = a.target or tmp
        if not a.target:
            gguf_to_hf.convert(gguf_to_hf.smollm2_gguf(), d)
        target = AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, a.dtype)).to(a.device).eval()
        cfg = json.loads((Path(d) / "config.json").read_text())
    meta = dflash_train.corpus_meta(cfg, n=2400, max_new=256, seed=0)
    corpus = dflash_train.load_corpus(a.corpus or dflash_train.TRACKED_CORPUS, meta, device=a.device)
    dcfg = drafter.drafter_config_for(cfg, block_size=8, layers=a.layers)
    layer_ids = dcfg["dflash_config"]["target_layer_ids"]
    mask_id = dcfg["dflash_config"]["mask_token_id"]
    n = a.seqs_per_step * 4  # a pool the steps draw from (features of the whole corpus are not needed)
    # the sequences train() keeps: an answer longer than one block after the first anchor
    keep = [(s, int(p)) for s, p in zip(corpus, corpus.prompt_lens, strict=True)
            if s.shape[0] - 8 > dflash_train._first_anchor(int(p))][:n]
    seqs, plens = [s for s, _ in keep], [p for _, p in keep]
    for p in target.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        feats = dflash_train.features_of(target, seqs, layer_ids)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    torch.manual_seed(0)
    model = dflash_train.DFlashDrafter(dflash_train.shape_for(cfg, layers=a.layers, n_features=len(layer_ids)))
    model = model.to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = torch.Generator(device="cpu").manual_seed(0)

    def sync() -> None:
        if a.device == "cuda":
            torch.cuda.synchronize()

    def step(variant: str) -> float:
        torch.backends.cuda.matmul.allow_tf32 = variant == "packed+tf32"
        picks = torch.randint(0, n, (a.seqs_per_step,), generator=rng).tolist()
        sync()
        t = time.perf_counter()
        if variant == "per-sequence":
            loss = sum(dflash_train._block_loss(model, feats[i], seqs[i], embed, head, 8, mask_id, a.anchors, rng,
                                                lo=dflash_train._first_anchor(plens[i])) for i in picks) / len(picks)
        else:
            loss = dflash_train._packed_loss(model, [feats[i] for i in picks], [seqs[i] for i in picks], embed, head,
                                             8, mask_id, a.anchors, rng,
                                             [dflash_train._first_anchor(plens[i]) for i in picks])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        return time.perf_counter() - t

    for v in VARIANTS:  # warm-up: allocator, kernels, autotuning
        for _ in range(3):
            step(v)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(a.rounds):
        for v in VARIANTS:
            times[v] += [step(v) for _ in range(a.steps_per_round)]
    torch.backends.cuda.matmul.allow_tf32 = False
    med = {v: statistics.median(t) * 1000 for v, t in times.items()}
    dev = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    return {**raw_header("bench/drafter_step.py", note=dev), "device": dev, "torch": torch.__version__,
            "shape": {"layers": a.layers, "hidden": cfg["hidden_size"], "target_layer_ids": layer_ids,
                      "seqs_per_step": a.seqs_per_step, "anchors": a.anchors, "block": 8,
                      "seq_len_mean": sum(int(s.shape[0]) for s in seqs) / len(seqs)},
            "rounds": a.rounds, "steps_per_round": a.steps_per_round,
            "ms_per_step": med, "speedup_vs_per_sequence": {v: med["per-sequence"] / med[v] for v in VARIANTS},
            "steps_s": {v: [round(x, 6) for x in t] for v, t in times.items()}}


def render(raw: dict[str, Any], path: str) -> str:
    s = raw["shape"]
    rows = ["| training step | ms per step (median) | × the per-sequence step's speed |", "|---|---|---|"]
    for v in VARIANTS:
        rows.append(f"| {v} | {raw['ms_per_step'][v]:.1f} | {raw['speedup_vs_per_sequence'][v]:.2f} |")
    return (f"Drafter {s['layers']} layers at hidden {s['hidden']}; a step is {s['seqs_per_step']} sequences x "
            f"{s['anchors']} anchors of block {s['block']} (mean sequence {s['seq_len_mean']:.0f} tokens), forward, "
            f"backward and AdamW; {raw['rounds']} alternating rounds of {raw['steps_per_round']} steps per variant "
            f"on {raw['device']} (torch {raw['torch']}).\n\n" + "\n".join(rows) + "\n\n"
            f"Raw: {path} ({raw['date']}, {raw['machine']}; `{raw['command']}`)\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", help="a Hugging Face checkpoint dir (default: the embedded SmolLM2, converted)")
    ap.add_argument("--corpus", help="a train-drafter corpus.pt (default: the tracked one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps-per-round", type=int, default=5)
    ap.add_argument("--seqs-per-step", type=int, default=8)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args(argv)
    if min(a.rounds, a.steps_per_round, a.seqs_per_step, a.anchors, a.layers) < 1 or a.device not in ("cpu", "cuda"):
        print("error: counts must be >= 1 and --device cpu or cuda", file=sys.stderr)
        return 2
    raw = run(a)
    Path(a.out).write_text(json.dumps(raw, indent=1))
    print(render(raw, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
