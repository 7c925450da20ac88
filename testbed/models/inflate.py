"""Inflate a small Llama checkpoint to a large model's compute shape without changing its function.

    python -m testbed.models inflate --src DIR --out DIR [--hidden 4096 --layers 32 --heads 32 --kv-heads 8
        --intermediate 14336 --head-dim 128] [--drafter-src DIR --drafter-out DIR] [--dtype bfloat16]

The output is a Llama checkpoint (config.json, safetensors shards written layer by layer, the
source's tokenizer files) with the requested shape (default: Llama-3-8B's, vocabulary unchanged)
whose logits equal the source's up to float rounding: every added unit is zero or cancels, while
the server still pays the full matmuls, KV cache and attention of the large shape. With
``--drafter-src`` a DFlash drafter of the source (``dflash_train.export`` layout, sglang's
DFlashDraftModel) is inflated the same way and re-pointed at the inflated target's layers.

Notation: source hidden ``H0``, head_dim ``d0``, q / kv heads ``n0`` / ``k0`` (``g0 = n0 / k0`` q
heads per kv head), ``L0`` layers, MLP width ``I0``; the same with ``1`` for the output; ``m = d1 / d0``.

Residual stream. The source's stream lives in coordinates ``[0, H0)``; the other ``H1 - H0`` are
zero everywhere: embedding (and untied lm_head) rows get zero columns, every matrix reading the
stream (q/k/v, gate/up, the drafter's fc) has zero columns there, every matrix writing it (o_proj,
down_proj, the drafter's fc) zero rows.

RMSNorm. ``y = x * g / sqrt(mean(x^2) + eps)``. Padding ``x`` with zeros to ``H1`` multiplies the
mean by ``r = H0 / H1``. With ``eps1 = eps * r`` the denominator is ``sqrt(r) * sqrt(mean0 + eps)``
exactly, so gains ``g1 = g * sqrt(r)`` on ``[0, H0)`` (zero elsewhere) give the source's values.
``rms_norm_eps`` of the output is ``eps * r`` (the drafter's too: one eps for all its norms).

Heads and RoPE. Llama's rotary embedding (neox style) rotates the pair ``(i, i + d/2)`` of a head
by ``pos * theta^(-2i/d)``. Source dim ``t`` goes to ``m * t`` for ``t < d0/2`` and to
``m * (t - d0/2) + d1/2`` otherwise: the source pair ``i`` becomes the output pair ``m * i``, whose
frequency is ``theta^(-2 m i / (m d0)) = theta^(-2i/d0)``, the same number with the same
``rope_theta`` (the exponent ``2mi / (m d0)`` is even bit-identical in float: both divisions round
the same exact ratio). Every rope setting is kept as it is; only scalings that are a function of
the frequency alone are accepted (default, linear, llama3). (``rope_theta' = theta^m`` with pair
``i`` at ``i`` works too in exact arithmetic, ``theta^(-2mi/d1) = theta^(-2i/d0)``, but its
frequency table is computed from another base and agrees only to rounding.) The other dims of a used head are zero
in q, k and v. Attention scales scores by ``1/sqrt(d)``: the target's q_proj rows are multiplied by
``sqrt(m)`` so that ``q.k / sqrt(d1)`` equals the source's ``q.k / sqrt(d0)`` (k untouched).

GQA. Source kv head ``k`` needs ``c = ceil(g0 / g1)`` output kv heads (copies of its k/v rows);
its q heads fill their groups in order: source q head ``k * g0 + h`` goes to output q head
``(k * c + h // g1) * g1 + h % g1``, so it still attends with (a copy of) its own kv head. For
SmolLM2 (9 q / 3 kv) into 32 / 8: c = 1, kv heads 0..2 are used, q heads ``4k .. 4k+2`` carry the
source's, q heads ``4k + 3`` and kv heads 3..7 are unused. An unused q head has zero q (it attends
uniformly) and zero o_proj columns (its output is dropped); unused kv heads have zero k and v.
``k0 * c > k1`` is refused (the output has too few heads).

MLP. gate/up have zero rows for the new units: ``silu(0) * 0 = 0``, and down_proj has zero columns
for them (and zero rows outside ``[0, H0)``).

Depth. Source layer ``i`` becomes output layer ``i * L1 // L0`` (strictly increasing: the added
layers are spread through the stack). Every other layer is an identity: zero o_proj and down_proj
(and zero q/k/v/gate/up, unit norm gains), so the stream passes unchanged while the layer still
costs its full attention and MLP. The map is recorded in config.json as
``inflated_from: {path, source shape, layer_map, q_head_map, kv_head_map, head_dim_map}``.

The drafter (``dflash_train.DFlashDrafter``): its norms, heads and MLP are inflated as above (its
own layer count is kept), with two differences. Its context projection ``fc`` reads ``F`` target
features concatenated: feature ``f``'s source block ``[f H0, (f+1) H0)`` moves to
``[f H1, f H1 + H0)``. ``dflash_config.target_layer_ids`` ``i`` becomes ``layer_map[i]``: the
stream leaving output layer ``layer_map[i]`` is the source's stream leaving layer ``i`` (padded),
since the identity layers in between change nothing; ``layer_map[i] <= L1 - 2`` whenever
``i <= L0 - 2``. And it has per-head q/k RMS norms (over ``d``, with the same ``rms_norm_eps``,
now ``eps * r``): padding a head from ``d0`` to ``d1`` multiplies their mean by ``1/m``, which does
not fit ``eps * r``. A norm is scale invariant except for its eps, so q_proj and k_proj rows are
multiplied by ``s = sqrt(r * m)``: ``mean = s^2 / m * mean0 = r * mean0`` and the eps fits again.
The q/k norm outputs are then ``q * g1 * sqrt(m) / rms0``: q_norm keeps its gain (its extra
``sqrt(m)`` is the attention-scale factor), k_norm's gain is divided by ``sqrt(m)``. Exact too; a
drafter with ``rms_norm_eps`` 0 is refused (a zero head would normalise to NaN).

Not exact, by design: the output dtype (default bfloat16) rounds the rescaled gains and the
``sqrt(m)`` / ``s`` scaled projection rows (relative 2^-9 per weight in bf16); everything is
computed in float32 from the source. Float summation order differs with the zero padding.
Measured on SmolLM2-135M (bf16 weights), float32 compute, 20-odd tokens at positions ~1000: a
float32 output (hidden 1024, 32 layers, 32 / 8 heads of 128) within 3e-6 of the source's logits
(relative to the largest); the bfloat16 output at Llama-3-8B's shape within 0.5%, the same argmax
at every position, and its (random) 2-layer drafter's logits within 0.1%.

Output directories are written whole or not at all (temp dirs renamed at the end); an existing
``--out`` / ``--drafter-out`` is replaced. Peak memory is one shard (4 GiB) plus one layer in
float32 plus the source: about 7 GB for SmolLM2 -> Llama-3-8B's shape.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglfleet.pipeline.errors import UsageError

if TYPE_CHECKING:
    import torch

LLAMA3_8B = {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "intermediate": 14336, "head_dim": 128}
DTYPES = ("bfloat16", "float16", "float32")
SHARD_BYTES = 4 << 30
_ROPE_TYPES = ("default", "linear", "llama3")  # frequency-wise: the same frequency, the same scaled one
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
_NOT_COPIED = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json", "train.json"}
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_NORMS = ("input_layernorm", "post_attention_layernorm")


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    head_dim: int

    @classmethod
    def of(cls, cfg: dict[str, Any]) -> Shape:
        try:
            heads = int(cfg["num_attention_heads"])
            return cls(hidden=int(cfg["hidden_size"]), layers=int(cfg["num_hidden_layers"]), heads=heads,
                       kv_heads=int(cfg.get("num_key_value_heads") or heads),
                       intermediate=int(cfg["intermediate_size"]),
                       head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            raise UsageError(f"config lacks a usable Llama shape ({e!r})") from None

    def config_fields(self) -> dict[str, int]:
        return {"hidden_size": self.hidden, "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "intermediate_size": self.intermediate,
                "head_dim": self.head_dim}


@dataclass(frozen=True)
class Plan:
    """Where every source unit goes (see the module docstring)."""

    src: Shape
    dst: Shape
    eps: float
    layer_map: tuple[int, ...]  # source layer -> output layer
    q_map: tuple[int, ...]  # source q head -> output q head
    kv_map: tuple[int, ...]  # output kv head -> source kv head (-1: unused)
    dims: tuple[int, ...]  # source head dim -> output head dim

    @property
    def r(self) -> float:
        return self.src.hidden / self.dst.hidden

    @property
    def m(self) -> int:
        return self.dst.head_dim // self.src.head_dim

    @property
    def eps_out(self) -> float:
        return self.eps * self.r

    def record(self, path: Path | str) -> dict[str, Any]:
        return {"path": str(Path(path).resolve()), **self.src.config_fields(), "rms_norm_eps": self.eps,
                "layer_map": list(self.layer_map), "q_head_map": list(self.q_map), "kv_head_map": list(self.kv_map),
                "head_dim_map": list(self.dims)}


def plan(src_cfg: dict[str, Any], dst: Shape, *, what: str = "source") -> Plan:
    """Check that ``dst`` can hold the source exactly; raise UsageError naming the first reason not."""
    src = Shape.of(src_cfg)
    for k, v in asdict(dst).items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UsageError(f"--{k.replace('_', '-')} must be a positive integer, got {v!r}")
    if src.heads % src.kv_heads:
        raise UsageError(f"{what}: {src.heads} q heads do not split into {src.kv_heads} kv heads")
    if src.head_dim % 2:
        raise UsageError(f"{what}: head_dim {src.head_dim} is odd (no rotary pairs)")
    for name, a, b in (("hidden", src.hidden, dst.hidden), ("layers", src.layers, dst.layers),
                       ("intermediate", src.intermediate, dst.intermediate), ("head-dim", src.head_dim, dst.head_dim)):
        if b < a:
            raise UsageError(f"--{name} {b} is smaller than the {what}'s {a}: inflating cannot shrink")
    if dst.heads % dst.kv_heads:
        raise UsageError(f"--kv-heads {dst.kv_heads} does not divide --heads {dst.heads}")
    if dst.head_dim % src.head_dim:
        raise UsageError(f"--head-dim {dst.head_dim} is not a multiple of the {what}'s {src.head_dim}: the rotary "
                         "pairs cannot keep their frequencies")
    if dst.hidden % dst.heads:
        raise UsageError(f"--hidden {dst.hidden} is not a multiple of --heads {dst.heads} (transformers refuses it)")
    g0, g1 = src.heads // src.kv_heads, dst.heads // dst.kv_heads
    c = -(-g0 // g1)
    if src.kv_heads * c > dst.kv_heads:
        raise UsageError(f"--heads {dst.heads} / --kv-heads {dst.kv_heads} ({g1} q heads per kv head) cannot hold "
                         f"the {what}'s {src.kv_heads} kv heads of {g0} q heads each: it needs "
                         f"{src.kv_heads * c} kv heads with {g1} q heads each")
    eps = float(src_cfg.get("rms_norm_eps", 1e-6))
    if not (eps >= 0 and math.isfinite(eps)):
        raise UsageError(f"{what}: rms_norm_eps {eps!r}")
    q_map = tuple((k * c + h // g1) * g1 + h % g1 for k in range(src.kv_heads) for h in range(g0))
    kv_map = tuple(j // c if j < src.kv_heads * c else -1 for j in range(dst.kv_heads))
    half0, half1, m = src.head_dim // 2, dst.head_dim // 2, dst.head_dim // src.head_dim
    dims = tuple(m * t if t < half0 else m * (t - half0) + half1 for t in range(src.head_dim))
    layer_map = tuple(i * dst.layers // src.layers for i in range(src.layers))
    return Plan(src=src, dst=dst, eps=eps, layer_map=layer_map, q_map=q_map, kv_map=kv_map, dims=dims)


def _check_llama(cfg: dict[str, Any], what: str) -> None:
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") != "llama" and "LlamaForCausalLM" not in archs:
        raise UsageError(f"{what}: model_type {cfg.get('model_type')!r} is not llama")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise UsageError(f"{what}: {key} is not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UsageError(f"{what}: hidden_act {cfg.get('hidden_act')!r} is not silu")
    if int(cfg.get("pretraining_tp") or 1) != 1:
        raise UsageError(f"{what}: pretraining_tp {cfg.get('pretraining_tp')} is not 1")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise UsageError(f"{what}: rope settings {rope!r} are not a mapping")
    rtype = rope.get("rope_type") or rope.get("type") or "default"
    if rtype not in _ROPE_TYPES:
        raise UsageError(f"{what}: rope type {rtype!r} depends on head_dim; only {', '.join(_ROPE_TYPES)} keep "
                         "their frequencies")
    if float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0) != 1.0:
        raise UsageError(f"{what}: partial rotary embedding is not supported")


def _read_config(d: Path, what: str) -> dict[str, Any]:
    f = d / "config.json"
    try:
        cfg = json.loads(f.read_text())
    except OSError:
        raise UsageError(f"{what}: no config.json in {d}") from None
    except ValueError as e:
        raise UsageError(f"{what}: {f} is not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{what}: {f} is not a JSON object")
    return cfg


def _weight_files(d: Path, what: str) -> list[Path]:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError) as e:
            raise UsageError(f"{what}: {index} is not a safetensors index ({e!r})") from None
        files = [d / n for n in names]
    else:
        files = [d / "model.safetensors"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise UsageError(f"{what}: no safetensors weights at {missing[0]}")
    return files


def _load(files: list[Path]) -> dict[str, torch.Tensor]:
    import torch
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():  # noqa: SIM118 (safe_open handles are not mappings)
                out[k] = fh.get_tensor(k).to(torch.float32)
    return out


# ----------------------------------------------------------------------------------------- the weights


def _norm(g: torch.Tensor, n: int, scale: float) -> torch.Tensor:
    import torch

    out = torch.zeros(n, dtype=torch.float32)
    out[: g.shape[0]] = g * scale
    return out


def _head_rows(p: Plan, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(source rows, output rows) of a q (``kind`` "q") or k/v ("kv") projection."""
    import torch

    d0, d1 = p.src.head_dim, p.dst.head_dim
    dims = torch.tensor(p.dims)
    pairs = list(enumerate(p.q_map)) if kind == "q" else [(k, j) for j, k in enumerate(p.kv_map) if k >= 0]
    src = torch.cat([h * d0 + torch.arange(d0) for h, _ in pairs])
    dst = torch.cat([j * d1 + dims for _, j in pairs])
    return src, dst


