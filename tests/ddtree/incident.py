"""The incident end to end on the H200: SmolLM2-135M + a trained DFlash drafter, DDTree on real
sglang 0.5.23 servers, gated by `python -m sglfleet.validation run` (issue #11).

Runs on the GPU machine after tests/ddtree/serve_matrix.py's environment is in place (the site dir
/tmp/site, the converted target /tmp/smollm2, the three sglang variants built from the patch
series) and a drafter trained by `python -m testbed.models train-drafter`:

    python3 tests/ddtree/incident.py --drafter /tmp/smollm2-dflash [--deadline 560]

Starts at once (CUDA graphs, tokenizer on, OpenAI endpoints): the target alone (`base`), DFLASH's
chain with the same drafter (`chain`), DDTree patched at budget 16 / top-k 4 and the sweep cells,
the seeds' bug put back (`mutant`) and the tree-verify patches left out (`unpatched`), both at
budget 16 / top-k 4 (and the unpatched one at budget 7, where budget + 1 is the block). Then, in order:

1. `validation record-baseline` on `base`, then `validation run` (profile
   validation/profiles/sglang-smollm2.yaml, `--speculative --baseline`, `--reanchor-url` the base
   server, fluency judge off on this machine: it runs on the recorded texts afterwards) against
   every other server at once;
2. speed at one stream, every server in turn while the others idle (so the ratios are side by
   side in one run): the same prompts, `ignore_eos`, decode tokens/s from the server's own
   meta_info (completion tokens over the request's wall time), accept length per temperature;
   after the gates, so that a build that crashes its server under sampling is gated first;
3. raw SGLang shapes kept as fixtures: one /generate meta_info, one streamed and one plain
   /v1/chat/completions with `return_spec_tokens_details`, /server_info, /metrics spec lines, and
   one `continue_final_message` completion (what the lossless check's re-anchoring sends).

Writes $OUT/incident.json (commands, per-server start, speed rows, gate exit codes and cases) and
$OUT/gates/<server>/ (the gate's report.json, junit.xml, samples.jsonl).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_matrix as sm

ROOT = sm.ROOT
sys.path.insert(0, str(ROOT))  # testbed.models
sys.path.insert(0, str(ROOT / "src"))  # sglfleet
from sglfleet.pipeline.errors import UsageError  # noqa: E402

OUT = sm.OUT
PROFILE = ROOT / "src" / "sglfleet" / "validation" / "profiles" / "sglang-smollm2.yaml"
SPEED_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain, step by step, how bread dough rises.",
)
SPEED_TOKENS = 192
SWEEP = [(b, k) for b in (7, 15, 31) for k in (2, 4, 8)]


GRID = ROOT / "src" / "sglfleet" / "validation" / "grids" / "sglang-smollm2.yaml"


class GateServer(sm.Server):
    """A server rendered by the sweep's sglang kind (flow.sweep_sglang, the commands CI checks
    with sglang's parser): tokenizer on, OpenAI endpoints, CUDA graphs."""

    def __init__(self, name: str, variant: str | None, budget: int | None, topk: int, port: int, argv: list[str],
                 chain: bool = False):
        super().__init__(name, variant, budget, True, port)
        self.topk, self.chain, self.argv = topk, chain, argv
        self.speed: list[dict] = []
        self.gate: dict = {}

    def cmd(self) -> list[str]:
        return self.argv

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def plan() -> list[GateServer]:
    from sglfleet.flow.sweep import load_sweep_config
    from sglfleet.flow.sweep_sglang import cell_command, server_command

    cfg = load_sweep_config(str(GRID)).sglang.model_copy(
        update={"model_path": sm.MODEL["path"], "draft_model_path": sm.MODEL["draft"], "python": sys.executable})
    port = iter(range(31300, 31400))

    def tree(name: str, variant: str, b: int, k: int) -> GateServer:
        p = next(port)
        return GateServer(name, variant, b, k, p, cell_command(cfg, {"budget": b, "topk": k}, p, name))

    p0, p1 = next(port), next(port)
    s = [GateServer("base", None, None, 0, p0, server_command(cfg, p0, None)),
         GateServer("chain", "patched", None, 0, p1, server_command(cfg, p1, {}), chain=True),
         tree("patched-b16-k4", "patched", 16, 4), tree("mutant-b16-k4", "mutant", 16, 4),
         tree("unpatched-b16-k4", "unpatched", 16, 4),
         # budget + 1 = the block of 8: the unpatched build replays the chain's CUDA graph with the wrong mask
         # there (docs/ddtree-serve.md Run 4); at 16 its verify width has no graph and runs eagerly (correct, slow)
         tree("unpatched-b7-k4", "unpatched", 7, 4)]
    s += [tree(f"patched-b{b}-k{k}", "patched", b, k) for b, k in SWEEP]
    # the patched build with a sampler fault of the worker (sglang_ddtree/worker.py TEST_FAULTS): T=0 exact,
    # a seeded request's draws within a verify step share their random numbers
    faulty = tree("shared-b16-k4", "patched", 16, 4)
    faulty.env = {"SGLANG_DDTREE_TEST_FAULT": "step_shared_random"}
    s.append(faulty)
    return s


def chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def speed(s: GateServer, tok) -> None:
    """Single-stream decode rate and accept length per temperature (this server alone busy)."""
    for temp in (0.0, 0.8):
        for text in SPEED_PROMPTS:
            body = {"input_ids": chat_ids(tok, text),
                    "sampling_params": {"max_new_tokens": SPEED_TOKENS, "temperature": temp, "ignore_eos": True}}
            t = time.time()
            try:
                r = s.post("/generate", body, timeout=120)
            except Exception as e:
                s.speed.append({"temperature": temp, "error": repr(e)[:300]})
                continue
            wall = time.time() - t
            meta = r.get("meta_info", {})
            n = int(meta.get("completion_tokens") or 0)
            s.speed.append({"temperature": temp, "prompt": text[:40], "completion_tokens": n, "wall_s": wall,
                            "tokens_per_s": n / wall if wall > 0 else None,
                            "spec_accept_length": meta.get("spec_accept_length"),
                            "spec_verify_ct": meta.get("spec_verify_ct"), "text": (r.get("text") or "")[:400]})


def fixtures(s: GateServer, tok) -> dict:
    """The raw shapes the gate reads, from this real server (kept as test fixtures)."""
    out: dict = {"server": s.name, "cmd": s.cmd()}
    msg = [{"role": "user", "content": "Name three colours."}]
    try:
        out["generate"] = s.post("/generate", {"input_ids": chat_ids(tok, msg[0]["content"]),
                                               "sampling_params": {"max_new_tokens": 24, "temperature": 0}})
        out["chat"] = s.post("/v1/chat/completions", {"model": "smollm2-135m", "messages": msg, "max_tokens": 24,
                                                      "temperature": 0, "return_spec_tokens_details": True})
        req = urllib.request.Request(s.url + "/v1/chat/completions", json.dumps(
            {"model": "smollm2-135m", "messages": msg, "max_tokens": 24, "temperature": 0, "stream": True,
             "stream_options": {"include_usage": True}, "return_spec_tokens_details": True}).encode(),
            {"Content-Type": "application/json"})
        out["chat_stream_lines"] = [ln.decode().rstrip() for ln in urllib.request.urlopen(req, timeout=60)
                                    if ln.strip()]
        out["server_info"] = json.loads(s.get("/server_info"))
        out["metrics_spec_lines"] = [ln for ln in s.get("/metrics").splitlines() if "spec" in ln]
        # what the lossless check's re-anchoring sends (validation/gate.py Gate._reanchor_fn)
        out["chat_continue"] = s.post("/v1/chat/completions", {
            "model": "smollm2-135m", "messages": [*msg, {"role": "assistant", "content": "Red, green"}],
            "max_tokens": 16, "temperature": 0, "continue_final_message": True, "logprobs": True, "top_logprobs": 5})
    except Exception as e:
        out["error"] = repr(e)[:500]
    return out


