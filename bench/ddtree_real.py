"""DDTree with the trained drafter on SmolLM2-135M inflated to Llama-3-8B's cost, on the H200 (issue 39).

The model is SmolLM2-135M-Instruct's function at Llama-3-8B's compute shape: ``python -m testbed.models
inflate`` pads it to hidden 4096, 32 layers, 32 / 8 heads, MLP 14336 (zeros and identity layers, the
vocabulary kept), so every server pays an 8B model's matmuls, KV cache and attention while its text is
SmolLM2's. The project's DFlash drafter (trained on SmolLM2-written text, ``python -m testbed.models
train-drafter``) is inflated the same way. It is not Llama-3-8B and its text is a 135M model's.

Runs on the GPU machine after tests/ddtree/gpu_session.sh install1..install3 and ``drafter``, with the
SmolLM2 target converted to /tmp/smollm2 and the drafter unpacked to /tmp/smollm2-dflash
(``gpu_session.sh real`` does both). Starts, all at once on the one GPU, real ``python -m
sglang.launch_server`` (0.5.23, the whole patch series) servers: the original 135M target (for the
function check), the inflated target alone, the DFLASH chain (block 8) and DDTree at each budget (server
top-k 8, top-k 4 by request), CUDA graphs on. Then:

1. function: the 135M and the inflated target's greedy answers to the gate's suite, with their top-2
   log-probs at every position (a divergence at a near-tie is rounding, elsewhere a broken inflation);
2. speed, ONE server at a time (the others idle): the gate's 8 suite prompts (chat template), up to
   ``--new`` tokens, T=0 and T=0.8, one stream (the prompts in turn) and 4 streams (two rounds of 4);
   DDTree at top-k 4 and 8; the worker's per-stage CUDA-event profile per cell;
3. churn (the servers under sglang's overlap scheduler and their non-overlap twins, and the target alone):
   ``CHURN_REQUESTS`` greedy requests of mixed lengths, ``CHURN_STREAMS`` at a time, so requests finish while
   others run and new ones take their place (under the overlap scheduler a finished request's row is freed
   while the step after it still runs); every answer against the target alone's, up to its length.

``--overlap-budgets`` adds DDTree servers under the overlap scheduler (``SGLANG_DDTREE_OVERLAP=1``, the
plugin's opt-in), ``--overlap-chain`` the DFLASH chain under it (sglang's own default for DFLASH), each
measured like its non-overlap twin. ``--overlap-sync-budgets`` adds, beside those, overlap servers that copy the
device lengths to the host every step (``SGLANG_DDTREE_SYNC_LENS=1``, the worker before sglang_ddtree/lens.py's
reserved bound), so the cut is measured side by side in one run.

Decode tok/s: completion tokens after each request's first chunk over the time after it, summed over a
cell's requests (one stream) or rounds (4 streams: tokens after each stream's first chunk over the span
from the first stream's first chunk to the last stream's last). Writes $OUT/ddtree-real.json and
$OUT/logs.tgz.

    python3 bench/ddtree_real.py [--budgets 16,8,31] [--overlap-budgets 16] [--overlap-sync-budgets 16]
                                 [--overlap-chain] [--no-small]
                                 [--quick] [--new 256] [--deadline 520]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "ddtree"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
import ddtree_step as ds  # noqa: E402
import serve_matrix as sm  # noqa: E402

OUT = sm.OUT
SMALL = Path("/tmp/smollm2")
SMALL_DRAFT = Path("/tmp/smollm2-dflash")
BIG = Path("/tmp/smol8b")
BIG_DRAFT = Path("/tmp/smol8b-dflash")
SUITE = ROOT / "src" / "sglfleet" / "validation" / "prompts" / "suite-v1.yaml"
CHURN_REQUESTS = 32
CHURN_STREAMS = 6
CHURN_SEED = 20261205
SYNC_ENV = "SGLANG_DDTREE_SYNC_LENS"  # lens.SYNC_ENV of sglang_ddtree (a wheel here; a test holds them equal)


def inflate() -> dict[str, Any]:
    """The inflated target and drafter, made here from the 135M checkpoint (once per warm machine)."""
    t = time.time()
    if not (BIG / "config.json").is_file() or not (BIG_DRAFT / "config.json").is_file():
        for d in (BIG, BIG_DRAFT):
            shutil.rmtree(d, ignore_errors=True)
        env = dict(os.environ, PYTHONPATH=":".join([os.environ.get("PYTHONPATH", ""), str(ROOT), str(ROOT / "src")]))
        r = subprocess.run([sys.executable, "-m", "testbed.models", "inflate", "--src", str(SMALL), "--out", str(BIG),
                            "--drafter-src", str(SMALL_DRAFT), "--drafter-out", str(BIG_DRAFT)],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"inflate failed (rc {r.returncode}): {r.stdout[-1500:]}{r.stderr[-1500:]}")
    from testbed.models.drafter import check_dirs

    check_dirs(BIG, BIG_DRAFT, block_size=ds.BLOCK)
    size = sum(f.stat().st_size for f in BIG.glob("*.safetensors"))
    return {"seconds": round(time.time() - t, 1), "target_bytes": size,
            "target_config": json.loads((BIG / "config.json").read_text()),
            "drafter_config": json.loads((BIG_DRAFT / "config.json").read_text())}


def suite_prompts() -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    from sglfleet.validation.suite import load_suite

    tok = AutoTokenizer.from_pretrained(str(SMALL))
    out = []
    for p in load_suite(SUITE).prompts:
        ids = tok.apply_chat_template(p.messages(), add_generation_prompt=True)
        if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        out.append({"id": p.id, "ids": [int(t) for t in ids]})
    return out


class RealServer(ds.StepServer):
    """ddtree_step's server with real weights: the inflated target (or the 135M one) and the trained drafter."""

    def __init__(self, name: str, kind: str, budget: int | None, port: int, mem: float, model: Path = BIG,
                 overlap: bool = False):
        super().__init__(name, kind, budget, port, mem)
        self.model = model
        self.overlap = overlap

    def cmd(self) -> list[str]:
        c = super().cmd()
        c[c.index("--model-path") + 1] = str(self.model)
        return c