def _proj_in(w: torch.Tensor, p: Plan, kind: str, scale: float, n_out: int) -> torch.Tensor:
    """A q/k/v projection [heads * d, H]: source rows placed per head, zero columns past H0."""
    import torch

    src, dst = _head_rows(p, kind)
    out = torch.zeros(n_out * p.dst.head_dim, p.dst.hidden, dtype=torch.float32)
    out[dst, : p.src.hidden] = w[src] * scale
    return out


def _attention(w: dict[str, torch.Tensor], p: Plan, qk_scale: float, q_scale: float) -> dict[str, torch.Tensor]:
    import torch

    out = {"q_proj": _proj_in(w["q_proj"], p, "q", qk_scale * q_scale, p.dst.heads),
           "k_proj": _proj_in(w["k_proj"], p, "kv", qk_scale, p.dst.kv_heads),
           "v_proj": _proj_in(w["v_proj"], p, "kv", 1.0, p.dst.kv_heads)}
    src, dst = _head_rows(p, "q")
    o = torch.zeros(p.dst.hidden, p.dst.heads * p.dst.head_dim, dtype=torch.float32)
    o[: p.src.hidden, dst] = w["o_proj"][:, src]
    out["o_proj"] = o
    return out


def _mlp(w: dict[str, torch.Tensor], p: Plan) -> dict[str, torch.Tensor]:
    import torch

    h0, i0 = p.src.hidden, p.src.intermediate
    out = {}
    for k in ("gate_proj", "up_proj"):
        t = torch.zeros(p.dst.intermediate, p.dst.hidden, dtype=torch.float32)
        t[:i0, :h0] = w[k]
        out[k] = t
    down = torch.zeros(p.dst.hidden, p.dst.intermediate, dtype=torch.float32)
    down[:h0, :i0] = w["down_proj"]
    out["down_proj"] = down
    return out