def validation_env() -> dict:
    env = dict(os.environ)
    gate_py = Path("/tmp/gate-py") if Path("/tmp/gate-py").is_dir() else ROOT / ".carry" / "gate-py"
    env["PYTHONPATH"] = ":".join([str(ROOT / "src"), str(ROOT), str(gate_py), str(sm.SITE)])
    return env


def run_gate(s: GateServer, baseline: Path | None, timeout: float, reanchor: str | None = None,
             name: str | None = None, profile: Path = PROFILE) -> dict:
    """One `python -m sglfleet.validation run` against `s`; its record (also kept as s.gate when name is None)."""
    out = OUT / "gates" / (name or s.name)
    cmd = [sys.executable, "-m", "sglfleet.validation", "run", "--target", s.url, "--config", str(profile),
           "--out", str(out), "--no-judge"]
    if s.budget is not None or s.chain:
        cmd += ["--speculative"]
    if baseline is not None:
        cmd += ["--baseline", str(baseline)]
    if reanchor:  # the target-only server: near-ties are continued there, and it scores the T>0 answers
        cmd += ["--reanchor-url", reanchor]
    t = time.time()
    rec: dict = {"name": name or s.name, "server": s.name, "profile": str(profile), "cmd": " ".join(cmd)}
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=validation_env(), capture_output=True, text=True,
                           timeout=max(30.0, timeout))
        rec.update(rc=r.returncode, tail=(r.stdout + r.stderr)[-3000:])
    except subprocess.TimeoutExpired as exc:  # no verdict: recorded as such, never as a pass
        out_so_far = exc.stdout or b""  # bytes even with text=True: decode, so the tail shows where it stopped
        if isinstance(out_so_far, bytes):
            out_so_far = out_so_far.decode(errors="replace")
        rec.update(rc=None, timed_out=True, tail=out_so_far[-1500:])
    rec["wall_s"] = time.time() - t
    rep = out / "report.json"
    if rep.is_file():
        doc = json.loads(rep.read_text())
        rec["passed"] = doc.get("passed")
        keys = ("name", "ok", "skipped", "message")
        rec["cases"] = [{k: c.get(k) for k in keys} for c in doc.get("cases", [])]
        for c, full in zip(rec["cases"], doc.get("cases", []), strict=True):
            if c["name"] == "lossless_t0":  # the counts the incident table shows, as numbers
                d = full.get("details") or {}
                c["counts"] = {"identical": d.get("identical"), "answers": len(d.get("per_prompt") or {}),
                               "near_ties": len(d.get("near_ties") or []), "reanchored": d.get("reanchored")}
            if c["name"].startswith("likelihood@"):
                d = full.get("details") or {}
                c["details"] = d if len(json.dumps(d)) < 40000 else {k: v for k, v in d.items()
                                                                   if len(json.dumps(v)) < 4000}
        rec["summary"] = doc.get("summary")
    if name is None:
        s.gate = rec
    return rec


def run_profile(r: int) -> Path:
    """The profile for repeat r (1-based): run 1 is the shipped profile; run r > 1 samples its T>0 answers
    with seeds of its own, so the runs are independent draws at T>0 (the baseline's seeds stay disjoint)."""
    if r == 1:
        return PROFILE
    import yaml

    doc = yaml.safe_load(PROFILE.read_text())
    doc["gate"].setdefault("likelihood", {})["seeds"] = [10000 * r + 1, 10000 * r + 2, 10000 * r + 3]
    path = OUT / "profiles" / f"run-{r:02d}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def record_baseline(base: GateServer, out: Path) -> dict:
    """`validation record-baseline` on the target-only server (the profile's baseline seeds at T>0)."""
    r = subprocess.run([sys.executable, "-m", "sglfleet.validation", "record-baseline", "--target", base.url, "--out",
                        str(out),
                        "--config", str(PROFILE), "--no-judge"], cwd=ROOT, env=validation_env(),
                       capture_output=True, text=True, timeout=300)
    return {"rc": r.returncode, "tail": (r.stdout + r.stderr)[-2000:]}


def wait_up(servers: list, until: float) -> None:
    """Until every server is up or has failed, or `until` (time.time()) has passed."""
    while time.time() < until and any(not s.poll_up() and not s.error for s in servers):
        time.sleep(2)


