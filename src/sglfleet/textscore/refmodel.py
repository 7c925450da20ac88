"""The fluency judge's reference model run directly in numpy: a Llama-architecture forward pass (RMSNorm,
rotary attention with grouped KV heads, SwiGLU MLP, tied output embedding) over the GGUF file's weights
dequantized to float32.

Why not llama.cpp for the forward pass: llama.cpp's server returns log-probabilities of generated tokens
only, so the judge had to ask for every token's hidden state (`/embedding`), and in that mode llama.cpp also
computes the full output projection for every token and throws it away; the judge then computed it again.
The wheel of llama.cpp used here is built for AVX2 only, while numpy's OpenBLAS uses the machine's AVX-512.
Measured side by side on the gate's own answers (bench/judge_engine.py, docs/results/judge-engine.json): this forward
pass is 2.19x faster for the same tokens, and its per-token NLL agrees with llama.cpp's. llama.cpp stays
the tokenizer (its GGUF tokenizer is the reference one) and the second engine (`judge.engine: llamacpp`).

The float32 weights are made once per source file and cached as .npy files that are memory-mapped on load
(the first start parses and dequantizes the GGUF file, about 11 s; later ones map the cache in milliseconds).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sglfleet.textscore.cachekey import source_key

CACHE_FORMAT = 1
_F32 = np.float32


@dataclass(frozen=True)
class Hparams:
    """The architecture numbers the forward pass needs, read from the GGUF metadata."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    rope_base: float
    rms_eps: float

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        raise ValueError(f"GGUF metadata has no {key}")
    return f.contents()


def output_tensor_name(tensors: Any) -> str:
    """The tensor that projects hidden states onto the vocabulary: `output.weight`, or the input embedding
    where the model ties them (SmolLM2). One rule for both judge engines. ValueError when neither exists."""
    for name in ("output.weight", "token_embd.weight"):
        if name in tensors:
            return name
    raise ValueError("GGUF file has no output or token embedding tensor")


def output_projection(path: str | Path) -> np.ndarray:
    """The (n_embd, n_vocab) float32 output projection of a GGUF file (the llamacpp engine's logits)."""
    from gguf import GGUFReader, dequantize

    t = {x.name: x for x in GGUFReader(str(path)).tensors}
    w = t[output_tensor_name(t)]
    return np.ascontiguousarray(np.asarray(dequantize(w.data, w.tensor_type), dtype=_F32).T)


def _build(src: Path, out: Path) -> None:
    """Dequantize a llama-architecture GGUF file into `out` (.npy per stacked tensor kind + meta.json)."""
    from gguf import GGUFReader, dequantize

    r = GGUFReader(str(src))
    arch = _field(r, "general.architecture")
    if arch != "llama":
        raise ValueError(f"the numpy judge engine runs llama-architecture models, not {arch!r}")
    hp = Hparams(
        n_embd=int(_field(r, "llama.embedding_length")), n_layer=int(_field(r, "llama.block_count")),
        n_head=int(_field(r, "llama.attention.head_count")),
        n_head_kv=int(_field(r, "llama.attention.head_count_kv")),
        n_ff=int(_field(r, "llama.feed_forward_length")), n_vocab=0,
        rope_base=float(_field(r, "llama.rope.freq_base")),
        rms_eps=float(_field(r, "llama.attention.layer_norm_rms_epsilon")))
    t = {x.name: x for x in r.tensors}

    def mat(name: str) -> np.ndarray:  # GGUF stores (out, in); the forward pass wants x @ W, i.e. (in, out)
        if name not in t:
            raise ValueError(f"GGUF file has no tensor {name}")
        return np.asarray(dequantize(t[name].data, t[name].tensor_type), dtype=_F32)

    emb = mat(output_tensor_name(t))
    inp = mat("token_embd.weight")
    if inp.shape != emb.shape:
        raise ValueError(f"input and output embeddings differ in shape: {inp.shape} vs {emb.shape}")
    hp = Hparams(**{**hp.__dict__, "n_vocab": int(emb.shape[0])})
    out.mkdir(parents=True)
    np.save(out / "out_t.npy", np.ascontiguousarray(emb.T))     # (D, V): the output projection
    if "output.weight" in t:
        np.save(out / "tok_embd.npy", inp)
    np.save(out / "out_norm.npy", mat("output_norm.weight"))
    L = hp.n_layer
    kinds: dict[str, list[np.ndarray]] = {k: [] for k in ("attn_norm", "wqkv", "wo", "ffn_norm", "wgu", "wd")}
    for i in range(L):
        b = f"blk.{i}."
        kinds["attn_norm"].append(mat(b + "attn_norm.weight"))
        kinds["wqkv"].append(np.concatenate([mat(b + "attn_q.weight").T, mat(b + "attn_k.weight").T,
                                             mat(b + "attn_v.weight").T], axis=1))
        kinds["wo"].append(mat(b + "attn_output.weight").T)
        kinds["ffn_norm"].append(mat(b + "ffn_norm.weight"))
        kinds["wgu"].append(np.concatenate([mat(b + "ffn_gate.weight").T, mat(b + "ffn_up.weight").T], axis=1))
        kinds["wd"].append(mat(b + "ffn_down.weight").T)
    for k, v in kinds.items():
        np.save(out / f"{k}.npy", np.ascontiguousarray(np.stack(v)))
    (out / "meta.json").write_text(json.dumps({"format": CACHE_FORMAT, "source": str(src), **hp.__dict__}))


