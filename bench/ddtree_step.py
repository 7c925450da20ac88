"""DDTree's decode step against target-only and the DFLASH chain, at Llama-3-8B shape, on the H200.

Runs on the GPU machine (after tests/ddtree/gpu_session.sh install1..install3), from the repo
root. Reuses tests/ddtree/serve_matrix.py (the patched sglang variant, the plugin + test-oracle
wheels from .carry/ddtree-srv, the Server driver). Starts, all at once on the one GPU, real
`python -m sglang.launch_server` (0.5.23) servers on a Llama-3-8B-shaped target with dummy
weights (`--load-format dummy`, 32 layers, hidden 4096, vocab 128256, bf16, triton attention,
CUDA graphs): target-only, the DFLASH chain (block 8) and DDTree at each budget (server top-k 8,
top-k 4 by request), with a dummy DFlashDraftModel drafter. Then measures ONE server at a time
(the others idle), greedy, 256 new tokens, 1 stream and 4 streams, with the TEST-ONLY oracle
drafter (tests/ddtree/oracle) in two modes: `branch` (the recorded token at rank 1 on every third
depth: the tree must branch, the chain misses there) and `top1` (the recorded token at rank 0 at
every depth: the chain accepts its whole block; the tree still follows the oracle's fixed
log-probs, 0.55 / 0.35 / ..., and spends part of its budget on siblings). DDTree runs each tree
path per request (`device`, the default: the top-k head inside the drafter's CUDA graph, the tree
in one Triton launch, the walk replayed as a CUDA graph; `graphed`, the previous default: the head
after the draft forward, the tree's tensor ops replayed as a CUDA graph; `host`: the numpy
reference, top-k 4 only), with the worker's per-stage CUDA-event profile on
(SGLANG_DDTREE_PROFILE_DIR; sglang_ddtree/profile.py).

Decode tok/s is read from the stream: tokens after the first chunk over the time after it (the
prefill is left out). Writes $OUT/ddtree-step.json (every request, every profile) and
$OUT/logs.tgz; bench/render_ddtree_step.py renders docs/ddtree-step.md from the JSON.

    python3 bench/ddtree_step.py [--budgets 8,16,31] [--deadline 540]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "ddtree"))
import serve_matrix as sm  # noqa: E402

OUT = sm.OUT
PROF = Path("/tmp/ddtree-prof")
V = 128256
BLOCK = 8
NEW = 256
TARGET = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=V, hidden_size=4096,
              intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
              head_dim=128, hidden_act="silu", max_position_embeddings=8192, rms_norm_eps=1e-5,
              rope_theta=500000.0, tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=128000,
              eos_token_id=128001)
DRAFT = dict(TARGET, architectures=["DFlashDraftModel"], num_hidden_layers=2,
             dflash_config=dict(block_size=BLOCK, target_layer_ids=[1, 8, 15, 22, 29], mask_token_id=V - 1))
PROMPT_LENS = (120, 200, 320, 520)  # one stream uses the first
TOPKS = (4, 8)
ORACLES = ("branch", "top1")


def prompts() -> list[list[int]]:
    rng = random.Random(20261203)
    return [[rng.randrange(1000, V - 1000) for _ in range(n)] for n in PROMPT_LENS]


class StepServer(sm.Server):
    """serve_matrix's server at 8B shape: kind target | chain | ddtree."""

    def __init__(self, name: str, kind: str, budget: int | None, port: int, mem: float):
        super().__init__(name, "patched", budget if kind == "ddtree" else None, True, port)
        self.kind, self.mem = kind, mem

    def cmd(self) -> list[str]:
        c = super().cmd()
        c[c.index("--mem-fraction-static") + 1] = str(self.mem)
        c[c.index("--max-total-tokens") + 1] = "12288"
        if self.kind == "chain":
            c += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", sm.MODEL["draft"],
                  *sm.MODEL["draft_load"], "--speculative-num-draft-tokens", str(BLOCK),
                  *sm.overlap_flags(self.overlap)]
        return c

    def start(self, plug: Path) -> None:
        os.environ["SGLANG_DDTREE_PROFILE_DIR"] = str(PROF / self.name)
        super().start(plug)

    def stream(self, ids: list[int], params: dict, timeout: float = 120) -> dict:
        body = {"input_ids": ids, "sampling_params": params, "stream": True}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/generate", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", "Connection": "close"})
        t0 = time.perf_counter()
        first = last = None
        n_first = n_last = 0
        meta: dict = {}
        out_ids: list[int] = []
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                now = time.perf_counter()
                meta = chunk.get("meta_info", meta)
                n = int(meta.get("completion_tokens", 0))
                got = chunk.get("output_ids") or []
                out_ids = got if len(got) >= n else out_ids + got  # cumulative or incremental
                if first is None:
                    first, n_first = now, n
                last, n_last = now, n
        keep = {k: meta.get(k) for k in ("spec_verify_ct", "spec_accept_length", "completion_tokens", "finish_reason")}
        dt = (last - first) if first is not None and last is not None else 0.0
        return {"prompt_len": len(ids), "output_ids": out_ids, "meta": keep, "wall_s": time.perf_counter() - t0,
                "ttft_s": (first - t0) if first else None, "decode_tokens": n_last - n_first, "decode_s": dt,
                "decode_tok_s": (n_last - n_first) / dt if dt > 0 else None}


