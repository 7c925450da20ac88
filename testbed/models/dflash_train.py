"""Train a small DFlash drafter for a target by self-distillation, and export it in the layout
sglang 0.5.23's DFlashDraftModel loads.

The drafter is the computation sglang runs (sglang/srt/models/dflash.py with the DFLASH worker):

- context features: the target's residual stream after each layer in ``target_layer_ids`` (what
  ``set_dflash_layers_to_capture`` captures: the input of layer ``id + 1``), concatenated, then
  ``hidden_norm(fc(.))``. Each draft layer turns them into the context's keys and values
  (``k_norm`` + RoPE on the keys, no input norm), at the context tokens' positions;
- the block ``[last committed token, mask x (B-1)]`` embedded with the target's embedding runs
  through the draft layers (pre-norm attention + SwiGLU MLP, q/k RMS norms per head, RoPE), each
  block token attending to the whole context before it and to the whole block (DFlash's draft
  attention is not causal inside the block), then the final ``norm``;
- the target's ``lm_head`` on block position ``j >= 1`` predicts the token at ``prefix + j``.

Training data is text the target writes itself (sampled continuations of varied prompts); the loss
is the cross-entropy of the drafter's 7 predictions against the target's own tokens. Embedding and
lm_head stay the target's (frozen, not exported: sglang shares them). Fixed seed.

Blocks are anchored only where sglang drafts them: at the answer. After the prefill of an
``n``-token prompt the first block sits at position ``n`` (the target's first token) and every
later one further on, so a block anchored inside the prompt (the chat template, its fixed system
prompt) is never drafted at serving time. Training and the offline acceptance use anchors
``a >= prompt length`` when the prompt lengths are known (``self_distill_corpus`` records them);
``offline.accept_length_all_anchors`` keeps the old every-position figure for comparison.

    python -m testbed.models train-drafter --target DIR --out DIR [--steps 600] [--seed 0]

Export: ``model.safetensors`` (bf16, names as in DFlash checkpoints: ``layers.N.self_attn.q_proj``,
``fc``, ``hidden_norm``, ``norm``, ...) and ``config.json`` built by ``models.drafter`` (checked
against the target) plus ``train.json`` (seed, steps, losses, offline acceptance).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from testbed.models import drafter as drafter_cfg

PROMPTS = (
    "Write a short poem about the ocean.", "Explain how a refrigerator works.", "Give me three tips for sleeping well.",
    "What is the capital of France, and why is it famous?", "Write a Python function that reverses a string.",
    "Describe a day in the life of a lighthouse keeper.", "List the planets of the solar system in order.",
    "How do vaccines train the immune system?", "Write a haiku about autumn leaves.",
    "Summarize the plot of a detective story in four sentences.", "What causes the seasons on Earth?",
    "Explain recursion to a ten-year-old.", "Write a short letter thanking a teacher.",
    "Compare trains and planes for a 500 km trip.", "How does a bicycle stay upright?",
    "Translate 'good morning, how are you?' into French and Spanish.", "Write a recipe for pancakes.",
    "What is photosynthesis?", "Tell a short story about a robot learning to paint.",
    "Give a step-by-step guide to changing a flat tire.",
)


class _RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(v + self.eps)).to(x.dtype) * self.weight


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (rotate halves), x [..., heads, dim], pos broadcastable to x[..., 0, 0]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv  # [..., d/2]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    x1, x2 = x[..., : d // 2].float(), x[..., d // 2 :].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


@dataclass
class DrafterShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    eps: float
    rope_theta: float
    n_features: int


class _Layer(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.s = s
        self.input_layernorm = _RMSNorm(s.hidden, s.eps)
        self.post_attention_layernorm = _RMSNorm(s.hidden, s.eps)
        attn = nn.Module()
        attn.q_proj = nn.Linear(s.hidden, s.heads * s.head_dim, bias=False)
        attn.k_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        attn.v_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        attn.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
        attn.q_norm = _RMSNorm(s.head_dim, s.eps)
        attn.k_norm = _RMSNorm(s.head_dim, s.eps)
        self.self_attn = attn
        mlp = nn.Module()
        mlp.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        mlp.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        mlp.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)
        self.mlp = mlp

    def context_kv(self, ctx: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, s = self.self_attn, self.s
        k = a.k_norm(a.k_proj(ctx).view(*ctx.shape[:-1], s.kv_heads, s.head_dim))
        v = a.v_proj(ctx).view(*ctx.shape[:-1], s.kv_heads, s.head_dim)
        return _rope(k, pos, s.rope_theta), v

    def forward(self, h: torch.Tensor, pos: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                allow: torch.Tensor) -> torch.Tensor:
        """h [S, N, H] the block tokens of S groups; pos [S, N]; ctx_k / ctx_v [S, L, kv, d] each group's context;
        allow [S, N, L + N] bool: which context and block keys each block token sees."""
        a, s = self.self_attn, self.s
        S, N, _ = h.shape
        x = self.input_layernorm(h)
        q = _rope(a.q_norm(a.q_proj(x).view(S, N, s.heads, s.head_dim)), pos, s.rope_theta)
        k = _rope(a.k_norm(a.k_proj(x).view(S, N, s.kv_heads, s.head_dim)), pos, s.rope_theta)
        v = a.v_proj(x).view(S, N, s.kv_heads, s.head_dim)
        rep = s.heads // s.kv_heads
        keys = torch.cat([ctx_k, k], dim=1).repeat_interleave(rep, dim=2)
        vals = torch.cat([ctx_v, v], dim=1).repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2),
                                             attn_mask=allow[:, None, :, :])
        h = h + a.o_proj(out.transpose(1, 2).reshape(S, N, s.heads * s.head_dim))
        m = self.mlp
        y = self.post_attention_layernorm(h)
        return h + m.down_proj(F.silu(m.gate_proj(y)) * m.up_proj(y))


class DFlashDrafter(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.s = s
        self.fc = nn.Linear(s.n_features * s.hidden, s.hidden, bias=False)
        self.hidden_norm = _RMSNorm(s.hidden, s.eps)
        self.layers = nn.ModuleList([_Layer(s) for _ in range(s.layers)])
        self.norm = _RMSNorm(s.hidden, s.eps)

    def forward(self, feats: torch.Tensor, block_embeds: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """feats [L, F*H] target features of one sequence; block_embeds [A, B, H]; anchors [A] (block
        position 0 sits at position anchors[a], its context is feats[:anchors[a]]). Each block is a group of its
        own: its B tokens see the context before it and the whole block (what sglang's draft pass computes)."""
        L = feats.shape[0]
        A, B = block_embeds.shape[:2]
        ctx = self.hidden_norm(self.fc(feats))
        ctx_pos = torch.arange(L, device=feats.device)
        ctx_allow = (ctx_pos.unsqueeze(0) < anchors.unsqueeze(1)).unsqueeze(1).expand(A, B, L)
        allow = torch.cat([ctx_allow, torch.ones(A, B, B, dtype=torch.bool, device=feats.device)], dim=2)
        pos = anchors.unsqueeze(1) + torch.arange(B, device=feats.device).unsqueeze(0)
        h = block_embeds
        for layer in self.layers:
            ck, cv = layer.context_kv(ctx, ctx_pos)
            h = layer(h, pos, ck.unsqueeze(0).expand(A, -1, -1, -1), cv.unsqueeze(0).expand(A, -1, -1, -1), allow)
        return self.norm(h)

    def forward_packed(self, feats: torch.Tensor, block_embeds: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """The same function for S sequences in one pass (training's step: one pass instead of one per sequence,
        whose small kernels left the GPU waiting on their launches). feats [S, L, F*H], each sequence's features
        zero-padded to the longest; block_embeds [S, A, B, H]; anchors [S, A]. A sequence's blocks are one group:
        a block token sees its sequence's context before its anchor and its own block, never another block
        (a block-diagonal mask over the group's A * B tokens). Returns [S, A, B, H]."""
        S, L = feats.shape[:2]
        A, B, H = block_embeds.shape[1:]
        dev = feats.device
        ctx = self.hidden_norm(self.fc(feats))
        ctx_pos = torch.arange(L, device=dev)
        # padding sits at positions >= a sequence's length > every anchor, so no block sees it
        ctx_allow = (ctx_pos.view(1, 1, L) < anchors.unsqueeze(2)).repeat_interleave(B, dim=1)  # [S, A*B, L]
        blk = torch.arange(A * B, device=dev) // B
        own = blk.unsqueeze(1) == blk.unsqueeze(0)  # [A*B, A*B], block-diagonal
        allow = torch.cat([ctx_allow, own.unsqueeze(0).expand(S, -1, -1)], dim=2)
        pos = (anchors.unsqueeze(2) + torch.arange(B, device=dev).view(1, 1, B)).reshape(S, A * B)
        h = block_embeds.reshape(S, A * B, H)
        for layer in self.layers:
            ck, cv = layer.context_kv(ctx, ctx_pos)
            h = layer(h, pos, ck, cv, allow)
        return self.norm(h).view(S, A, B, H)


def shape_for(target_cfg: dict[str, Any], *, layers: int, n_features: int) -> DrafterShape:
    heads = int(target_cfg["num_attention_heads"])
    return DrafterShape(hidden=int(target_cfg["hidden_size"]), heads=heads,
                        kv_heads=int(target_cfg.get("num_key_value_heads", heads)),
                        head_dim=int(target_cfg.get("head_dim") or target_cfg["hidden_size"] // heads),
                        intermediate=int(target_cfg["intermediate_size"]), layers=layers,
                        eps=float(target_cfg.get("rms_norm_eps", 1e-5)),
                        rope_theta=float(target_cfg.get("rope_theta", 10000.0)), n_features=n_features)


def _features(target: nn.Module, ids: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
    """What sglang's ``set_dflash_layers_to_capture`` hands the drafter: for each id (in increasing
    order, the order the target's layer loop captures them) the residual stream entering layer
    ``id + 1``. HF's ``hidden_states[k]`` is the input of layer ``k`` for ``k < n``, but
    ``hidden_states[n]`` is the final-norm output, which sglang never captures (id ``n - 1``)."""
    hs = target(ids.unsqueeze(0), output_hidden_states=True).hidden_states
    _check_layer_ids(layer_ids, len(hs) - 1)
    return torch.cat([hs[i + 1][0] for i in layer_ids], dim=-1)


def _check_layer_ids(layer_ids: list[int], n: int) -> None:
    """The capture ids a target of ``n`` layers can hand the drafter (ValueError otherwise)."""
    if list(layer_ids) != sorted(set(layer_ids)) or not all(0 <= i < n - 1 for i in layer_ids):
        raise ValueError(f"target_layer_ids {list(layer_ids)} must increase and lie in 0..{n - 2} "
                         "(sglang captures the input of layer id + 1, in layer order)")


def features_of(target: nn.Module, seqs: list[torch.Tensor], layer_ids: list[int],
                batch: int = 32) -> list[torch.Tensor]:
    """``_features`` of each sequence (as float32), ``batch`` sequences a forward pass: right-padded (a causal
    model's values at a sequence's own positions never see the padding after them) with the padding masked, in
    order of length so that a batch pads little, through the decoder only (no logits). One sequence a pass was
    2,370 passes and about 65 s on the H100 for the 2,400-answer corpus (2026-12-07)."""
    if batch < 1:
        raise ValueError(f"batch {batch}: at least 1")
    order = sorted(range(len(seqs)), key=lambda i: int(seqs[i].shape[0]))
    out: list[torch.Tensor | None] = [None] * len(seqs)
    for c in range(0, len(order), batch):
        idx = order[c : c + batch]
        width = max(int(seqs[i].shape[0]) for i in idx)
        dev = seqs[idx[0]].device
        ids = torch.zeros((len(idx), width), dtype=torch.long, device=dev)
        mask = torch.zeros((len(idx), width), dtype=torch.long, device=dev)
        for r, i in enumerate(idx):
            n = int(seqs[i].shape[0])
            ids[r, :n], mask[r, :n] = seqs[i], 1
        hs = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        _check_layer_ids(layer_ids, len(hs) - 1)
        cat = torch.cat([hs[k + 1] for k in layer_ids], dim=-1).float()
        for r, i in enumerate(idx):
            out[i] = cat[r, : int(seqs[i].shape[0])].clone()
    return [x for x in out if x is not None]


_TOPICS = (
    "the ocean", "a lighthouse", "volcanoes", "bread baking", "the moon", "honey bees", "train travel",
    "chess", "rain forests", "old libraries", "electric cars", "coffee", "mountain hiking", "the printing press",
    "whales", "city gardens", "glaciers", "jazz music", "the human heart", "bicycles", "deserts", "robots",
    "the Roman empire", "snowstorms", "friendship", "a small bakery", "satellites", "rivers", "octopuses",
    "learning a language",
)
_TASKS = (
    "Write a short poem about {t}.", "Explain {t} to a ten-year-old.", "Give me three facts about {t}.",
    "Write a short story about {t}.", "List five words that describe {t}.", "Why do people care about {t}?",
    "Write a haiku about {t}.", "Describe {t} in two sentences.", "What are the pros and cons of {t}?",
    "Write a friendly letter that mentions {t}.",
)


# how a task is asked
_FRAMES = (
    "", " Keep it brief.", " Use simple words.", " Answer in a cheerful tone.", " Write it for a newspaper.",
    " Make it sound like an old sailor telling it.", " Use exactly three sentences.", " Add one surprising detail.",
)


# The kinds of request a chat model answers, beyond prose (issue 39: a drafter trained on poems and stories alone
# drafts code, tables, lists and sums badly, and the gate's suite asks for all of them). Each kind is its own list;
# the pool deals them in turn, so any first n prompts mix every kind.
_CODE = (
    "reverses a list", "counts the vowels in a string", "checks whether a word is a palindrome",
    "merges two sorted lists", "returns the factorial of n", "finds the largest number in a list",
    "removes duplicates from a list while keeping the order", "counts how often each word appears in a text",
    "converts Celsius to Fahrenheit", "checks whether a number is prime", "sums the digits of an integer",
    "flattens a nested list", "does a binary search in a sorted list", "returns the greatest common divisor of two "
    "numbers", "checks whether a year is a leap year", "capitalizes every word of a sentence",
    "returns the second largest number in a list", "checks whether two strings are anagrams",
    "computes the average of a list of numbers", "returns the n-th power of two", "splits a list into chunks of size k",
    "counts the lines of a text file", "returns the longest word in a sentence", "rotates a list by k places",
    "converts a binary string to an integer", "finds the missing number in a list of 1 to n",
    "returns the common elements of two lists", "checks whether brackets in a string are balanced",
    "transposes a matrix given as a list of lists", "returns the running total of a list",
)
_CODE_LANGS = ("Python", "JavaScript")
_CODE_FRAMES = ("", " Keep it short.", " Add a docstring or comment.", " Show one example call.")
_TABLE_COLUMNS = (
    ("Country", "Capital"), ("Fruit", "Color"), ("Planet", "Moons"), ("Tool", "Use"), ("Instrument", "Family"),
    ("City", "Landmark"), ("Book", "Author"), ("Element", "Symbol"), ("Sport", "Players per team"),
    ("Month", "Days"), ("Vegetable", "Season"), ("Language", "Greeting"), ("Bird", "Habitat"),
    ("Metal", "Property"), ("Shape", "Sides"), ("Drink", "Origin"), ("Tree", "Leaf type"), ("Dog breed", "Size"),
    ("Painter", "Famous work"), ("River", "Continent"),
)
_LIST_THINGS = (
    "vegetables", "colors", "European countries", "programming languages", "musical instruments", "kitchen tools",
    "board games", "ocean animals", "types of clouds", "healthy breakfasts", "famous scientists", "flowers",
    "things to pack for a beach trip", "ways to save water", "hobbies for a rainy day", "car brands", "dances",
    "spices", "birds", "reasons to learn to cook",
)
_STEPS = (
    "make a cup of tea", "wash a car", "set up a fish tank", "write a cover letter", "bake bread",
    "clean a laptop keyboard", "plan a birthday party", "learn to juggle", "repot a house plant", "start running",
    "organize a bookshelf", "make a paper airplane", "brew coffee with a French press", "change a light bulb",
    "prepare for a job interview",
)
_COUNTRIES = (
    "Japan", "Italy", "Canada", "Kenya", "Brazil", "Egypt", "Norway", "Australia", "India", "Mexico", "Spain",
    "Germany", "Argentina", "Thailand", "Peru", "Poland", "Greece", "Vietnam", "Chile", "Portugal",
)
_GUIDES = (
    "train a puppy", "start a small herb garden on a balcony", "keep a sourdough starter alive", "learn a new "
    "language as an adult", "prepare a house for winter", "plan a week of healthy meals", "set up a home office",
    "care for a cat", "build a simple bookshelf", "save money on groceries", "plan a long hike", "keep bees",
)


def _pool_kinds() -> list[list[str]]:
    """The pool's kinds of request, each a list (prose first, in its old order)."""
    prose = list(dict.fromkeys([*PROMPTS, *(task.format(t=t) + f for f in _FRAMES for t in _TOPICS
                                            for task in _TASKS)]))
    code = [f"Write a {lang} function that {c}.{f}" for f in _CODE_FRAMES for lang in _CODE_LANGS for c in _CODE]
    tables = [f"Make a markdown table with two columns, {a} and {b}, with {n} rows." for n in (3, 4, 5)
              for a, b in _TABLE_COLUMNS]
    lists = [*(f"List {n} {t} as a markdown bullet list, one per line." for n in (3, 4, 5, 6) for t in _LIST_THINGS),
             *(f"Give a numbered list of the steps to {s}." for s in _STEPS)]
    sums = [f"What is {a} {op} {b}? Reply with the number and one short sentence."
            for a in range(3, 100, 7) for b in (4, 11, 19, 30, 46) for op in ("plus", "minus", "times")]
    facts = [*(f"What is the capital of {c}? Answer in one sentence." for c in _COUNTRIES),
             *(f"What language is spoken in {c}? Answer in one sentence." for c in _COUNTRIES)]
    guides = [f"Write a detailed guide with several paragraphs on how to {g}." for g in _GUIDES]
    return [prose, code, tables, lists, sums, facts, guides]


def _norm(text: str) -> str:
    return " ".join("".join(ch if ch.isalnum() else " " for ch in text.lower()).split())


def held_out_prompts() -> list[str]:
    """The gate's suite prompts (every ``suite-v*.yaml`` the validation package ships): measured on, never trained
    on. A corpus prompt that contains one (up to case and punctuation: "Write a short poem about the ocean. Keep it
    brief." contains the suite's poem) is left out of the pool, so a served accept length on the suite is not a
    memorized answer's."""
    return [str(p["prompt"]) for p in _suite_entries()]


def _suite_entries() -> list[dict[str, Any]]:
    import yaml

    d = Path(__file__).resolve().parents[2] / "src" / "sglfleet" / "validation" / "prompts"
    files = sorted(d.glob("suite-v*.yaml"))
    if not files:
        raise FileNotFoundError(f"no gate suite (suite-v*.yaml) under {d}: the held-out prompts are unknown")
    return [dict(p) for f in files for p in (yaml.safe_load(f.read_text()) or {}).get("prompts", [])]


def prompt_pool() -> list[str]:
    """Every distinct chat prompt of the corpus, the kinds dealt in turn (a kind that runs out drops out), without
    the gate's suite prompts (``held_out_prompts``)."""
    held = [_norm(h) for h in held_out_prompts()]
    kinds = [[p for p in kind if not any(h in _norm(p) for h in held)] for kind in _pool_kinds()]
    dealt: list[str] = []
    for i in range(max(len(k) for k in kinds)):
        dealt += [k[i] for k in kinds if i < len(k)]
    return list(dict.fromkeys(dealt))


def corpus_prompts(n: int) -> list[str]:
    """``n`` distinct chat prompts. A prompt asked twice writes the same text at T=0, which would
    weight it twice and could put a copy of a training sequence in the held-out set that measures
    acceptance, so more prompts than the pool holds are refused."""
    pool = prompt_pool()
    if not 1 <= n <= len(pool):
        raise ValueError(f"--seqs {n}: between 1 and {len(pool)} (the distinct prompts of the corpus)")
    return pool[:n]


def _chat_ids(tok: Any, text: str, add_generation_prompt: bool = True) -> list[int]:
    """The ids of a one-turn chat whose user says ``text`` (a tokenizer may hand back a mapping)."""
    got = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=add_generation_prompt)
    return [int(x) for x in (got["input_ids"] if isinstance(got, dict) or hasattr(got, "keys") else got)]


def _user_turn_prefix(tok: Any) -> list[int]:
    """The ids a chat template puts before a user's words (its system turn, the user role's header): the longest
    common start of two one-turn conversations that differ only in the words."""
    a, b = (_chat_ids(tok, t, add_generation_prompt=False) for t in ("Hello there.", "Quite different words!"))
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def self_asked_prompts(target: nn.Module, tok: Any, n: int, *, seed: int, device: str, exclude: list[str],
                       batch: int = 256, max_new: int = 48, temperature: float = 1.0,
                       stats: dict[str, int] | None = None) -> list[str]:
    """``n`` distinct chat prompts the target writes itself: sampled (``temperature``, top-p 0.95) from its chat
    template's user turn, the way a chat model's own distribution asks (no text from outside the machine). Kept:
    a request that ends (the end-of-turn token) within ``max_new`` tokens, of 3 to 60 words, unlike every other
    kept one and every one of ``exclude`` (the pool's prompts) up to case and punctuation, and neither inside nor
    around a gate suite prompt (``held_out_prompts``: measured on, never trained on). ValueError when 8n
    requests do not give n. ``stats``: filled with the requests sampled and why the others were dropped."""
    if n < 1:
        raise ValueError(f"self-asked prompts: {n} (at least 1)")
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    prefix = _user_turn_prefix(tok)
    if not prefix:
        raise ValueError("the chat template has no user-turn prefix to ask from")
    held = [_norm(h) for h in held_out_prompts()]
    seen = {_norm(e) for e in exclude}
    kept: list[str] = []
    tries = 0
    why = {"cut_off": 0, "length": 0, "duplicate": 0, "suite": 0}
    x = torch.tensor([prefix] * batch, device=device)
    while len(kept) < n:
        if tries >= 8 * n:
            raise ValueError(f"self-asked prompts: {len(kept)} of {n} kept from {tries} requests")
        torch.manual_seed(seed * 7919 + tries)
        with torch.no_grad():
            y = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, pad_token_id=pad,
                                do_sample=True, temperature=temperature, top_p=0.95)
        tries += batch
        for row in y[:, len(prefix):].tolist():
            if len(kept) == n:
                break
            if eos not in row:
                why["cut_off"] += 1  # not a whole request
                continue
            text = " ".join(tok.decode(row[: row.index(eos)], skip_special_tokens=True).split())
            key = _norm(text)
            drop = ("length" if not 3 <= len(text.split()) <= 60 or not key else "duplicate" if key in seen else
                    "suite" if any(h in key or key in h for h in held) else None)
            if drop:
                why[drop] += 1
                continue
            seen.add(key)
            kept.append(text)
        print(f"[train-drafter] {len(kept)}/{n} prompts asked by the target ({tries} requests)", flush=True)
    if stats is not None:
        stats.update(requests=tries, kept=len(kept), **{f"dropped_{k}": v for k, v in why.items()})
    return kept


class Corpus(list):
    """Target-written sequences (a list of 1-D id tensors) with each one's prompt length and the index of the prompt
    it answers (``prompts``; default one prompt each, in order) among ``n_prompts`` (default the largest index + 1):
    several answers to one prompt share an index, so that a split by prompt keeps them on one side. ``texts``: the
    prompts' own words, one per prompt index, where known (a corpus with self-asked prompts keeps them, so that more
    answers later answer the same sampled prompts instead of asking again)."""

    def __init__(self, seqs: list[torch.Tensor], prompt_lens: list[int], prompts: list[int] | None = None,
                 n_prompts: int | None = None, texts: list[str] | None = None) -> None:
        super().__init__(seqs)
        self.texts = None if texts is None else [str(t) for t in texts]
        if len(prompt_lens) != len(seqs):
            raise ValueError("one prompt length per sequence")
        self.prompt_lens = [int(p) for p in prompt_lens]
        self.prompts = list(range(len(seqs))) if prompts is None else [int(g) for g in prompts]
        if len(self.prompts) != len(seqs) or any(g < 0 for g in self.prompts):
            raise ValueError("one prompt index (>= 0) per sequence")
        self.n_prompts = max(self.prompts, default=-1) + 1 if n_prompts is None else int(n_prompts)
        if self.n_prompts <= max(self.prompts, default=-1):
            raise ValueError(f"a prompt index beyond n_prompts {self.n_prompts}")
        if self.texts is not None and len(self.texts) != self.n_prompts:
            raise ValueError(f"{len(self.texts)} prompt texts for {self.n_prompts} prompts")


# the temperatures a corpus's answers are written at, one prompt in four each (answer j of prompt i at
# CORPUS_TEMPS[(i + j) % 4]: a prompt's answers are at distinct temperatures, so at most one is greedy)
CORPUS_TEMPS = (0.0, 0.6, 0.8, 1.0)


def self_distill_corpus(target: nn.Module, tok: Any, *, n: int, max_new: int, seed: int,
                        device: str, batch: int = 64, answers: int = 1, base: Corpus | None = None,
                        prompts: list[str] | None = None) -> Corpus:
    """Sequences the target writes itself: ``n`` chat prompts, each answered ``answers`` times (1 to 4) at
    T 0 / 0.6 / 0.8 / 1.0 (``CORPUS_TEMPS``: one prompt in four each, a prompt's answers each at another one),
    generated in left-padded batches; each sequence is its prompt plus the answer up to and including the first
    end-of-sequence token (``.prompt_lens``: each prompt's length; ``.prompts``: which prompt). The first answers
    are the one-answer corpus's, the same text. ``base``: a corpus of the same recipe with fewer answers per prompt
    (as this function wrote it): its answers are kept and only the rest are written. ``prompts``: the ``n`` prompts
    (default ``corpus_prompts(n)``); a base may then answer only their first ``base.n_prompts`` (the pool's, before
    the self-asked ones), its answers kept and the later prompts' written."""
    if not 1 <= answers <= len(CORPUS_TEMPS):
        raise ValueError(f"answers {answers}: 1 to {len(CORPUS_TEMPS)} (one per temperature)")
    prompts = corpus_prompts(n) if prompts is None else list(prompts)
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for a corpus of {n}")
    nb, kb = 0, 0  # the base's prompts and answers to each
    if base is not None:
        nb = base.n_prompts
        kb = len(base) // nb if nb else 0
        if (not 1 <= nb <= n or len(base) != kb * nb or base.prompts != list(range(nb)) * kb or kb > answers
                or (nb, kb) == (n, answers)):
            raise ValueError(f"the base corpus ({len(base)} answers to {base.n_prompts} prompts) is not this "
                             f"recipe's with fewer answers or prompts than {answers} answers to each of {n} prompts")
    b_seqs, b_lens = (list(base), base.prompt_lens) if base is not None else ([], [])
    seqs: list[torch.Tensor] = []
    plens: list[int] = []
    groups: list[int] = []
    t0 = time.time()
    written = 0
    for j in range(answers):
        keep = nb if j < kb else 0  # prompts whose answer j the base has
        out: dict[int, tuple[torch.Tensor, int]] = {}
        for g, t in enumerate(CORPUS_TEMPS):
            idx = [i for i in range(keep, n) if (i + j) % len(CORPUS_TEMPS) == g]
            for c in range(0, len(idx), batch):
                chunk = idx[c : c + batch]
                torch.manual_seed(seed * 1000 + g * 100 + c + j * 1_000_003)
                for i, got in zip(chunk, _answers(target, tok, [prompts[i] for i in chunk], max_new, t, device),
                                  strict=True):
                    out[i] = got
                written += len(chunk)
                print(f"[train-drafter] corpus {written}/{n * answers - nb * kb} sequences written by the "
                      f"target ({time.time() - t0:.0f}s)", flush=True)
        for i in range(n):
            seq, plen = (b_seqs[j * nb + i], b_lens[j * nb + i]) if i < keep else out[i]
            seqs.append(seq)
            plens.append(plen)
            groups.append(i)
    return Corpus(seqs, plens, groups, n, texts=prompts)



def corpus_meta(target_cfg: dict[str, Any], *, n: int, max_new: int, seed: int, answers: int = 1,
                self_asked: int = 0) -> dict[str, Any]:
    """What makes a corpus: the recipe that wrote it and the target that wrote it (its shape and vocabulary);
    ``answers`` per prompt only when more than one and ``self_asked`` prompts only when some (a one-answer corpus
    of the pool's prompts has the meta it always had)."""
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads")
    meta: dict[str, Any] = {"seqs": n, "max_new": max_new, "seed": seed, "target": {k: target_cfg.get(k) for k in keys}}
    if answers != 1:
        meta["answers"] = answers
    if self_asked:
        meta["self_asked"] = self_asked
    return meta


def same_held_out(prior: dict[str, Any] | None, meta: dict[str, Any]) -> bool:
    """Whether a drafter trained on the corpus ``prior`` describes may go on training on ``meta``'s: the held-out
    tenth (the first tenth of the prompts, ``split_sets``) must be the same prompts and the text the same target's,
    so its prompts (``seqs``), ``max_new`` and target must agree; the seed and the answers per prompt may differ
    (more answers to the same training prompts). No prior corpus recorded: yes."""
    if prior is None:
        return True
    return all(prior.get(k) == meta.get(k) for k in ("seqs", "max_new", "target", "self_asked"))


def save_corpus(corpus: Corpus, path: Path | str, meta: dict[str, Any]) -> Path:
    """The corpus in one file (its ids flat as int32 with offsets, its prompt lengths and ``meta``), so a later
    device call trains on it without having the target write it again (2,400 answers: 146 s on the H100)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lens = [int(x.shape[0]) for x in corpus]
    flat = torch.cat([x.to(torch.int32).cpu() for x in corpus]) if corpus else torch.zeros(0, dtype=torch.int32)
    d = {"meta": meta, "ids": flat, "lens": lens, "prompt_lens": list(corpus.prompt_lens)}
    if corpus.prompts != list(range(len(corpus))) or corpus.n_prompts != len(corpus):
        d.update(prompts=list(corpus.prompts), n_prompts=corpus.n_prompts)
    if meta.get("self_asked") and corpus.texts is not None:  # the sampled prompts, for more answers to them later
        d["prompt_texts"] = list(corpus.texts)
    torch.save(d, str(path))
    return path


# the default recipe's corpus (2,400 answers of up to 256 tokens, seed 0, SmolLM2-135M), kept in the tree xz-compressed
TRACKED_CORPUS = Path(__file__).resolve().parent / "corpora" / "smollm2-2400x256-seed0.pt.xz"


def load_corpus(path: Path | str, meta: dict[str, Any], device: str = "cpu") -> Corpus:
    """A corpus ``save_corpus`` wrote (or that file xz-compressed, ``*.xz``, as ``TRACKED_CORPUS``), refused
    (ValueError) when it was written by another recipe or target."""
    d = _read_corpus(path)
    if d.get("meta") != meta:
        raise ValueError(f"{path}: a corpus of another recipe or target ({d.get('meta')}, not {meta})")
    return _corpus_of(d, device)


def load_fewer_answers(path: Path | str, meta: dict[str, Any], device: str = "cpu") -> Corpus:
    """A corpus of ``meta``'s recipe with fewer answers per prompt (``self_distill_corpus``'s ``base``), refused
    (ValueError) when the file holds anything else."""
    d = _read_corpus(path)
    have = d.get("meta") or {}

    def rest(m: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in m.items() if k not in ("answers", "self_asked")}

    want, asked = int(meta.get("answers", 1)), int(meta.get("self_asked", 0))
    a, s = int(have.get("answers", 1)), int(have.get("self_asked", 0))
    # fewer answers to the same prompts, or (with self-asked prompts) at most as many to the pool's prompts alone
    if rest(have) != rest(meta) or not ((s == asked and a < want) or (asked and s == 0 and a <= want)):
        raise ValueError(f"{path}: not a corpus of this recipe with fewer answers per prompt, or of its pool's "
                         f"prompts alone ({d.get('meta')})")
    return _corpus_of(d, device)


def _read_corpus(path: Path | str) -> dict[str, Any]:
    if str(path).endswith(".xz"):
        import lzma

        with lzma.open(path) as f:
            return torch.load(f, weights_only=True)
    return torch.load(str(path), weights_only=True)


def _corpus_of(d: dict[str, Any], device: str) -> Corpus:
    seqs = [x.to(torch.long).to(device) for x in torch.split(d["ids"], d["lens"])]
    return Corpus(seqs, d["prompt_lens"], d.get("prompts"), d.get("n_prompts"), texts=d.get("prompt_texts"))


def load_drafter(src: Path | str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An exported drafter's weights (as float32) and its ``train.json``, to go on training it (``train``'s
    ``init_state``)."""
    from safetensors.torch import load_file

    src = Path(src)
    missing = [f for f in ("model.safetensors", "train.json") if not (src / f).is_file()]
    if missing:
        raise ValueError(f"{src}: not a drafter train-drafter exported (missing {', '.join(missing)})")
    state = {k: v.float() for k, v in load_file(str(src / "model.safetensors")).items()}
    return state, json.loads((src / "train.json").read_text())


def _answers(target: nn.Module, tok: Any, prompts: list[str], max_new: int, temperature: float,
             device: str) -> list[tuple[torch.Tensor, int]]:
    """The target's answers to chat prompts, generated in one left-padded batch (greedy at T=0, else sampled with
    top-p 0.95 from the global torch seed): each is (prompt + answer up to and including the first end-of-sequence
    token, prompt length)."""
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    rows = [_chat_ids(tok, p) for p in prompts]
    width = max(len(r) for r in rows)
    x = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    kw = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature, "top_p": 0.95}
    with torch.no_grad():
        y = target.generate(x, attention_mask=attn, max_new_tokens=max_new, pad_token_id=pad, **kw)
    out = []
    for r, row in zip(rows, y[:, width:].tolist(), strict=True):
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]
        out.append((torch.tensor(r + row, device=device), len(r)))
    return out


