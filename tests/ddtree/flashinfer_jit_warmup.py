"""JIT-compile the FlashInfer 0.7.2 modules the DDTree FlashInfer proof uses, and
sanity-check them on the GPU before the sglang tests run.

Modules: `quantization` (segment_packbits: plan() bit-packs the custom mask) and
the FA2 batch-prefill module for bf16 q/kv/o, int32 indices, head dim 128, no
RoPE / sliding window / soft cap (what sglang's verify wrappers plan). Both are
built concurrently (each a ninja run with MAX_JOBS jobs), then one paged prefill
with a custom tree mask is planned and run and compared with fp32 attention.

Env: FLASHINFER_CUDA_ARCH_LIST (9.0 on the H200), FLASHINFER_WORKSPACE_BASE (the
JIT cache), MAX_JOBS. Prints one JSON line; exits non-zero on failure.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def main() -> int:
    import torch

    t0 = time.time()
    import flashinfer
    from flashinfer.jit.quantization import gen_quantization_module
    from flashinfer.prefill import get_batch_prefill_module

    res = {"flashinfer": flashinfer.__version__, "torch": torch.__version__,
           "arch_list": os.environ.get("FLASHINFER_CUDA_ARCH_LIST"), "max_jobs": os.environ.get("MAX_JOBS")}
    errs: list[str] = []

    def build_quant():
        t = time.time()
        try:
            gen_quantization_module().build_and_load()
            res["quantization_s"] = round(time.time() - t, 1)
        except Exception as e:
            errs.append(f"quantization: {type(e).__name__}: {e}")

    th = threading.Thread(target=build_quant)
    th.start()
    t = time.time()
    try:
        get_batch_prefill_module("fa2", torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32,
                                 128, 128, 0, False, False, False)
        res["batch_prefill_s"] = round(time.time() - t, 1)
    except Exception as e:
        errs.append(f"batch_prefill: {type(e).__name__}: {e}")
    th.join()
    res["build_total_s"] = round(time.time() - t0, 1)
    if errs:
        res["errors"] = errs
        print(json.dumps(res), flush=True)
        return 1

    # Sanity: one paged prefill, 2 requests, tree-ish custom mask, vs fp32.
    dev = "cuda"
    g = torch.Generator(device="cpu").manual_seed(0)
    hq, hk, d, q, prefixes = 8, 2, 128, 5, [3, 40]
    kv_lens = [p + q for p in prefixes]
    n_kv = sum(kv_lens)
    kc = torch.randn(n_kv, 1, hk, d, generator=g).to(dev, torch.bfloat16)
    vc = torch.randn(n_kv, 1, hk, d, generator=g).to(dev, torch.bfloat16)
    qx = torch.randn(len(prefixes) * q, hq, d, generator=g).to(dev, torch.bfloat16)
    tree = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
                        dtype=torch.bool)
    masks = [torch.cat([torch.ones(q, p, dtype=torch.bool), tree], 1) for p in prefixes]
    flat = torch.cat([m.reshape(-1) for m in masks]).to(dev)
    qo_indptr = torch.tensor([0, q, 2 * q], dtype=torch.int32, device=dev)
    kv_indptr = torch.tensor([0, kv_lens[0], n_kv], dtype=torch.int32, device=dev)
    kv_indices = torch.arange(n_kv, dtype=torch.int32, device=dev)
    last = torch.ones(2, dtype=torch.int32, device=dev)
    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    w.plan(qo_indptr, kv_indptr, kv_indices, last, hq, hk, d, 1, custom_mask=flat,
           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    out = w.run(qx, (kc, vc))
    torch.cuda.synchronize()
    errs_ = []
    off = 0
    for i, m in enumerate(masks):
        Q = qx[i * q : (i + 1) * q].float()
        K = kc[off : off + kv_lens[i], 0].float().repeat_interleave(hq // hk, 1)
        V = vc[off : off + kv_lens[i], 0].float().repeat_interleave(hq // hk, 1)
        s = torch.einsum("qhd,khd->hqk", Q, K) * d**-0.5
        s = s.masked_fill(~m.to(dev)[None], float("-inf"))
        ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), V)
        errs_.append(float((out[i * q : (i + 1) * q].float() - ref).abs().max()))
        off += kv_lens[i]
    res["sanity_max_err"] = max(errs_)
    res["sanity_ok"] = max(errs_) <= 2e-2
    res["total_s"] = round(time.time() - t0, 1)
    print(json.dumps(res), flush=True)
    return 0 if res["sanity_ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