def measure(s: StepServer, ps: list[list[int]], params: dict, streams: int, repeats: int) -> list[dict]:
    """``repeats`` rounds of ``streams`` concurrent requests; every request kept."""
    rows = []
    for rep in range(repeats):
        batch = ps[:streams]
        with cf.ThreadPoolExecutor(streams) as ex:
            res = list(ex.map(lambda ids: _safe(s, ids, params), batch))
        for r in res:
            r["repeat"] = rep
        rows += res
    return rows


def _safe(s: StepServer, ids: list[int], params: dict) -> dict:
    try:
        return s.stream(ids, params)
    except Exception as e:  # recorded, reported as a failed cell
        return {"prompt_len": len(ids), "error": repr(e)[:400]}


def cells_for(s: StepServer) -> list[dict]:
    """The measurement cells of one server: (label, custom_params) per oracle, top-k, path, streams."""
    out = []
    for oracle in ORACLES:
        for streams in (1, 4):
            if s.kind == "target":
                if oracle == "branch":  # target-only has no drafter: one cell per stream count
                    out.append({"oracle": None, "streams": streams, "cp": {}})
                continue
            if s.kind == "chain":
                out.append({"oracle": oracle, "streams": streams, "cp": {"ddtree_oracle": oracle}})
                continue
            for k in TOPKS:
                for path in ("device", "graphed", "host") if k == 4 else ("device", "graphed"):
                    tag = f"{oracle}-k{k}-{path}-s{streams}"
                    out.append({"oracle": oracle, "streams": streams, "topk": k, "path": path,
                                "cp": {"ddtree_oracle": oracle, "ddtree_test_topk": k, "ddtree_test_path": path,
                                       "ddtree_profile_tag": tag}})
    return out


def run_server(s: StepServer, ps: list[list[int]], baseline: dict[str, list[int]], repeats: int) -> list[dict]:
    cells = []
    warm = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
    measure(s, ps, warm, 4, 1)  # graphs, allocator and JIT paths of this server warm
    for c in cells_for(s):
        params = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
        if c["cp"]:
            params["custom_params"] = c["cp"]
        rows = measure(s, ps, params, c["streams"], repeats if c["streams"] == 1 else 1)
        ok = [r for r in rows if r.get("decode_tok_s")]
        same = sum(1 for r in ok if r["output_ids"][:NEW] == baseline.get(",".join(map(str, ps[PROMPT_LENS.index(
            r["prompt_len"])])), [])[:NEW])
        per_round = {}
        for r in ok:
            per_round.setdefault(r["repeat"], []).append(r["decode_tok_s"])
        agg = [sum(v) for v in per_round.values()]  # total tok/s of a round (sum over its streams)
        acc = [r["meta"].get("spec_accept_length") for r in ok if r["meta"].get("spec_accept_length")]
        cells.append({**{k: v for k, v in c.items() if k != "cp"}, "custom_params": c["cp"],
                      "tok_s": statistics.median(agg) if agg else None,
                      "tok_s_rounds": agg, "accept_length": statistics.mean(acc) if acc else None,
                      "identical_to_target": f"{same}/{len(rows)}",
                      "errors": [r["error"] for r in rows if "error" in r],
                      "requests": rows})
        last = cells[-1]
        print(f"{s.name:18s} {c.get('oracle') or '-':6s} s{c['streams']} k{c.get('topk', '-')} "
              f"{c.get('path', '-'):6s} tok/s {last['tok_s'] or 0:8.1f} accept {last['accept_length'] or 0:.2f} "
              f"same {same}/{len(rows)}", flush=True)
    # a request under another tag makes the worker write its profile (sglang_ddtree/profile.py)
    if s.kind == "ddtree":
        measure(s, ps, {**warm, "custom_params": {"ddtree_profile_tag": "flush"}}, 1, 1)
        time.sleep(0.5)
    return cells