def greedy_with_top2(s: sm.Server, ps: list[dict[str, Any]], new: int) -> list[dict[str, Any]]:
    def one(p: dict[str, Any]) -> dict[str, Any]:
        try:
            r = s.post("/generate", {"input_ids": p["ids"], "return_logprob": True, "top_logprobs_num": 2,
                                     "sampling_params": {"max_new_tokens": new, "temperature": 0}}, timeout=300)
            meta = r.get("meta_info", {})
            top2 = [[(lp, tid) for lp, tid, *_ in row] for row in meta.get("output_top_logprobs", [])]
            return {"id": p["id"], "output_ids": r.get("output_ids"), "top2": top2}
        except Exception as e:  # recorded, compared as a failure
            return {"id": p["id"], "error": repr(e)[:400]}

    with cf.ThreadPoolExecutor(len(ps)) as ex:
        return list(ex.map(one, ps))


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(ref: list[dict[str, Any]], got: dict[str, list[int]], tie: float = 0.05) -> list[dict[str, Any]]:
    """Per prompt: identical, or the first divergence and the reference's top-2 log-prob gap there."""
    rows = []
    for r in ref:
        if "error" in r or r["id"] not in got:
            rows.append({"id": r["id"], "error": r.get("error", "no answer")})
            continue
        one = compare_prefix(r, got[r["id"]], len(r["output_ids"]))  # the whole reference answer
        row: dict[str, Any] = {"id": r["id"], "tokens": len(r["output_ids"]), "identical": one["identical"]}
        if "diverge_at" in one:
            row["diverge_at"] = one["diverge_at"]
            if one["top2_gap"] is not None:
                row["top2_gap"], row["near_tie"] = one["top2_gap"], one["top2_gap"] <= tie
        rows.append(row)
    return rows


def churn_plan(ps: list[dict[str, Any]], new: int, n: int = CHURN_REQUESTS, seed: int = CHURN_SEED
               ) -> list[dict[str, Any]]:
    """``n`` greedy requests over the prompts in turn, each with its own length in [8, new] (seeded: every server
    gets the same list)."""
    import random

    rng = random.Random(seed)
    return [{"id": ps[i % len(ps)]["id"], "ids": ps[i % len(ps)]["ids"], "max_new": rng.randint(min(8, new), new)}
            for i in range(n)]


def compare_prefix(ref: dict[str, Any], got: list[int], max_new: int) -> dict[str, Any]:
    """One answer of length ``max_new`` at most against the target alone's longer greedy answer to the same prompt:
    identical when it is the reference's prefix (the reference's whole answer when that ended sooner); else the
    first divergence and the reference's top-2 log-prob gap there (None: not recorded)."""
    want = ref["output_ids"][:max_new]
    i = first_divergence(want, got)
    row: dict[str, Any] = {"id": ref["id"], "max_new": max_new, "tokens": len(got), "identical": i is None}
    if i is not None:
        top = ref.get("top2") or []
        row["diverge_at"] = i
        row["top2_gap"] = top[i][0][0] - top[i][1][0] if i < len(top) and len(top[i]) == 2 else None
    return row