def _identity_layer(p: Plan) -> dict[str, torch.Tensor]:
    import torch

    d = p.dst
    z = torch.zeros
    return {"input_layernorm.weight": torch.ones(d.hidden), "post_attention_layernorm.weight": torch.ones(d.hidden),
            "self_attn.q_proj.weight": z(d.heads * d.head_dim, d.hidden),
            "self_attn.k_proj.weight": z(d.kv_heads * d.head_dim, d.hidden),
            "self_attn.v_proj.weight": z(d.kv_heads * d.head_dim, d.hidden),
            "self_attn.o_proj.weight": z(d.hidden, d.heads * d.head_dim),
            "mlp.gate_proj.weight": z(d.intermediate, d.hidden), "mlp.up_proj.weight": z(d.intermediate, d.hidden),
            "mlp.down_proj.weight": z(d.hidden, d.intermediate)}


def _layer(w: dict[str, torch.Tensor], p: Plan, *, drafter: bool) -> dict[str, torch.Tensor]:
    """One inflated layer from its source tensors (names relative to the layer)."""
    g = math.sqrt(p.r)
    out = {f"{n}.weight": _norm(w[f"{n}.weight"], p.dst.hidden, g) for n in _NORMS}
    if drafter:  # q/k norms: rows scaled by s fit the eps; the attention scale sits in the norm gains
        attn = _attention({k: w[f"self_attn.{k}.weight"] for k in _ATTN}, p, math.sqrt(p.r * p.m), 1.0)
        out["self_attn.q_norm.weight"] = _head_norm(w["self_attn.q_norm.weight"], p, 1.0)
        out["self_attn.k_norm.weight"] = _head_norm(w["self_attn.k_norm.weight"], p, 1 / math.sqrt(p.m))
    else:
        attn = _attention({k: w[f"self_attn.{k}.weight"] for k in _ATTN}, p, 1.0, math.sqrt(p.m))
    out.update({f"self_attn.{k}.weight": v for k, v in attn.items()})
    out.update({f"mlp.{k}.weight": v for k, v in _mlp({k: w[f"mlp.{k}.weight"] for k in _MLP}, p).items()})
    return out