def read_profiles(s: StepServer) -> dict:
    out = {}
    for f in sorted((PROF / s.name).glob("ddtree-profile-*.json")):
        out[f.name] = json.loads(f.read_text())
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", default="8,16,31")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds; stop starting measurements after")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mem", type=float, default=0.88)
    a = ap.parse_args()
    budgets = [int(b) for b in a.budgets.split(",") if b]
    t0 = time.time()
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    shutil.rmtree(PROF, ignore_errors=True)
    for d, cfg in (("/tmp/llama8b", TARGET), ("/tmp/llama8b-draft", DRAFT)):
        os.makedirs(d, exist_ok=True)
        Path(d, "config.json").write_text(json.dumps(cfg))
    sm.MODEL.update(path="/tmp/llama8b", draft="/tmp/llama8b-draft", load=["--load-format", "dummy"], real=False,
                    draft_load=["--speculative-draft-load-format", "dummy"])
    sm.build_variant("patched")
    plug = sm.install_plugins()
    port = iter(range(31300, 31400))
    servers = [StepServer("target", "target", None, next(port), a.mem),
               StepServer("chain-b8", "chain", None, next(port), a.mem)]
    servers += [StepServer(f"ddtree-b{b}", "ddtree", b, next(port), a.mem) for b in budgets]
    deadline = t0 + a.deadline
    start_all(servers, plug, deadline, t0)
    ps = prompts()
    baseline: dict[str, list[int]] = {}
    base = servers[0]
    results = {}
    if base.up_s:
        rec = measure(base, ps, {"max_new_tokens": NEW + BLOCK + 1, "temperature": 0, "ignore_eos": True}, 4, 1)
        baseline = {",".join(map(str, p)): r.get("output_ids") or [] for p, r in zip(ps, rec, strict=True)}
        (OUT / "oracle.json").write_text(json.dumps(baseline))
        for s in servers:
            if not s.up_s or time.time() > deadline - 20:
                continue
            try:
                results[s.name] = run_server(s, ps, baseline, a.repeats)
            except Exception as e:
                s.error = f"measuring: {e!r}"[:500]
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": sm._machine(),
           "command": " ".join(sys.argv), "target_config": TARGET, "draft_config": DRAFT, "block": BLOCK,
           "new_tokens": NEW, "prompt_lens": PROMPT_LENS, "topks": TOPKS, "oracles": ORACLES,
           "wall_s": time.time() - t0}
    return finish("ddtree-step.json", doc, servers, results, t0)


def start_all(servers: list[StepServer], plug: Path, deadline: float, t0: float) -> None:
    """Start every server (2 s apart), then wait until each is up or failed, or the deadline passes."""
    for s in servers:
        s.start(plug)
        time.sleep(2.0)
    while time.time() < deadline and not all(s.up_s or s.error for s in servers):
        for s in servers:
            s.poll_up()
        time.sleep(2)
    print(f"up at {time.time() - t0:.0f}s: {[(s.name, s.up_s and round(s.up_s), bool(s.error)) for s in servers]}",
          flush=True)


def finish(name: str, doc: dict, servers: list[StepServer], results: dict[str, list[dict]], t0: float) -> int:
    """Every server's record into ``doc``, written to $OUT/name before the servers stop (they drain slowly); the
    logs packed; what failed printed."""
    doc["servers"] = [{"name": s.name, "kind": s.kind, "budget": s.budget, "overlap": s.overlap, "env": s.env,
                       "up_s": s.up_s,
                       "error": s.error,
                       "cmd": s.cmd(), "cells": results.get(s.name, []), "profiles": read_profiles(s)}
                      for s in servers]
    (OUT / name).write_text(json.dumps(doc))
    sm.stop_all(servers)
    subprocess.run(["tar", "-C", str(OUT), "-czf", str(OUT / "logs.tgz"), "logs"], check=False)
    shutil.rmtree(OUT / "logs", ignore_errors=True)
    print(f"done in {time.time() - t0:.0f}s; failed: {[s.name for s in servers if s.error]}", flush=True)
    for s in servers:
        if s.error:
            print(s.name, s.error[-800:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