def suite_corpus(target: nn.Module, tok: Any, *, device: str, max_new: int = 256) -> Corpus:
    """The target's greedy answers to the gate's suite prompts (held out of training: ``held_out_prompts``), each
    up to its own ``max_tokens`` (at most ``max_new``): what a served accept length on the suite is measured on."""
    entries = _suite_entries()
    width = min(max_new, max(int(e.get("max_tokens", max_new)) for e in entries))
    got = _answers(target, tok, [str(e["prompt"]) for e in entries], width, 0.0, device)
    seqs, plens = [], []
    for e, (seq, pl) in zip(entries, got, strict=True):
        seqs.append(seq[: pl + min(width, int(e.get("max_tokens", width)))])
        plens.append(pl)
    return Corpus(seqs, plens)


def suite_acceptance(model: DFlashDrafter, target: nn.Module, corpus: Corpus, layer_ids: list[int], block: int,
                     mask_id: int) -> dict[str, Any]:
    """``offline_acceptance`` on the suite's greedy answers (``suite_corpus``), anchored where sglang drafts."""
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    with torch.no_grad():
        feats = features_of(target, list(corpus), layer_ids)
    return offline_acceptance(model, feats, list(corpus), embed, head, block, mask_id, prompt_lens=corpus.prompt_lens)