def churn_cell(s: RealServer, plan: list[dict[str, Any]], ref: dict[str, dict[str, Any]],
               streams: int = CHURN_STREAMS) -> dict[str, Any]:
    """The churn requests, ``streams`` at a time (a new one starts as soon as one ends), each compared with the
    target alone's answer."""
    def one(r: dict[str, Any]) -> dict[str, Any]:
        try:
            out = s.post("/generate", {"input_ids": r["ids"],
                                       "sampling_params": {"max_new_tokens": r["max_new"], "temperature": 0}},
                         timeout=300)
        except Exception as e:  # recorded, counted as a failure
            return {"id": r["id"], "max_new": r["max_new"], "error": repr(e)[:400]}
        if r["id"] not in ref:
            return {"id": r["id"], "max_new": r["max_new"], "error": "no reference answer"}
        return compare_prefix(ref[r["id"]], out.get("output_ids") or [], r["max_new"])

    t0 = time.time()
    with cf.ThreadPoolExecutor(streams) as ex:
        rows = list(ex.map(one, plan))
    return {"churn": True, "streams": streams, "requests": len(plan), "wall_s": time.time() - t0,
            "identical": sum(1 for r in rows if r.get("identical")),
            "errors": [r["error"] for r in rows if "error" in r], "rows": rows}


def stream_cell(s: RealServer, ps: list[dict[str, Any]], params: dict[str, Any], streams: int) -> dict[str, Any]:
    rounds = [ps[i:i + streams] for i in range(0, len(ps), streams)] if streams > 1 else [[p] for p in ps]
    reqs: list[dict[str, Any]] = []
    toks = secs = 0.0
    for rnd in rounds:
        with cf.ThreadPoolExecutor(len(rnd)) as ex:
            res = list(ex.map(lambda p: _stream(s, p, params), rnd))
        ok = [r for r in res if "error" not in r and r.get("first") is not None]
        if ok:
            toks += sum(r["decode_tokens"] for r in ok)
            secs += max(r["last"] for r in ok) - min(r["first"] for r in ok)
        reqs += res
    acc = [r["meta"].get("spec_accept_length") for r in reqs if r.get("meta", {}).get("spec_accept_length")]
    return {"streams": streams, "tok_s": toks / secs if secs > 0 else None, "decode_tokens": toks,
            "decode_s": secs, "accept_length": sum(acc) / len(acc) if acc else None,
            "errors": [r["error"] for r in reqs if "error" in r], "requests": reqs}