def _head_norm(g: torch.Tensor, p: Plan, scale: float) -> torch.Tensor:
    import torch

    out = torch.zeros(p.dst.head_dim, dtype=torch.float32)
    out[torch.tensor(p.dims)] = g * scale
    return out


def _pad(w: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    import torch

    out = torch.zeros(rows, cols, dtype=torch.float32)
    out[: w.shape[0], : w.shape[1]] = w
    return out


def target_tensors(w: dict[str, torch.Tensor], p: Plan, *, tied: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The inflated target's tensors (float32), one layer at a time."""
    vocab = w["model.embed_tokens.weight"].shape[0]
    yield "model.embed_tokens.weight", _pad(w["model.embed_tokens.weight"], vocab, p.dst.hidden)
    source_of = {j: i for i, j in enumerate(p.layer_map)}
    for j in range(p.dst.layers):
        if j in source_of:
            pre = f"model.layers.{source_of[j]}."
            layer = _layer({k[len(pre):]: v for k, v in w.items() if k.startswith(pre)}, p, drafter=False)
        else:
            layer = _identity_layer(p)
        for k, v in layer.items():
            yield f"model.layers.{j}.{k}", v
    yield "model.norm.weight", _norm(w["model.norm.weight"], p.dst.hidden, math.sqrt(p.r))
    if not tied:
        yield "lm_head.weight", _pad(w["lm_head.weight"], w["lm_head.weight"].shape[0], p.dst.hidden)


def drafter_tensors(w: dict[str, torch.Tensor], p: Plan, n_features: int) -> Iterator[tuple[str, torch.Tensor]]:
    import torch

    h0, h1 = p.src.hidden, p.dst.hidden
    fc = torch.zeros(h1, n_features * h1, dtype=torch.float32)
    for f in range(n_features):
        fc[:h0, f * h1 : f * h1 + h0] = w["fc.weight"][:, f * h0 : (f + 1) * h0]
    yield "fc.weight", fc
    yield "hidden_norm.weight", _norm(w["hidden_norm.weight"], h1, math.sqrt(p.r))
    for i in range(p.src.layers):
        pre = f"layers.{i}."
        for k, v in _layer({k[len(pre):]: v for k, v in w.items() if k.startswith(pre)}, p, drafter=True).items():
            yield pre + k, v
    yield "norm.weight", _norm(w["norm.weight"], h1, math.sqrt(p.r))


def _target_names(n_layers: int, *, tied: bool, drafter: bool = False) -> set[str]:
    per = [f"{n}.weight" for n in _NORMS] + [f"self_attn.{k}.weight" for k in _ATTN] + \
          [f"mlp.{k}.weight" for k in _MLP]
    if drafter:
        per += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        return {"fc.weight", "hidden_norm.weight", "norm.weight"} | {f"layers.{i}.{k}" for i in range(n_layers)
                                                                        for k in per}
    names = {"model.embed_tokens.weight", "model.norm.weight"} | {f"model.layers.{i}.{k}" for i in range(n_layers)
                                                                  for k in per}
    return names if tied else names | {"lm_head.weight"}


def _check_names(have: set[str], want: set[str], what: str, optional: frozenset[str] = frozenset()) -> None:
    have = {k for k in have if not k.endswith("rotary_emb.inv_freq")} - optional
    if have != want:
        extra, missing = sorted(have - want), sorted(want - have)
        raise UsageError(f"{what}: weights do not match the config ({len(missing)} missing, e.g. "
                         f"{missing[:1]}; {len(extra)} unexpected, e.g. {extra[:1]})")


# ----------------------------------------------------------------------------------------- writing


class _Shards:
    """safetensors shards of at most ``limit`` bytes (one tensor may exceed it), written as they fill."""

    def __init__(self, d: Path, dtype: torch.dtype, limit: int) -> None:
        self.d, self.dtype, self.limit = d, dtype, limit
        self.cur: dict[str, torch.Tensor] = {}
        self.size = 0
        self.parts: list[tuple[Path, list[str]]] = []
        self.total = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        t = t.to(self.dtype).contiguous()
        n = t.numel() * t.element_size()
        if self.cur and self.size + n > self.limit:
            self._flush()
        self.cur[name] = t
        self.size += n
        self.total += n

    def _flush(self) -> None:
        from safetensors.torch import save_file

        f = self.d / f"part-{len(self.parts)}.tmp"
        save_file(self.cur, str(f), metadata={"format": "pt"})
        self.parts.append((f, list(self.cur)))
        self.cur, self.size = {}, 0

    def close(self) -> list[str]:
        if self.cur:
            self._flush()
        n = len(self.parts)
        if n == 1:
            self.parts[0][0].rename(self.d / "model.safetensors")
            return ["model.safetensors"]
        weight_map: dict[str, str] = {}
        names = []
        for i, (f, keys) in enumerate(self.parts):
            name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            f.rename(self.d / name)
            names.append(name)
            weight_map.update(dict.fromkeys(keys, name))
        (self.d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": self.total}, "weight_map": weight_map}, indent=1))
        return names


def _copy_tokenizer(src: Path, dst: Path) -> list[str]:
    copied = []
    for f in sorted(src.iterdir()):
        if f.is_file() and f.name not in _NOT_COPIED and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, dst / f.name)
            copied.append(f.name)
    return copied


def _readable(d: Path) -> None:
    """The modes a plain mkdir / open would give (mkdtemp makes the directory private)."""
    import os

    umask = os.umask(0)
    os.umask(umask)
    d.chmod(0o777 & ~umask)
    for f in d.iterdir():
        f.chmod(0o666 & ~umask)


def _set_dtype(cfg: dict[str, Any], dtype: str) -> None:
    keys = [k for k in ("dtype", "torch_dtype") if k in cfg] or ["torch_dtype"]
    for k in keys:
        cfg[k] = dtype


def _out_ok(out: Path, srcs: list[Path], flag: str) -> None:
    o = out.resolve()
    for s in srcs:
        s = s.resolve()
        if o == s or o in s.parents:
            raise UsageError(f"{flag} {out} would overwrite the source {s}")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {out} exists and is not a directory")


@dataclass(frozen=True)
class _DrafterJob:
    cfg: dict[str, Any]
    plan: Plan
    weights: dict[str, Any]
    ids: list[int]
    src: Path
    out: Path


def _prepare_drafter(src: Path, out: Path, target_cfg: dict[str, Any], tp: Plan) -> _DrafterJob:
    from testbed.models import drafter as drafter_cfg

    dcfg = _read_config(src, "drafter")
    drafter_cfg.check(target_cfg, dcfg)
    dflash = dcfg.get("dflash_config") or {}
    ids = [int(i) for i in dflash.get("target_layer_ids", dcfg.get("target_layer_ids")) or []]
    eps = float(dcfg.get("rms_norm_eps", 1e-6))
    if eps <= 0:
        raise UsageError(f"drafter: rms_norm_eps {eps}: its unused heads would normalise to NaN (needs eps > 0)")
    _check_llama({**dcfg, "model_type": "llama"}, "drafter")
    ds = Shape.of(dcfg)
    dst = Shape(hidden=tp.dst.hidden, layers=ds.layers, heads=tp.dst.heads, kv_heads=tp.dst.kv_heads,
                intermediate=tp.dst.intermediate, head_dim=tp.dst.head_dim)
    dp = plan(dcfg, dst, what="drafter")
    w = _load(_weight_files(src, "drafter"))
    _check_names(set(w), _target_names(ds.layers, tied=True, drafter=True), "drafter")
    if tuple(w["fc.weight"].shape) != (ds.hidden, len(ids) * ds.hidden):
        raise UsageError(f"drafter: fc.weight is {tuple(w['fc.weight'].shape)}, its config wants "
                         f"{(ds.hidden, len(ids) * ds.hidden)}")
    return _DrafterJob(cfg=dcfg, plan=dp, weights=w, ids=ids, src=src, out=out)


def _drafter_config(job: _DrafterJob, target_cfg: dict[str, Any], tp: Plan, dtype: str) -> dict[str, Any]:
    from testbed.models import drafter as drafter_cfg

    cfg = json.loads(json.dumps(job.cfg))
    cfg.update(job.plan.dst.config_fields(), rms_norm_eps=job.plan.eps_out)
    new_ids = [tp.layer_map[i] for i in job.ids]
    dflash = cfg.setdefault("dflash_config", {})
    dflash["target_layer_ids"] = new_ids
    if "target_layer_ids" in cfg:
        cfg["target_layer_ids"] = new_ids
    if "num_target_layers" in dflash:
        dflash["num_target_layers"] = tp.dst.layers
    _set_dtype(cfg, dtype)
    cfg["inflated_from"] = {**job.plan.record(job.src), "target_layer_ids": job.ids}
    drafter_cfg.check(target_cfg, cfg)
    return cfg


def inflate(src: Path | str, out: Path | str, shape: Shape, *, drafter_src: Path | str | None = None,
            drafter_out: Path | str | None = None, dtype: str = "bfloat16",
            shard_bytes: int = SHARD_BYTES) -> dict[str, Any]:
    """Write the inflated target (and drafter) and return the target's config. Everything is checked
    before the first file is written; each output directory appears whole (a temp dir renamed)."""
    import torch

    src, out = Path(src), Path(out)
    if (drafter_src is None) != (drafter_out is None):
        raise UsageError("--drafter-src and --drafter-out go together")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    cfg = _read_config(src, "source")
    _check_llama(cfg, "source")
    tp = plan(cfg, shape)
    tied = bool(cfg.get("tie_word_embeddings", False))
    w = _load(_weight_files(src, "source"))
    _check_names(set(w), _target_names(tp.src.layers, tied=tied), "source",
                 optional=frozenset({"lm_head.weight"} if tied else ()))
    if int(w["model.embed_tokens.weight"].shape[1]) != tp.src.hidden:
        raise UsageError(f"source: embedding width {w['model.embed_tokens.weight'].shape[1]} != hidden_size "
                         f"{tp.src.hidden}")
    srcs = [src]
    job = None
    if drafter_src is not None and drafter_out is not None:
        srcs.append(Path(drafter_src))
        job = _prepare_drafter(Path(drafter_src), Path(drafter_out), cfg, tp)
    _out_ok(out, srcs, "--out")
    new_cfg = json.loads(json.dumps(cfg))
    new_cfg.update(tp.dst.config_fields(), rms_norm_eps=tp.eps_out)
    _set_dtype(new_cfg, dtype)
    new_cfg["inflated_from"] = tp.record(src)
    dcfg = None
    if job is not None:
        _out_ok(job.out, srcs, "--drafter-out")
        if job.out.resolve() == out.resolve():
            raise UsageError("--drafter-out must differ from --out")
        dcfg = _drafter_config(job, new_cfg, tp, dtype)

    tdt = getattr(torch, dtype)
    tmps: list[tuple[Path, Path]] = []
    try:
        for o in [out] + ([job.out] if job else []):
            o.parent.mkdir(parents=True, exist_ok=True)
            tmps.append((Path(tempfile.mkdtemp(prefix=o.name + ".", dir=o.parent)), o))
        t_dir = tmps[0][0]
        shards = _Shards(t_dir, tdt, shard_bytes)
        for name, t in target_tensors(w, tp, tied=tied):
            shards.add(name, t)
        shards.close()
        (t_dir / "config.json").write_text(json.dumps(new_cfg, indent=1))
        _copy_tokenizer(src, t_dir)
        if job is not None and dcfg is not None:
            d_dir = tmps[1][0]
            dshards = _Shards(d_dir, tdt, 1 << 62)  # one file: the layout dflash_train.export writes
            for name, t in drafter_tensors(job.weights, job.plan, len(job.ids)):
                dshards.add(name, t)
            dshards.close()
            (d_dir / "config.json").write_text(json.dumps(dcfg, indent=1))
        for tmp, o in tmps:
            _readable(tmp)
            if o.exists():
                shutil.rmtree(o)
            tmp.rename(o)
    except BaseException:
        for tmp, _ in tmps:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return new_cfg