def _first_anchor(prompt_len: int | None) -> int:
    """The first position sglang anchors a block at: the prompt's length (its first block's token
    0 is the target's first answer token); 1 when the prompt is unknown."""
    return max(1, int(prompt_len or 0))


def split_sets(groups: list[int], n_prompts: int) -> tuple[list[int], list[int], list[int]]:
    """Sequences (``groups[i]``: the prompt sequence i answers, of ``n_prompts``) as indices (training, held out,
    validation), split by prompt so that a prompt's answers fall on one side: the answers to the first tenth of the
    prompts (at least one) are held out for the offline figures; those to every 20th prompt of the rest that has
    answers (at least one) validate during training and are not trained on (unless that leaves no training)."""
    cut = max(1, n_prompts // 10)
    held = [i for i, g in enumerate(groups) if g < cut]
    rest = sorted({g for g in groups if g >= cut})
    vp = set(rest[::20] if len(rest) >= 20 else rest[-1:])
    val = [i for i, g in enumerate(groups) if g in vp]
    train = [i for i, g in enumerate(groups) if g >= cut and g not in vp]
    return (train or val), held, val


def train(target: nn.Module, seqs: list[torch.Tensor], target_cfg: dict[str, Any], *, block: int = 8,
          layers: int = 1, layer_ids: list[int] | None = None, steps: int = 600, anchors_per_seq: int = 16,
          seqs_per_step: int = 8, lr: float = 3e-4, seed: int = 0, device: str = "cpu",
          prompt_lens: list[int] | None = None, log=print, deadline: float | None = None,
          position_decay: float = 0.0, init_from_target: bool = False,
          init_state: dict[str, torch.Tensor] | None = None,
          prior: dict[str, Any] | None = None, checks: int = 20) -> tuple[DFlashDrafter, dict]:
    """``prompt_lens`` (default: ``seqs.prompt_lens`` of a ``Corpus``, else none known): blocks are
    anchored only at or after each prompt's end, where sglang drafts them. ``deadline`` (a ``time.time()``):
    the step count is fitted to what ends by then, from the steps' time after the first (which carries the CUDA
    warm-up: on the H100 its 1 s made 10 timed steps read 71 ms a step against 16 ms, and a 500 s call stopped
    after 93 s, 2026-12-07): after 10 steps and again after 100 and 1,000, never above the planned count (the
    learning-rate schedule follows the fitted count), so a device call with a hard limit still returns a drafter.
    ``checks`` (>= 1, denser early: ``next_check_after``): times the loss on a validation set (5 % of the training
    sequences, at least one, with fixed anchors; never the held-out set the offline figures use) is measured during
    training; the drafter returned is the one at the lowest validation loss (a small corpus is learnt by heart:
    25,000 steps on 2,133 answers drove the training loss to 0.001 and the held-out accept length from 1.55 to 1.40,
    2026-12-07), and the report keeps every check (``validation``) and the step it kept (``kept_step``).
    ``position_decay`` > 0: block position j's loss weighs exp(-(j - 1) / position_decay) (normalised to mean 1):
    a chain commits a drafted token only when every one before it was right, so the early positions carry the
    accept length; 0 weighs them alike. ``init_from_target``: the draft layers start as copies of the target's
    last layers (their attention and MLP weights and norms; the q / k norms at one, ``fc`` random).
    ``init_state`` / ``prior`` (``load_drafter``): go on training a drafter an earlier call exported (device time
    comes in short calls): its weights must fit this shape exactly (a ValueError names what differs); the report
    counts the steps of every call (``steps_total``) and keeps the earlier one's under ``resumed_from``."""
    torch.manual_seed(seed)
    if prompt_lens is None:
        prompt_lens = getattr(seqs, "prompt_lens", None)
    plens = [None] * len(seqs) if prompt_lens is None else [int(p) for p in prompt_lens]
    if len(plens) != len(seqs):
        raise ValueError("one prompt length per sequence")
    groups = list(getattr(seqs, "prompts", range(len(seqs))))
    n_prompts = int(getattr(seqs, "n_prompts", len(seqs)))
    keep = [i for i, x in enumerate(seqs) if x.shape[0] >= block + 4 and x.shape[0] - block > _first_anchor(plens[i])]
    seqs, plens, groups = [seqs[i] for i in keep], [plens[i] for i in keep], [groups[i] for i in keep]
    if len(seqs) < 2:
        raise ValueError(f"need at least 2 target-written sequences longer than {block + 3} tokens "
                         "with an answer of more than one block")
    cfg = drafter_cfg.drafter_config_for(target_cfg, block_size=block, layers=layers, target_layer_ids=layer_ids)
    layer_ids = cfg["dflash_config"]["target_layer_ids"]
    mask_id = cfg["dflash_config"]["mask_token_id"]
    if position_decay < 0:
        raise ValueError(f"position_decay {position_decay}: 0 (uniform) or a positive decay length")
    model = DFlashDrafter(shape_for(target_cfg, layers=layers, n_features=len(layer_ids))).to(device)
    if init_state is not None and init_from_target:
        raise ValueError("init_state and init_from_target: a drafter starts from one of them")
    if init_state is not None:
        want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in init_state.items()}
        if want != got:
            diff = sorted(set(want) ^ set(got)) or sorted(k for k in want if want[k] != got[k])
            raise ValueError(f"the drafter to go on with has another shape (layers, block or target layers): "
                             f"{', '.join(diff[:4])}{' ...' if len(diff) > 4 else ''} differ")
        model.load_state_dict({k: v.to(device) for k, v in init_state.items()})
    if init_from_target:
        copy_target_layers(model, target)
    pos_w = position_weights(block, position_decay).to(device)
    embed = target.get_input_embeddings()
    head = target.get_output_embeddings()
    for p in target.parameters():
        p.requires_grad_(False)
    t_feat = time.time()
    with torch.no_grad():
        feats = features_of(target, list(seqs), layer_ids)
    log(f"[train-drafter] target features of {len(seqs)} sequences ({time.time() - t_feat:.0f}s)")
    if checks < 1:
        raise ValueError(f"checks {checks}: at least one validation check")
    train_idx, held, val = split_sets(groups, n_prompts)
    if not held:
        raise ValueError("no sequence answers a held-out prompt (the first tenth of the prompts)")
    val_rng_seed = seed + 7919
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = torch.Generator(device="cpu").manual_seed(seed)
    losses = []
    t0 = time.time()
    planned = steps
    step = 0
    # TF32 matmuls for the steps on CUDA (bench/drafter_step.py measures it beside fp32); restored after the
    # loop, so the offline figures are computed in fp32
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    matmul = "tf32" if str(device).startswith("cuda") else "fp32"
    torch.backends.cuda.matmul.allow_tf32 = matmul == "tf32"
    t1 = t0  # the end of the first step (its CUDA warm-up is not a step's cost)
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    validation: list[dict[str, float]] = []

    def check(at: int) -> None:
        nonlocal best
        vl = validation_loss(model, [feats[i] for i in val], [seqs[i] for i in val], embed, head, block, mask_id,
                             anchors_per_seq, val_rng_seed, [_first_anchor(plens[i]) for i in val], pos_w)
        validation.append({"step": at, "loss": vl})
        if best is None or vl < best[0]:
            best = (vl, at, {k: v.detach().clone() for k, v in model.state_dict().items()})

    next_check = 0
    while step < steps:
        if deadline is not None and step in (10, 100, 1000) and step < steps:
            per = (time.time() - t1) / (step - 1)
            fit = step + int(max(0.0, deadline - time.time() - 30.0) / max(per, 1e-6))  # 30 s for the rest
            fitted = min(planned, max(step + 1, fit))
            if fitted != steps:
                steps = fitted
                log(f"[train-drafter] {per * 1000:.0f} ms a step: {steps} of {planned} steps fit before the deadline")
        if step >= next_check:
            check(step)
            next_check = next_check_after(step, steps, checks)
        picks = torch.randint(0, len(train_idx), (seqs_per_step,), generator=rng).tolist()
        chosen = [train_idx[j] for j in picks]
        loss = _packed_loss(model, [feats[i] for i in chosen], [seqs[i] for i in chosen], embed, head, block,
                            mask_id, anchors_per_seq, rng, [_first_anchor(plens[i]) for i in chosen], weights=pos_w)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for gr in opt.param_groups:  # cosine decay
            gr["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / max(1, steps)))
        opt.step()
        losses.append(float(loss.detach()))
        if step % max(1, steps // 10) == 0:
            log(f"[train-drafter] step {step}/{steps} loss {losses[-1]:.3f} ({time.time() - t0:.0f}s)")
        if step == 0:
            t1 = time.time()
        step += 1
    torch.backends.cuda.matmul.allow_tf32 = tf32_before
    check(step)
    assert best is not None
    kept_loss, kept_step, kept_state = best
    if kept_step != step:
        model.load_state_dict(kept_state)
        log(f"[train-drafter] kept the drafter of step {kept_step} (validation loss {kept_loss:.3f}; "
            f"{validation[-1]['loss']:.3f} at the last step)")
    acc = offline_acceptance(model, [feats[i] for i in held], [seqs[i] for i in held], embed, head, block, mask_id,
                             prompt_lens=[plens[i] for i in held])
    acc["accept_length_all_anchors"] = offline_acceptance(
        model, [feats[i] for i in held], [seqs[i] for i in held], embed, head, block, mask_id)["accept_length"]
    report = {"seed": seed, "steps": steps, "steps_planned": planned, "anchors_per_seq": anchors_per_seq,
              "lr": lr, "matmul": matmul, "packed_step": True, "block_size": block, "layers": layers,
              "target_layer_ids": layer_ids, "mask_token_id": mask_id,
              "position_decay": position_decay, "init_from_target": init_from_target,
              "loss_first": sum(losses[:20]) / max(1, len(losses[:20])),
              "loss_last": sum(losses[-20:]) / max(1, len(losses[-20:])), "offline": acc,
              "train_seqs": len(train_idx), "held_out_seqs": len(held), "seqs_per_step": seqs_per_step,
              "train_tokens": int(sum(seqs[i].shape[0] for i in train_idx)), "seconds": time.time() - t0,
              "validation_seqs": len(val), "validation": validation, "kept_step": kept_step}
    report["steps_total"] = steps + (int(prior.get("steps_total", prior.get("steps", 0))) if prior else 0)
    if prior is not None:
        report["resumed_from"] = {k: prior.get(k) for k in ("steps", "steps_total", "loss_last", "offline",
                                                             "offline_suite", "seconds")}
    return model, report


# the first validation checks' spacing: a small corpus's validation loss can bottom out within a few thousand steps
# (two answers to 2,400 prompts: lowest at the first check, step 3,000 of 24,587, then climbing, 2026-12-07), so
# the early checks come every EARLY_CHECK steps and then every half the steps so far, up to steps // checks
EARLY_CHECK = 250


def next_check_after(step: int, steps: int, checks: int) -> int:
    """The step of the validation check after one at ``step`` of ``steps`` (``checks`` of them spread evenly,
    denser at the start: ``EARLY_CHECK``)."""
    return step + max(1, min(steps // checks, max(EARLY_CHECK, step // 2)))


def position_weights(block: int, decay: float) -> torch.Tensor:
    """The loss weight of block positions 1..block-1: exp(-(j - 1) / decay), normalised to mean 1 (all ones at 0)."""
    j = torch.arange(block - 1, dtype=torch.float32)
    w = torch.ones_like(j) if decay == 0 else torch.exp(-j / decay)
    return w / w.mean()


def copy_target_layers(model: DFlashDrafter, target: nn.Module) -> None:
    """The draft layers as copies of the target's last ``len(model.layers)`` decoder layers (a Hugging Face Llama:
    ``model.layers[i]`` with ``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj`` and the two norms)."""
    src = list(target.model.layers)[-len(model.layers):]
    names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")
    with torch.no_grad():
        for dst, layer in zip(model.layers, src, strict=True):
            for n in names:
                d, t = dst.get_submodule(n).weight, layer.get_submodule(n).weight
                if d.shape != t.shape:
                    raise ValueError(f"{n}: the drafter's {tuple(d.shape)} is not the target's {tuple(t.shape)}")
                d.copy_(t.to(d.dtype))


def _block_loss(model, feats, seq, embed, head, block, mask_id, n_anchor, rng, lo: int = 1,
                weights: torch.Tensor | None = None) -> torch.Tensor:
    """One sequence's blocks through ``DFlashDrafter.forward`` (the reference ``_packed_loss`` is checked against)."""
    anchors, ids, labels = _draw_blocks(seq, block, mask_id, n_anchor, rng, lo)
    with torch.no_grad():
        e = embed(ids).float()
    h = model(feats, e, anchors)
    logits = head(h[:, 1:, :].to(head.weight.dtype)).float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return ce.mean() if weights is None else (ce.view(n_anchor, block - 1) * weights).mean()


def _draw_blocks(seq: torch.Tensor, block: int, mask_id: int, n_anchor: int, rng: torch.Generator,
                 lo: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n_anchor random anchors in [lo, len - block) (drawn from ``rng``, as ``_block_loss`` draws them), the blocks'
    ids [last committed token, mask ...] and their labels (the next block - 1 tokens of the text)."""
    hi = seq.shape[0] - block
    if hi <= lo:
        raise ValueError("sequence shorter than a block after its first anchor")
    anchors = torch.randint(lo, hi, (n_anchor,), generator=rng).to(seq.device)
    ids = torch.full((n_anchor, block), mask_id, dtype=torch.long, device=seq.device)
    ids[:, 0] = seq[anchors]
    offs = torch.arange(1, block, device=seq.device)
    return anchors, ids, seq[anchors.unsqueeze(1) + offs.unsqueeze(0)]


def _packed_loss(model, feats: list[torch.Tensor], seqs: list[torch.Tensor], embed, head, block, mask_id, n_anchor,
                 rng, los: list[int], weights: torch.Tensor | None = None) -> torch.Tensor:
    """The mean of ``_block_loss`` over the sequences (the same anchors from the same ``rng``), in one packed pass
    (``DFlashDrafter.forward_packed``)."""
    drawn = [_draw_blocks(s, block, mask_id, n_anchor, rng, lo) for s, lo in zip(seqs, los, strict=True)]
    packed = nn.utils.rnn.pad_sequence(feats, batch_first=True)  # zeros after each sequence's end
    anchors = torch.stack([d[0] for d in drawn])
    ids = torch.stack([d[1] for d in drawn])
    labels = torch.stack([d[2] for d in drawn])
    with torch.no_grad():
        e = embed(ids).float()
    h = model.forward_packed(packed, e, anchors)
    logits = head(h[:, :, 1:, :].to(head.weight.dtype)).float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return ce.mean() if weights is None else (ce.view(-1, block - 1) * weights).mean()


@torch.no_grad()
def validation_loss(model, feats: list[torch.Tensor], seqs: list[torch.Tensor], embed, head, block, mask_id, n_anchor,
                    seed: int, los: list[int], weights: torch.Tensor | None = None, chunk: int = 8) -> float:
    """The training loss on sequences kept out of training, with the same anchors at every call (drawn from a
    generator seeded with ``seed``), in packed chunks of ``chunk`` sequences; each sequence weighs alike."""
    rng = torch.Generator(device="cpu").manual_seed(seed)
    total = 0.0
    for c in range(0, len(seqs), chunk):
        part = slice(c, c + chunk)
        n = len(seqs[part])
        total += float(_packed_loss(model, feats[part], seqs[part], embed, head, block, mask_id, n_anchor, rng,
                                    los[part], weights=weights)) * n
    return total / max(1, len(seqs))


@torch.no_grad()
def offline_acceptance(model, feats_list, seqs, embed, head, block, mask_id, prompt_lens=None) -> dict:
    """Mean chain accept length if the target's next tokens are the held-out text: 1 + the number
    of leading drafted tokens that equal it (what DFLASH commits per step on that text). With
    ``prompt_lens``, blocks are anchored only where sglang drafts them (position >= prompt length)."""
    lens, top1 = [], []
    plens = [None] * len(seqs) if prompt_lens is None else list(prompt_lens)
    for feats, seq, plen in zip(feats_list, seqs, plens, strict=True):
        lo = _first_anchor(plen)
        if seq.shape[0] - block <= lo:
            continue
        anchors = torch.arange(lo, seq.shape[0] - block, 3, device=seq.device)
        ids = torch.full((anchors.numel(), block), mask_id, dtype=torch.long, device=seq.device)
        ids[:, 0] = seq[anchors]
        pred = head(model(feats, embed(ids).float(), anchors)[:, 1:, :].to(head.weight.dtype)).argmax(-1)
        truth = torch.stack([seq[a + 1 : a + block] for a in anchors.tolist()])
        match = (pred == truth).int()
        lead = torch.cumprod(match, dim=1).sum(1)
        lens += (lead + 1).tolist()
        top1.append(match[:, 0].float().mean().item())
    return {"accept_length": sum(lens) / max(1, len(lens)), "first_token_hit": sum(top1) / max(1, len(top1)),
            "blocks": len(lens)}


def export(model: DFlashDrafter, target_cfg: dict[str, Any], out: Path | str, report: dict) -> Path:
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = drafter_cfg.drafter_config_for(target_cfg, block_size=report["block_size"], layers=report["layers"],
                                         target_layer_ids=report["target_layer_ids"])
    save_file({k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "train.json").write_text(json.dumps(report, indent=1))
    return out
