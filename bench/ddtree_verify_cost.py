"""Cost of tree target-verify (budget 16, top-k 4: 17 nodes, tree mask) vs chain
verify (DFlash block 8, causal) in the real sglang Triton backend on a GPU.

Times one target-verify attention call (forward_extend: the Triton extend kernel
over paged prefix + verify tokens) for one layer, bs requests, per prefix length.
Usage: DDTREE_SGLANG_PATH=<patched sglang> python bench/ddtree_verify_cost.py
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ddtree"))


def main() -> None:
    import sglang_harness as H
    import torch
    import tree_verify_case as C
    import triton

    tb = H.import_sglang()
    prefixes = [1024, 8192, 32768]
    rows = []
    for bs in (1, 8):
        for p in prefixes:
            ctx = p + 128
            res = {}
            for name, budget, topk, tree in (("tree_b16_k4", 16, 4, True), ("chain_block8", 7, 1, False)):
                env = C.Env(H, tb, verify_q=budget + 1, topk=topk, context_len=ctx, max_bs=bs,
                            set_verify_arg=tree)
                b = C.make_batch(env, [p] * bs, budget, topk, seed=p + bs)
                from sglang.srt.model_executor.forward_batch_info import ForwardMode

                spec = C.verify_input(b["q"], b["mask"] if tree else None)
                fb = C.ForwardBatchLike(batch_size=bs, req_pool_indices=b["rpi"], seq_lens=b["seq_lens"],
                                        seq_lens_sum=int(b["seq_lens"].sum()),
                                        forward_mode=ForwardMode.TARGET_VERIFY, spec_info=spec)
                env.backend.init_forward_metadata(fb)
                qx = b["qx"].reshape(bs * b["q"], -1)

                def fn(env=env, qx=qx, b=b, fb=fb):
                    env.backend.forward_extend(qx, b["kx"], b["vx"], env.layer, fb, save_kv_cache=False)

                ms = triton.testing.do_bench(fn, warmup=25, rep=200)
                res[name] = ms
                del env
                torch.cuda.empty_cache()
            row = dict(bs=bs, prefix=p, tree_ms=res["tree_b16_k4"], chain_ms=res["chain_block8"],
                       ratio=res["tree_b16_k4"] / res["chain_block8"])
            print(json.dumps(row), flush=True)
            rows.append(row)
    out = os.environ.get("DDTREE_BENCH_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
