"""One tree target-verify case driven through a real sglang attention backend
(Triton, or FlashInfer with backend="flashinfer")."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

BLOCK = 8  # DFlash draft block size (--speculative-num-draft-tokens)
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 8, 2, 128
TOL = 2e-2  # max |out - ref| for bf16 inputs/outputs vs the fp32 reference
# DDTREE_MUTANT set: eager inputs get guard rows (see run_eager); graph static rows
# (bs x 64) already cover a block-size-indexed batch.
GUARD = bool(os.environ.get("DDTREE_MUTANT"))


def random_tree(budget: int, topk: int, gen: torch.Generator) -> list[int]:
    """Parents of a random draft tree: node 0 is the root, nodes 1..budget each
    hang under an earlier node with fewer than `topk` children."""
    parents, children = [-1], [0]
    for _ in range(budget):
        open_nodes = [i for i, c in enumerate(children) if c < topk]
        p = open_nodes[int(torch.randint(len(open_nodes), (1,), generator=gen))]
        parents.append(p)
        children[p] += 1
        children.append(0)
    return parents


def tree_allow(parents: list[int]) -> torch.Tensor:
    q = len(parents)
    m = torch.zeros(q, q, dtype=torch.bool)
    for i in range(q):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parents[j]
    return m


def flat_mask(prefix_lens: list[int], trees: list[torch.Tensor]) -> torch.Tensor:
    """q x (prefix + q) per request, concatenated over the batch."""
    parts = []
    for p, t in zip(prefix_lens, trees, strict=False):
        q = t.shape[0]
        parts.append(torch.cat([torch.ones(q, p, dtype=torch.bool), t], dim=1).reshape(-1))
    return torch.cat(parts)


def reference(qx, kx, vx, kp_list, vp_list, trees, scale):
    """Dense fp32 attention over [prefix; tree] under the tree mask."""
    outs, off = [], 0
    g = NUM_HEADS // NUM_KV_HEADS
    for kp, vp, t in zip(kp_list, vp_list, trees, strict=False):
        q = t.shape[0]
        Q = qx[off : off + q].float()
        K = torch.cat([kp, kx[off : off + q]]).float().repeat_interleave(g, dim=1)
        V = torch.cat([vp, vx[off : off + q]]).float().repeat_interleave(g, dim=1)
        allow = torch.cat([torch.ones(q, kp.shape[0], dtype=torch.bool, device=t.device), t], 1)
        s = torch.einsum("qhd,khd->hqk", Q, K) * scale
        s = s.masked_fill(~allow[None], float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), V))
        off += q
    return torch.cat(outs)


@dataclass
class ForwardBatchLike:
    """The ForwardBatch fields TritonAttnBackend reads for TARGET_VERIFY."""

    batch_size: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_sum: Any
    forward_mode: Any
    spec_info: Any
    kv_loc_plan: Any = None
    out_cache_loc: Any = None
    encoder_lens: Any = None
    mha_one_shot: bool = False
    attn_attend_prefix_cache: bool = True
    extend_seq_lens_cpu: Any = None
    positions: Any = None
    seq_lens_cpu: Any = None
    extra: dict = field(default_factory=dict)


class Env:
    """Backend + pools for one (verify width) configuration.

    backend="triton": `tb` is sglang's triton_backend module; "flashinfer": `tb` is
    its flashinfer_backend module (H.import_flashinfer_backend())."""

    def __init__(self, H, tb, *, verify_q, topk, context_len, max_bs, set_verify_arg=True,
                 backend="triton"):
        sa, _ = H.install_config(block=BLOCK, verify_q=verify_q, topk=topk, context_len=context_len,
                                 model_path=H.MODEL_DIR, set_verify_arg=set_verify_arg,
                                 attention_backend=backend)
        from sglang.srt.layers.radix_attention import RadixAttention

        self.mr = H.ModelRunnerLike(max_bs=max_bs, context_len=context_len, num_heads=NUM_HEADS,
                                    num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
                                    kv_size=max_bs * context_len + 16, dtype=torch.bfloat16,
                                    server_args=sa, attention_backend=backend)
        self.kind = backend
        # FlashInfer's paged verify reads the verify tokens' K/V from the KV pool
        # (kv_indices = req_to_token[r, : prefix + q]); Triton takes them as k/v.
        self.paged_verify_kv = backend == "flashinfer"
        if backend == "flashinfer":
            self.mr.token_to_kv_pool_allocator = H.AllocatorView(self.mr.token_to_kv_pool)
            self.backend = tb.FlashInferAttnBackend(self.mr)
        else:
            self.backend = tb.TritonAttnBackend(self.mr)
        self.layer = RadixAttention(NUM_HEADS, HEAD_DIM, HEAD_DIM**-0.5, NUM_KV_HEADS, layer_id=0)
        self.max_bs = max_bs
        self.context_len = context_len


def make_batch(env: Env, prefix_lens, budget, topk, seed, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    q = budget + 1
    bs = len(prefix_lens)
    pool = env.mr.token_to_kv_pool
    kbuf, vbuf = pool.get_key_buffer(0), pool.get_value_buffer(0)
    r2t = env.mr.req_to_token_pool.req_to_token
    rpi = torch.randperm(env.max_bs, generator=gen)[:bs]
    free = torch.randperm(kbuf.shape[0] - 1, generator=gen) + 1
    kp_list, vp_list, off = [], [], 0
    for i, p in enumerate(prefix_lens):
        locs = free[off : off + p].to(device)
        off += p
        r2t[int(rpi[i]), :p] = locs.to(r2t.dtype)
        kp = torch.randn(p, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device, torch.bfloat16)
        vp = torch.randn(p, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device, torch.bfloat16)
        kbuf[locs] = kp
        vbuf[locs] = vp
        kp_list.append(kp)
        vp_list.append(vp)
    trees = [tree_allow(random_tree(budget, topk, gen)) for _ in range(bs)]
    n = bs * q
    qx = torch.randn(n, NUM_HEADS, HEAD_DIM, generator=gen).to(device, torch.bfloat16)
    kx = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device, torch.bfloat16)
    vx = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device, torch.bfloat16)
    if env.paged_verify_kv:
        # The verify tokens' slots: req_to_token[r, p : p + q], taken from the end
        # of the free list (the prefix slots above are unchanged), K/V written
        # there as the model's save_kv_cache would (not under test here).
        vlocs = free[free.numel() - n :].to(device)
        for i, p in enumerate(prefix_lens):
            r2t[int(rpi[i]), p : p + q] = vlocs[i * q : (i + 1) * q].to(r2t.dtype)
        kbuf[vlocs] = kx
        vbuf[vlocs] = vx
    mask = flat_mask(prefix_lens, trees).to(device)
    ref = reference(qx, kx, vx, kp_list, vp_list, [t.to(device) for t in trees], HEAD_DIM**-0.5)
    return dict(q=q, bs=bs, rpi=rpi.to(device), seq_lens=torch.tensor(prefix_lens, device=device),
                qx=qx, kx=kx, vx=vx, mask=mask, ref=ref)


def verify_input(q, mask):
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    return DFlashVerifyInput(draft_token=None, positions=None, draft_token_num=q, custom_mask=mask)


def run_eager(env: Env, b) -> torch.Tensor:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    fb = ForwardBatchLike(batch_size=b["bs"], req_pool_indices=b["rpi"], seq_lens=b["seq_lens"],
                          seq_lens_sum=int(b["seq_lens"].sum()), forward_mode=ForwardMode.TARGET_VERIFY,
                          spec_info=verify_input(b["q"], b["mask"]))
    if env.kind == "flashinfer":  # DFLASH batches carry it; the Triton runs predate this
        fb.seq_lens_cpu = (b["seq_lens"] + b["q"]).cpu()
    n = b["bs"] * b["q"]
    qx, kx, vx = b["qx"].reshape(n, -1), b["kx"], b["vx"]
    if GUARD:
        # Mutant runs: a backend indexing by the block size reads/writes up to
        # bs x BLOCK rows and BLOCK x (prefix + BLOCK) mask cells per request; give it
        # zeroed guard rows / cells in the harness's own buffers (never the
        # allocator's neighbours), and compare only the n real rows.
        rows = n + b["bs"] * BLOCK + 64
        qx, kx, vx = (torch.cat([t, t.new_zeros((rows - n, *t.shape[1:]))]) for t in (qx, kx, vx))
        m = b["mask"]
        cells = m.numel() + BLOCK * (int(b["seq_lens"].sum()) + BLOCK * b["bs"]) + 1024
        mbuf = torch.zeros(cells, dtype=m.dtype, device=m.device)
        mbuf[: m.numel()] = m
        fb.spec_info = verify_input(b["q"], mbuf[: m.numel()])
    env.backend.init_forward_metadata(fb)
    o = env.backend.forward_extend(qx, kx, vx, env.layer, fb, save_kv_cache=False)
    return o[:n].view(-1, NUM_HEADS, HEAD_DIM)


class Graph:
    """Capture one TARGET_VERIFY graph the way the decode cuda-graph runner does:
    capture width = backend.target_verify_num_tokens_per_req, capture-time
    spec_info.custom_mask from sglang's own resolve_dflash_verify_mask_policy."""

    def __init__(self, env: Env, bs: int, device="cuda"):
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.speculative.dflash_utils import resolve_dflash_verify_mask_policy

        be = env.backend
        self.env, self.bs = env, bs
        self.cap_w = capture_width(be)
        max_tokens = env.max_bs * self.cap_w
        be.init_cuda_graph_state(env.max_bs, max_tokens)
        _, build_mask = resolve_dflash_verify_mask_policy(be)
        # The runner's buffers.custom_mask: ones((max_bs*fill + max_tokens) * width).
        cap_mask = torch.ones((env.max_bs * 1 + max_tokens) * self.cap_w, dtype=torch.bool,
                              device=device) if build_mask else None
        self.fi = env.kind == "flashinfer"
        # Static q/k/v rows. Triton: room for any width in the test. FlashInfer
        # checks q rows == qo_indptr[-1] at capture: bs x capture width, as the runner.
        self.rows = bs * self.cap_w if self.fi else bs * 64
        self.rpi = torch.zeros(env.max_bs, dtype=torch.int64, device=device)
        self.seq = torch.ones(env.max_bs, dtype=torch.int64, device=device)
        # DFLASH batches carry seq_lens_cpu = prefix + width (FlashInfer's sync-free
        # verify plan reads it); fill value 1 at capture.
        self.seq_cpu = torch.full((env.max_bs,), 1 + self.cap_w, dtype=torch.int64)
        self.qx = torch.zeros(self.rows, NUM_HEADS * HEAD_DIM, dtype=torch.bfloat16, device=device)
        self.kx = torch.zeros(self.rows, NUM_KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)
        self.vx = torch.zeros_like(self.kx)
        fb = ForwardBatchLike(batch_size=bs, req_pool_indices=self.rpi[:bs], seq_lens=self.seq[:bs],
                              seq_lens_sum=bs if env.kind == "flashinfer" else None,
                              forward_mode=ForwardMode.TARGET_VERIFY,
                              spec_info=verify_input(self.cap_w, cap_mask))
        if self.fi:  # FlashInfer sizes its capture from positions.numel()
            fb.positions = torch.zeros(bs * self.cap_w, dtype=torch.int64, device=device)
            fb.seq_lens_cpu = self.seq_cpu[:bs]
        be.init_forward_metadata_out_graph(fb, in_capture=True)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            be.forward_extend(self.qx, self.kx, self.vx, env.layer, fb, save_kv_cache=False)
        torch.cuda.current_stream().wait_stream(s)
        self.g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.g):
            self.out = be.forward_extend(self.qx, self.kx, self.vx, env.layer, fb, save_kv_cache=False)
        self.captured_with_mask = captured_with_mask(be, bs)

    def replay(self, b) -> torch.Tensor:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        bs, n = b["bs"], b["bs"] * b["q"]
        self.rpi[:bs] = b["rpi"]
        self.seq[:bs] = b["seq_lens"]
        self.seq_cpu[:bs] = b["seq_lens"].cpu() + b["q"]
        fb = ForwardBatchLike(batch_size=bs, req_pool_indices=self.rpi[:bs], seq_lens=self.seq[:bs],
                              seq_lens_sum=int(b["seq_lens"].sum()), forward_mode=ForwardMode.TARGET_VERIFY,
                              spec_info=verify_input(b["q"], b["mask"]),
                              seq_lens_cpu=self.seq_cpu[:bs] if self.fi else None)
        self.env.backend.init_forward_metadata_out_graph(fb, in_capture=False)
        if n > self.rows or (self.fi and n != self.rows):
            raise RuntimeError(
                f"harness: batch of {n} verify rows (width {b['q']}) does not fit the graph captured "
                f"for {self.rows} rows (width {self.cap_w}); sglang's graph runner would not replay it")
        self.out.fill_(float("nan"))
        self.qx[:n] = b["qx"].reshape(n, -1)
        self.kx[:n] = b["kx"]
        self.vx[:n] = b["vx"]
        self.g.replay()
        return self.out[:n].view(n, NUM_HEADS, HEAD_DIM)


def capture_width(be) -> int:
    """The width the decode cuda-graph runner captures TARGET_VERIFY at: the
    Triton backend exposes it; for other backends it is the runner's own rule
    (patched 0014: --speculative-verify-num-tokens when set, else the block)."""
    w = getattr(be, "target_verify_num_tokens_per_req", None)
    if w is not None:
        return int(w)
    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    try:
        v = spec.speculative_verify_num_tokens  # absent on unpatched sglang
    except Exception:
        v = None
    return int(v if v is not None else spec.speculative_num_draft_tokens)


def captured_with_mask(be, bs) -> bool:
    wrappers = getattr(be, "prefill_cuda_graph_metadata", {}).get(bs)
    if wrappers:  # FlashInfer: MaskMode.CUSTOM iff the wrapper owns a mask buffer
        return wrappers[0]._custom_mask_buf is not None
    return be.forward_metadata.custom_mask is not None


def max_err(out, ref) -> float:
    d = (out.float() - ref).abs()
    return float("inf") if torch.isnan(d).any() else float(d.max())