def wait_for(path: Path, until: float) -> bool:
    while time.time() < until:
        if path.exists():
            return True
        time.sleep(2)
    return path.exists()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", required=True, help="python -m testbed.models train-drafter output dir")
    ap.add_argument("--deadline", type=float, default=560.0)
    ap.add_argument("--only", default="", help="comma-separated server names (default: all)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="gate runs per server, all at once (issue 30: 10); above 1 the speed phase is left out")
    ap.add_argument("--wait-drafter", default="",
                    help="a file the drafter's training writes when done: the target-only server starts (and "
                         "records the baseline) while the drafter trains; the speculative servers start after")
    ap.add_argument("--gate-reserve", type=float, default=120.0,
                    help="seconds kept for the gates after the servers' wait (21 gates at once took about 50 s)")
    ap.add_argument("--gate-workers", type=int, default=0,
                    help="gates run at once (default: the CPUs, at most the number of gates); the others queue, "
                         "and one that cannot start --min-gate-s before the deadline is recorded as not run")
    ap.add_argument("--min-gate-s", type=float, default=45.0)
    a = ap.parse_args()
    if a.gate_workers < 0 or a.min_gate_s <= 0:
        print("error: --gate-workers must be >= 0 and --min-gate-s > 0", file=sys.stderr)
        return 2
    if a.repeat < 1:
        print("error: --repeat must be >= 1", file=sys.stderr)
        return 2
    t0 = time.time()
    # the servers get all the time but the gates' reserve: on a fresh machine their JIT compiles and graph
    # captures took over 216 s (2026-12-03), past the 0.6 x deadline the wait used to stop at
    servers_until = t0 + a.deadline - a.gate_reserve
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    plug = sm.install_plugins()
    sys.path.insert(0, str(plug))  # sglang_ddtree: the cells' commands are checked with its rules
    base: GateServer | None = None
    keep = set(a.only.split(",")) | {"base"} if a.only else None
    # the variants first: the target-only server imports the patched tree, so it must be whole before it starts
    for v in ("patched", "mutant", "unpatched"):
        if keep is None or any(n.startswith(v) for n in keep):
            sm.build_variant(v)
    if a.wait_drafter:
        sm.setup_model("smollm2")  # the target alone needs no drafter
        base = plan()[0]
        base.start(plug)
    baseline = OUT / "baseline.json"
    doc: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": sm._machine(),
                 "command": " ".join(sys.argv), "drafter": a.drafter, "speed_tokens": SPEED_TOKENS,
                 "profile": str(PROFILE.relative_to(ROOT)), "repeat": a.repeat}
    with cf.ThreadPoolExecutor(1) as bg:
        recorded = None
        if base is not None:  # record the baseline while the drafter trains
            def record() -> dict:
                wait_up([base], servers_until)
                if not base.up_s:
                    return {"rc": None, "tail": "baseline server not up: " + (base.error or "")[-1500:]}
                return {**record_baseline(base, baseline), "at_s": time.time() - t0}
            recorded = bg.submit(record)
            if not wait_for(Path(a.wait_drafter), t0 + a.deadline / 2):
                print(f"the drafter did not finish by {a.deadline / 2:.0f}s", flush=True)
            print(f"drafter ready at {time.time() - t0:.0f}s", flush=True)
        try:
            sm.setup_model("smollm2", a.drafter)
            servers = plan()
        except (SystemExit, UsageError) as exc:  # no usable drafter: the baseline alone, the reason recorded
            doc["drafter_error"] = str(exc)[:1500]
            print(f"drafter unusable: {exc}", flush=True)
            servers = [base] if base is not None else []
        if keep is not None:
            servers = [s for s in servers if s.name in keep]
        if base is not None:
            servers = [base, *[s for s in servers if s.name != "base"]]
        for s in servers:
            if s.proc is None:
                s.start(plug)
                time.sleep(0.5)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(sm.MODEL["path"])
        wait_up(servers, servers_until)
        up = [s for s in servers if s.up_s]
        print(f"servers up: {len(up)}/{len(servers)} at {time.time() - t0:.0f}s", flush=True)
        train = Path(a.drafter) / "train.json"
        if train.is_file():
            doc["drafter_train"] = json.loads(train.read_text())
        base = next((s for s in servers if s.name == "base"), None)
        if recorded is None and base is not None and base.up_s:
            doc["baseline"] = record_baseline(base, baseline)
        elif recorded is not None:
            doc["baseline"] = recorded.result()
    if base is None or not base.up_s:
        print("baseline server not up:", base.error[-1500:] if base and base.error else "", flush=True)
    else:
        print(f"baseline rc={doc['baseline']['rc']} at {time.time() - t0:.0f}s", flush=True)
        gated = [s for s in up if s is not base]  # the baseline's own check is record-baseline's
        # the broken builds (the mutant, a worker test fault) are gated once: they must fail; the correct builds
        # `--repeat` times: they must pass every time
        jobs = [(s, r) for r in range(1, a.repeat + 1) for s in gated
                if r == 1 or not (s.variant == "mutant" or s.env)]
        # 3) the gates, `workers` at a time (21 gates at once all lost their verdict together at the deadline,
        # 2026-12-03): runs interleaved across servers, so the ones that finish cover every server; one that
        # cannot start in time is recorded as not run
        workers = a.gate_workers or max(1, min(len(jobs), os.cpu_count() or 2))
        end = t0 + a.deadline - 25

        def gate_job(s: GateServer, r: int) -> dict:
            name = s.name if a.repeat == 1 else f"{s.name}-r{r:02d}"
            left = end - time.time()
            if left < a.min_gate_s:
                return {"name": name, "server": s.name, "rc": None, "not_run": True,
                        "tail": f"not started: {left:.0f} s left before the deadline (--min-gate-s {a.min_gate_s:g})"}
            return run_gate(s, baseline if baseline.is_file() else None, left, base.url,
                            None if a.repeat == 1 else name, PROFILE if a.repeat == 1 else run_profile(r))

        with cf.ThreadPoolExecutor(workers) as ex:
            futs = [ex.submit(gate_job, s, r) for s, r in jobs]
            doc["gates"] = [f.result() for f in futs]
        doc["gate_workers"] = workers
        print(f"gates done at {time.time() - t0:.0f}s", flush=True)
        if a.repeat == 1:
            # 2) speed after the gates (the mutant's device-side assert at T=0.8 killed it in the speed phase
            # before its gate could run, 2026-12-01): one server busy at a time, so the ratios are side by side
            for s in up:
                speed(s, tok)
            print(f"speed done at {time.time() - t0:.0f}s", flush=True)
            doc["fixtures"] = [fixtures(s, tok) for s in up if s.name in ("base", "patched-b16-k4", "chain")]
    for s in servers:
        if s.proc is not None and s.up_s is None and s.error is None:
            s.error = "not up before the deadline: " + s.log.read_text(errors="replace")[-1500:]
        elif s.proc is not None and s.up_s is not None and s.proc.poll() is not None:  # died while serving
            lines = [ln for ln in s.log.read_text(errors="replace").splitlines()
                     if "Error" in ln and "Ignore import error" not in ln]
            s.error = f"exited rc={s.proc.returncode} while serving: " + " | ".join(lines[:4])[:1500]
    doc["wall_s"] = time.time() - t0
    doc["servers"] = [{**s.summary(), "topk": s.topk, "chain": s.chain, "speed": s.speed, "gate": s.gate}
                      for s in servers]
    for s in doc["servers"]:
        rows = [r["tokens_per_s"] for r in s["speed"] if r.get("tokens_per_s") and r["temperature"] == 0]
        s["median_tokens_per_s_t0"] = statistics.median(rows) if rows else None
    (OUT / "incident.json").write_text(json.dumps(doc))
    sm.stop_all(servers)
    subprocess.run(["tar", "-C", str(OUT), "-czf", str(OUT / "incident-logs.tgz"), "logs"], check=False)
    print(json.dumps([{"name": g["name"], "rc": g.get("rc"), "passed": g.get("passed"),
                       "failed": [c["name"] for c in g.get("cases", []) if not c["ok"] and not c["skipped"]]}
                      for g in doc.get("gates", [])]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