def cached_weights(src: str | Path, cache_dir: Path) -> Path:
    """The float32 cache directory of a GGUF file, made once (atomically: built beside, then renamed) and
    keyed by the file's name, size and content hash (cachekey). ValueError / OSError when the file cannot be read."""
    s = Path(src)
    out = cache_dir / f"{source_key(s)}.f32-v{CACHE_FORMAT}"
    if (out / "meta.json").is_file():
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".{out.name}.tmp{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        try:
            _build(s, tmp)
        except (ValueError, OSError):
            raise
        except Exception as exc:  # a truncated or foreign file fails inside the GGUF parser in many ways
            raise ValueError(f"not a readable GGUF file: {type(exc).__name__}: {exc}") from exc
        try:
            tmp.rename(out)
        except OSError:  # another process finished first
            if not (out / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)).astype(_F32) * w


class ReferenceLM:
    """A llama-architecture model's forward pass over memory-mapped float32 weights."""

    def __init__(self, weights_dir: str | Path) -> None:
        d = Path(weights_dir)
        meta = json.loads((d / "meta.json").read_text())
        self.hp = Hparams(**{k: meta[k] for k in Hparams.__dataclass_fields__})
        load = lambda name: np.load(d / f"{name}.npy", mmap_mode="r")  # noqa: E731
        self.out_t = load("out_t")
        self.tok_embd = load("tok_embd") if (d / "tok_embd.npy").is_file() else None
        self.out_norm = load("out_norm")
        self.attn_norm, self.wqkv, self.wo = load("attn_norm"), load("wqkv"), load("wo")
        self.ffn_norm, self.wgu, self.wd = load("ffn_norm"), load("wgu"), load("wd")
        hd = self.hp.head_dim
        self._inv_freq = (self.hp.rope_base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd))

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        if self.tok_embd is not None:
            return np.array(self.tok_embd[ids], dtype=_F32)
        return np.ascontiguousarray(self.out_t[:, ids].T, dtype=_F32)

    def _rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotary embedding on adjacent pairs (x[2i], x[2i+1]): the layout of llama-architecture GGUF files,
        whose converter permutes the Q/K rows of the original checkpoint into it. x: (n, heads, head_dim)."""
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def rope_tables(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin) of the rotary angles at positions `pos`, shaped (n, 1, head_dim / 2) for `_rope`."""
        ang = np.asarray(pos, dtype=np.float64)[:, None] * self._inv_freq[None, :]
        return np.cos(ang).astype(_F32)[:, None, :], np.sin(ang).astype(_F32)[:, None, :]

    def attention(self, q: np.ndarray, keys: np.ndarray, vals: np.ndarray, bias: np.ndarray) -> np.ndarray:
        """Grouped-query softmax attention of q (n, heads, head_dim) over keys / vals (kv_heads, T, head_dim)
        with the additive mask `bias` (n, T); returns (n, n_embd)."""
        n, H, hd = q.shape
        KV = keys.shape[0]
        qg = q.transpose(1, 0, 2).reshape(KV, H // KV, n, hd)    # query heads grouped by their KV head
        s = qg @ keys.transpose(0, 2, 1)[:, None]                 # (KV, G, n, T)
        s *= _F32(1.0 / np.sqrt(hd))
        s += bias
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return (s @ vals[:, None]).reshape(H, n, hd).transpose(1, 0, 2).reshape(n, H * hd)

    def run_layers(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
                   attend: Callable[[int, np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """Every layer over the embeddings x (n, n_embd), in place, then the final norm. attend(layer, q, k, v)
        (q (n, heads, head_dim) and k / v (n, kv_heads, head_dim), RoPE applied) returns the attention output
        (n, n_embd): causal over the sequence in `hidden`, over a KV pool in the test engines."""
        hp = self.hp
        D, H, KV, hd, F = hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff
        n, kvd = x.shape[0], KV * hd
        for layer in range(hp.n_layer):
            h = _rms(x, self.attn_norm[layer], hp.rms_eps)
            qkv = h @ self.wqkv[layer]
            q = self._rope(qkv[:, :D].reshape(n, H, hd), cos, sin)
            k = self._rope(qkv[:, D:D + kvd].reshape(n, KV, hd), cos, sin)
            v = qkv[:, D + kvd:].reshape(n, KV, hd)
            x += attend(layer, q, k, v) @ self.wo[layer]
            h = _rms(x, self.ffn_norm[layer], hp.rms_eps)
            gu = h @ self.wgu[layer]
            g, u = gu[:, :F], gu[:, F:]
            with np.errstate(over="ignore"):
                act = g / (1.0 + np.exp(-g)) * u                      # SiLU(gate) * up
            x += act @ self.wd[layer]
        return _rms(x, self.out_norm, hp.rms_eps)

    def hidden(self, ids: list[int]) -> np.ndarray:
        """The final normed hidden state of every position, (n, n_embd), positions counted from 0."""
        hp = self.hp
        n = len(ids)
        if n == 0:
            return np.zeros((0, hp.n_embd), dtype=_F32)
        idx = np.asarray(ids, dtype=np.int64)
        if idx.min() < 0 or idx.max() >= hp.n_vocab:
            raise ValueError(f"token id out of range 0..{hp.n_vocab - 1}")
        cos, sin = self.rope_tables(np.arange(n))
        mask = np.triu(np.full((n, n), -np.inf, dtype=_F32), 1)

        def causal(layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
            return self.attention(q, k.transpose(1, 0, 2), v.transpose(1, 0, 2), mask)

        return self.run_layers(self._embed(idx), cos, sin, causal)


def nll_and_gap(h: np.ndarray, out_t: np.ndarray, targets: list[int],
                chunk: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Per row of h (the hidden state before each target token): the target's NLL in nats and its gap, how many
    nats its log-prob trails the most likely token (0 where the target is the greedy choice). The logits are
    formed in chunks of `chunk` rows and reduced in place (max, exp, sum), so memory stays bounded."""
    n = len(targets)
    tg = np.asarray(targets, dtype=np.int64)
    nll, gap = np.empty(n, dtype=np.float64), np.empty(n, dtype=np.float64)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        lg = np.asarray(h[a:b], dtype=_F32) @ out_t
        m = lg.max(axis=1)
        lg -= m[:, None]
        own = lg[np.arange(b - a), tg[a:b]].astype(np.float64)    # <= 0: minus the gap
        np.exp(lg, out=lg)
        nll[a:b] = np.log(lg.sum(axis=1, dtype=np.float64)) - own
        gap[a:b] = -own
    return nll, gap