def _stream(s: RealServer, p: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    try:
        r = s.stream(p["ids"], params, timeout=300)
    except Exception as e:
        return {"id": p["id"], "error": repr(e)[:400]}
    # stream() keeps relative times; the round's span needs absolute ones
    end = time.perf_counter()
    r["last"] = end - (r["wall_s"] - (r["ttft_s"] or 0) - r["decode_s"]) if r["ttft_s"] is not None else None
    r["first"] = r["last"] - r["decode_s"] if r["last"] is not None else None
    r["id"] = p["id"]
    return r


def cells_for(s: RealServer, quick: bool = False) -> list[dict[str, Any]]:
    """A server's measurement cells: T=0 and T=0.8 at 1 and 4 streams (DDTree at top-k 4 and 8), and DDTree's
    reference tree paths at T=0; ``quick``: T=0 at top-k 4 only (1 and 4 streams), no reference paths."""
    out = []
    for temp in (0.0,) if quick else (0.0, 0.8):
        for streams in (1, 4):
            if s.kind != "ddtree":
                out.append({"temperature": temp, "streams": streams, "cp": {}})
                continue
            for k in (4,) if quick else (4, 8):
                tag = f"t{temp}-k{k}-s{streams}"
                out.append({"temperature": temp, "streams": streams, "topk": k,
                            "cp": {"ddtree_test_topk": k, "ddtree_profile_tag": tag}})
    if s.kind == "ddtree" and not quick:
        # the same greedy requests through the worker's reference tree paths (the numpy builder on the host, the
        # previous graphed default): the tree kernel cross-checked on a trained drafter's drafts, answer by answer
        # (the same answers and accept lengths are expected, up to the target's ties)
        for path in ("host", "graphed"):
            out.append({"temperature": 0.0, "streams": 1, "topk": 4, "path": path,
                        "cp": {"ddtree_test_topk": 4, "ddtree_test_path": path,
                               "ddtree_profile_tag": f"t0.0-k4-s1-{path}"}})
    return out


def run_server(s: RealServer, ps: list[dict[str, Any]], ref: dict[str, list[int]], new: int,
               deadline: float, churn: tuple[list[dict[str, Any]], dict[str, dict[str, Any]]] | None = None,
               quick: bool = False) -> list[dict[str, Any]]:
    warm = {"max_new_tokens": 32, "temperature": 0}
    stream_cell(s, ps[:4], warm, 4)  # graphs, allocator and JIT paths of this server warm
    cells = []
    for c in cells_for(s, quick):
        if time.time() > deadline:
            cells.append({**{k: v for k, v in c.items() if k != "cp"}, "skipped": "deadline"})
            continue
        params: dict[str, Any] = {"max_new_tokens": new, "temperature": c["temperature"]}
        if c["cp"]:
            params["custom_params"] = c["cp"]
        cell = stream_cell(s, ps, params, c["streams"])
        if c["temperature"] == 0:
            got = {r["id"]: r["output_ids"] for r in cell["requests"] if "output_ids" in r}
            cmp = compare([{"id": k, "output_ids": v, "top2": []} for k, v in ref.items()], got)
            cell["identical_to_target"] = f"{sum(1 for x in cmp if x.get('identical'))}/{len(cmp)}"
            cell["divergences"] = [x for x in cmp if not x.get("identical")]
        cells.append({**{k: v for k, v in c.items() if k != "cp"}, "custom_params": c["cp"], **cell})
        print(f"{s.name:12s} T{c['temperature']} s{c['streams']} k{c.get('topk', '-')} tok/s {cell['tok_s'] or 0:7.1f} "
              f"accept {cell['accept_length'] or 0:.2f} same {cell.get('identical_to_target', '-')} "
              f"err {len(cell['errors'])}", flush=True)
    if churn is not None and time.time() < deadline:
        c = churn_cell(s, *churn)
        cells.append(c)
        print(f"{s.name:12s} churn: {c['identical']}/{c['requests']} identical, err {len(c['errors'])}", flush=True)
    if s.kind == "ddtree":  # a request under another tag makes the worker write its profile
        stream_cell(s, ps[:1], {**warm, "custom_params": {"ddtree_profile_tag": "flush"}}, 1)
        time.sleep(0.5)
    return cells


def server_plan(budgets: list[int], ov_budgets: list[int], overlap_chain: bool = False,
                chain: bool = True, sync_budgets: Sequence[int] = ()
                ) -> list[tuple[str, str, int | None, bool]]:
    """The measured servers after the target alone, in the order they are measured: (name, kind, budget, overlap).
    The first DDTree budget and the chain, then DDTree under the overlap scheduler (each followed by its twin that
    waits for the host lengths, ``-overlap-sync``, where ``sync_budgets`` names it) and the chain under it, then the
    other budgets; ``chain`` False leaves the chains out, and an empty ``budgets`` leaves out DDTree without the
    overlap scheduler (a call that measures only overlap servers beside the target alone)."""
    plan: list[tuple[str, str, int | None, bool]] = []
    if budgets:
        plan.append((f"ddtree-b{budgets[0]}", "ddtree", budgets[0], False))
    if chain:
        plan.append(("chain-b8", "chain", None, False))
    for b in ov_budgets:
        plan.append((f"ddtree-b{b}-overlap", "ddtree", b, True))
        if b in sync_budgets:
            plan.append((f"ddtree-b{b}-overlap-sync", "ddtree", b, True))
    if overlap_chain:
        plan.append(("chain-b8-overlap", "chain", None, True))
    plan += [(f"ddtree-b{b}", "ddtree", b, False) for b in budgets[1:]]
    return plan


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", default="16,8,31", help="DDTree budgets, measured in this order")
    ap.add_argument("--new", type=int, default=256, help="max new tokens per request")
    ap.add_argument("--deadline", type=float, default=520.0, help="seconds; stop starting measurements after")
    ap.add_argument("--overlap-budgets", default="",
                    help="DDTree budgets also served under the overlap scheduler (SGLANG_DDTREE_OVERLAP=1)")
    ap.add_argument("--overlap-sync-budgets", default="",
                    help="of --overlap-budgets, those also served waiting for the host lengths every step "
                         "(SGLANG_DDTREE_SYNC_LENS=1): the cut measured side by side")
    ap.add_argument("--overlap-chain", action="store_true", help="the DFLASH chain under the overlap scheduler too")
    ap.add_argument("--no-chain", action="store_true",
                    help="leave out the DFLASH chain (without the overlap scheduler)")
    ap.add_argument("--no-small", action="store_true",
                    help="leave out the 135M target and its function check (its memory goes to the others)")
    ap.add_argument("--quick", action="store_true",
                    help="T=0 at top-k 4 only, 1 and 4 streams, no reference tree paths (the churn check stays)")
    ap.add_argument("--mem", type=float, default=0.88)
    a = ap.parse_args()
    try:
        budgets = [int(b) for b in a.budgets.split(",") if b.strip()]
        ov_budgets = [int(b) for b in a.overlap_budgets.split(",") if b.strip()]
        sync_budgets = [int(b) for b in a.overlap_sync_budgets.split(",") if b.strip()]
    except ValueError:
        budgets = ov_budgets = sync_budgets = [0]
    if not (budgets or ov_budgets) or any(b < 1 for b in budgets + ov_budgets) or a.new < 1 \
            or not set(sync_budgets) <= set(ov_budgets):
        print("error: --budgets / --overlap-budgets must list budgets >= 1 (--budgets may be empty when "
              "--overlap-budgets is not), --overlap-sync-budgets only budgets of --overlap-budgets, and --new be "
              ">= 1", file=sys.stderr)
        return 2
    t0 = time.time()
    deadline = t0 + a.deadline
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    shutil.rmtree(ds.PROF, ignore_errors=True)
    made = inflate()
    print(f"inflated in {made['seconds']}s: {made['target_bytes'] / 1e9:.1f} GB", flush=True)
    sm.MODEL.update(path=str(BIG), draft=str(BIG_DRAFT), load=[], real=True, draft_load=[])
    sm.build_variant("patched")
    plug = sm.install_plugins()
    port = iter(range(31500, 31600))
    small = None if a.no_small else RealServer("small", "target", None, next(port), a.mem, model=SMALL)
    big = RealServer("target", "target", None, next(port), a.mem)
    servers = [x for x in (small, big) if x is not None]
    servers += [RealServer(name, kind, b, next(port), a.mem, overlap=ov)
                for name, kind, b, ov in server_plan(budgets, ov_budgets, a.overlap_chain, not a.no_chain,
                                                     sync_budgets)]
    for s in servers:
        if s.name.endswith("-overlap-sync"):
            s.env[SYNC_ENV] = "1"  # the worker before lens.py's reserved bound: the host waits for the lengths
    # the churn cell on the overlap servers, their non-overlap twins and the target alone
    twins = {s.name.removesuffix("-overlap") for s in servers if s.overlap}
    churned = {s.name for s in servers if s.overlap or s.name in twins} | ({"target"} if twins else set())
    ps = suite_prompts()
    ds.start_all(servers, plug, deadline, t0)
    function: dict[str, Any] = {}
    results: dict[str, list[dict[str, Any]]] = {}
    if big.up_s:
        ref = greedy_with_top2(big, ps, a.new)
        function["target"] = ref
        if small is not None and small.up_s:
            function["small"] = greedy_with_top2(small, ps, a.new)
            got = {r["id"]: r["output_ids"] for r in function["small"] if "output_ids" in r}
            function["small_vs_target"] = compare(ref, got)
            print(f"135M vs inflated: {function['small_vs_target']}", flush=True)
        if small is not None and small.proc is not None:  # its memory and CPU are not the measured servers'
            small.proc.terminate()
        refmap = {r["id"]: r["output_ids"] for r in ref if "output_ids" in r}
        churn = (churn_plan(ps, a.new), {r["id"]: r for r in ref if "output_ids" in r})
        for s in servers:
            if s is small or not s.up_s or time.time() > deadline - 15:
                continue
            try:
                results[s.name] = run_server(s, ps, refmap, a.new, deadline,
                                             churn if s.name in churned else None, a.quick)
            except Exception as e:
                s.error = f"measuring: {e!r}"[:500]
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": sm._machine(),
           "command": " ".join(sys.argv), "model": "SmolLM2-135M-Instruct inflated to Llama-3-8B's shape "
           "(testbed.models inflate); drafter: the project's DFlash drafter, inflated the same way",
           "inflate": made, "block": ds.BLOCK, "new_tokens": a.new,
           "churn": {"requests": CHURN_REQUESTS, "streams": CHURN_STREAMS, "seed": CHURN_SEED},
           "prompts": [{"id": p["id"], "len": len(p["ids"])} for p in ps],
           "function": function, "wall_s": time.time() - t0}
    return ds.finish("ddtree-real.json", doc, servers, results, t0)


if __name__ == "__main__":
    sys.exit(main())
