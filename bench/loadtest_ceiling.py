"""The load-test harness's own ceiling, side by side with SGLang's `sglang.bench_serving`.

Both clients stream chat completions from the same fast local endpoint (testbed.simserver with no
delays: every response is written at once from a cached buffer, on its own CPU core) while the
client under test is pinned to one core, so throughput is throughput per client core. Reported:

* streamed output tokens/s and requests/s per client core: our Locust harness (ITL events `each`
  and `mean`) and `python -m sglang.bench_serving` (the real one, sglang==0.5.23, from its own venv);
  the ratio harness / bench_serving;
* timing error: TTFT and every ITL gap against the send instants the simulator recorded while
  sleeping known delays;
* worker scaling: tokens per client CPU-second with Locust --processes 1 and 2 (master/worker).

    .venv/bin/python bench/loadtest_ceiling.py [--out DIR] [--tokens 256] [--users 32] [--duration 8]

bench_serving's venv (once): see docs/loadtests.md ("Benchmark"), default .cache/sglang-bench.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sglfleet.loadtests.runner import load_records  # noqa: E402
from sglfleet.pipeline.procs import free_port as _free_port  # noqa: E402
from sglfleet.pipeline.reports import new_run_dir, utc_now, write_json  # noqa: E402
from testbed.simserver import SimServer  # noqa: E402

BENCH_PY = REPO / ".cache" / "sglang-bench" / "bin" / "python"
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU seconds (user+sys) of `root` and all its live descendants, from /proc."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        parent[int(d)] = int(fields[1])
        cpu[int(d)] = (int(fields[11]) + int(fields[12])) / TICK
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += [p for p, pp in parent.items() if pp == pid]
    return total


class CpuSampler(threading.Thread):
    """Samples tree_cpu(pid) every 0.25 s: [(wall time, cpu seconds)]."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        super().__init__(daemon=True)
        self.proc = proc
        self.samples: list[tuple[float, float]] = []

    def run(self) -> None:
        while self.proc.poll() is None:
            self.samples.append((time.time(), tree_cpu(self.proc.pid)))
            time.sleep(0.25)

    def cpu_between(self, t0: float, t1: float) -> float:
        def at(t: float) -> float:
            before = [c for ts, c in self.samples if ts <= t]
            return before[-1] if before else 0.0
        return at(t1) - at(t0)


def machine() -> dict[str, Any]:
    """Where the numbers come from: host, CPU model, cores, load average at the start."""
    import platform

    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), None) if Path("/proc/cpuinfo").is_file() else None
    return {"hostname": platform.node(), "cpu_model": model, "cpus": os.cpu_count(),
            "python": platform.python_version(), "kernel": platform.release(), "load_average_start": os.getloadavg()}


def taskset(cpu: str | None) -> list[str]:
    return ["taskset", "-c", cpu] if cpu else []


def run_harness(url: str, out: Path, users: int, duration: float, tokens: int, itl_events: str,
                processes: int = 1, cpu: str | None = None) -> dict[str, Any]:
    cmd = [*taskset(cpu), sys.executable, "-m", "sglfleet.loadtests", "run", "--host", url, "--users", str(users),
           "--duration", str(duration), "--max-tokens", str(tokens), "--max-requests", "10000000",
           "--itl-events", itl_events, "--processes", str(processes), "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler = CpuSampler(proc)
    sampler.start()
    _, err = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"harness run failed: {err.decode()[-500:]}")
    summary = json.loads((out / "summary.json").read_text())
    # Steady-state window: from 1 s after the first request to the stop; CPU of the Locust tree in it.
    recs = [r for r in load_records(out) if r["ok"]]
    stop_at = json.loads((out / "stop_at.json").read_text())["at"]
    t0 = recs[0]["t"] + 1.0
    t1 = stop_at - 0.25
    done = [r for r in recs if t0 <= r["t"] + r["e2e"] / 1000 <= t1]
    cpu_s = sampler.cpu_between(t0, t1)
    toks = sum(r["n"] for r in done)
    thr = summary["throughput"]
    return {
        "itl_events": itl_events, "processes": processes, "users": users,
        "output_tok_per_s": thr["output_tok_per_s"], "requests_per_s": thr["requests_per_s"],
        "requests_ok": summary["requests"]["ok"], "failed": summary["requests"]["failed"],
        "window_s": round(t1 - t0, 2), "client_cpu_s": round(cpu_s, 2),
        "client_cores_busy": round(cpu_s / (t1 - t0), 2),
        "tok_per_cpu_s": round(toks / cpu_s, 1) if cpu_s > 0 else None,
        "req_per_cpu_s": round(len(done) / cpu_s, 2) if cpu_s > 0 else None,
    }


def prepare_bench_serving_inputs(work: Path, bench_py: Path) -> tuple[Path, Path]:
    """A word-level tokenizer and a ShareGPT-shaped prompt file, both local (no hub access)."""
    tok_dir, data = work / "tokenizer", work / "sharegpt.json"
    script = f"""
import json, random
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {{"[UNK]": 0, "[EOS]": 1, **{{f"w{{i}}": i + 2 for i in range(2000)}}}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.decoder = decoders.WordPiece(prefix="##")
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]").save_pretrained({str(tok_dir)!r})
r = random.Random(0)
text = lambda: " ".join(f"w{{r.randrange(2000)}}" for _ in range(64))
json.dump([{{"conversations": [{{"from": "human", "value": text()}}, {{"from": "gpt", "value": text()}}]}}
           for _ in range(20000)], open({str(data)!r}, "w"))
"""
    subprocess.run([str(bench_py), "-c", script], check=True)
    return tok_dir, data


def run_bench_serving(bench_py: Path, url: str, work: Path, tok_dir: Path, data: Path, users: int, tokens: int,
                      num_prompts: int, cpu: str | None) -> tuple[dict[str, Any], list[str]]:
    out_file = work / "bench_serving.jsonl"
    out_file.unlink(missing_ok=True)
    cmd = [*taskset(cpu), str(bench_py), "-m", "sglang.bench_serving", "--backend", "sglang-oai-chat",
           "--base-url", url, "--model", "sim", "--tokenizer", str(tok_dir), "--dataset-name", "random",
           "--dataset-path", str(data), "--random-input-len", "32", "--random-output-len", str(tokens),
           "--random-range-ratio", "1.0", "--num-prompts", str(num_prompts), "--max-concurrency", str(users),
           "--request-rate", "inf", "--output-file", str(out_file), "--disable-tqdm"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler = CpuSampler(proc)
    sampler.start()
    _, err = proc.communicate()
    sampler.join()
    if proc.returncode != 0 or not out_file.is_file():
        raise SystemExit(f"bench_serving failed: {err.decode()[-800:]}")
    res = json.loads(out_file.read_text().strip().splitlines()[-1])
    # Its benchmark phase sits between start-up (imports, tokenizer, dataset) and the final metrics;
    # the busiest 2 s window of its CPU series shows whether it saturated its core.
    sm = sampler.samples
    peak = max(((c1 - c0) / (t1 - t0) for (t0, c0), (t1, c1) in zip(sm, sm[8:], strict=False)), default=None)
    return ({"output_tok_per_s": round(res["output_throughput"], 1),
             "requests_per_s": round(res["request_throughput"], 2), "completed": res["completed"],
             "duration_s": round(res["duration"], 2), "max_concurrency": users,
             "client_cores_busy_peak_2s": round(peak, 2) if peak is not None else None}, cmd)


def timing_error(out: Path, duration: float) -> dict[str, Any]:
    """TTFT/ITL of our harness against the simulator's recorded send instants (1 user, known delays)."""
    with SimServer(_free_port(), "--ttft-ms", "40", "--itl-ms", "3,8,15", "--tokens", "16") as srv:
        run = out / "timing"
        cp = subprocess.run([sys.executable, "-m", "sglfleet.loadtests", "run", "--host", srv.url, "--users", "1",
                             "--duration", str(duration), "--max-tokens", "16", "--out", str(run)],
                            cwd=REPO, capture_output=True, text=True, check=False)
        if cp.returncode != 0:
            raise SystemExit(f"timing run failed: {cp.stderr}")
        timings = srv.timings()[1:]
    stop_at = json.loads((run / "stop_at.json").read_text())["at"]
    itl_err: list[float] = []
    ttft_err: list[float] = []
    for rec, tim in zip(load_records(run), timings, strict=False):
        if not rec["ok"] or rec["t"] + rec["e2e"] / 1000 > stop_at:
            continue
        s = tim["sends"]
        itl_err += [abs(c - (b - a) * 1000) for c, a, b in zip(rec["itl"], s, s[1:], strict=False)]
        ttft_err.append(abs((rec["ttft"] - rec["hdr"]) - (s[0] - tim["t_head"]) * 1000))

    def d(v: list[float]) -> dict[str, float]:
        v = sorted(v)
        return {"n": len(v), "median_ms": round(statistics.median(v), 4),
                "p90_ms": round(v[int(0.9 * (len(v) - 1))], 4), "p99_ms": round(v[int(0.99 * (len(v) - 1))], 4),
                "share_under_1ms": round(sum(x < 1 for x in v) / len(v), 4)}
    return {"itl_abs_error": d(itl_err), "ttft_abs_error": d(ttft_err)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--result", help="also write the raw result JSON here (e.g. docs/results/....json)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--client-cpu", default="0")
    ap.add_argument("--server-cpu", default="1")
    ap.add_argument("--bench-python", default=str(BENCH_PY))
    ap.add_argument("--skip-bench-serving", action="store_true")
    ap.add_argument("--scaling", default="1,2", help="Locust --processes values for the scaling runs")
    ap.add_argument("--scaling-cpus", default=None, help="CPU list for the scaling clients (default: unpinned)")
    ap.add_argument("--server-workers", type=int, default=1, help="simulator processes (SO_REUSEPORT)")
    ap.add_argument("--skip-single", action="store_true", help="only the scaling and timing parts")
    args = ap.parse_args()
    bench_py = Path(args.bench_python)
    if not args.skip_bench_serving and not bench_py.is_file():
        print(f"error: no bench_serving venv at {bench_py}: see docs/loadtests.md (Benchmark)", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else new_run_dir("runs", "bench-loadtest")
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"date": utc_now(), "machine": machine(), "tokens_per_request": args.tokens,
                              "concurrency": args.users, "duration_s": args.duration,
                              "client_cpu": args.client_cpu, "server_cpu": args.server_cpu, "cpus": os.cpu_count(),
                              "command": " ".join(sys.argv), "harness": [], "bench_serving": []}
    inputs = None if args.skip_bench_serving else prepare_bench_serving_inputs(out, bench_py)
    with SimServer(_free_port(), "--tokens", str(args.tokens), "--no-record", "--workers", str(args.server_workers),
                   cpu=args.server_cpu) as srv:
        for rep in range(0 if args.skip_single else args.repeats):
            for ev in ("each", "mean"):
                h = run_harness(srv.url, out / f"harness-{ev}-{rep}", args.users, args.duration, args.tokens, ev,
                                cpu=args.client_cpu)
                result["harness"].append(h)
                print(f"harness itl_events={ev}: {h['output_tok_per_s']:.0f} tok/s, {h['requests_per_s']:.1f} req/s "
                      f"on 1 core (busy {h['client_cores_busy']})", flush=True)
            if inputs is not None:
                n = max(200, int(result["harness"][-2]["requests_per_s"] * args.duration))
                b, cmd = run_bench_serving(bench_py, srv.url, out, inputs[0], inputs[1], args.users, args.tokens, n,
                                           args.client_cpu)
                result["bench_serving"].append(b)
                result["bench_serving_command"] = " ".join(cmd)
                print(f"bench_serving: {b['output_tok_per_s']:.0f} tok/s, {b['requests_per_s']:.1f} req/s on 1 core",
                      flush=True)
        result["scaling"] = []
        for procs in (int(x) for x in args.scaling.split(",")):
            s = run_harness(srv.url, out / f"scaling-{procs}", args.users * procs if args.scaling_cpus else args.users,
                            args.duration, args.tokens, "each", processes=procs, cpu=args.scaling_cpus)
            result["scaling"].append(s)
            print(f"scaling --processes {procs}: {s['output_tok_per_s']:.0f} tok/s, {s['tok_per_cpu_s']} tok per "
                  f"client CPU-s (client cores busy {s['client_cores_busy']})", flush=True)
    result["timing"] = timing_error(out, 5.0)

    def best(rows: list[dict[str, Any]], key: str, **match: Any) -> float:
        return max(r[key] for r in rows if all(r.get(k) == v for k, v in match.items()))
    if result["bench_serving"] and result["harness"]:
        bs_tok = best(result["bench_serving"], "output_tok_per_s")
        bs_req = best(result["bench_serving"], "requests_per_s")
        result["ratio"] = {
            ev: {"tok_per_s": round(best(result["harness"], "output_tok_per_s", itl_events=ev) / bs_tok, 2),
                 "req_per_s": round(best(result["harness"], "requests_per_s", itl_events=ev) / bs_req, 2)}
            for ev in ("each", "mean")}
    base = result["scaling"][0]
    result["scaling_efficiency"] = {  # throughput per worker relative to one worker (1.0 = linear)
        str(r["processes"]): round(r["output_tok_per_s"] / (base["output_tok_per_s"] * r["processes"]), 2)
        for r in result["scaling"]}
    result["tok_per_cpu_s_by_processes"] = {str(r["processes"]): r["tok_per_cpu_s"] for r in result["scaling"]}
    result["load_average_after"] = os.getloadavg()
    write_json(out / "bench.json", result)
    if args.result:  # the raw result kept in the repo (docs tables are rendered from it)
        write_json(args.result, result)
    print(json.dumps({k: result.get(k) for k in ("ratio", "timing", "scaling_efficiency",
                                                 "tok_per_cpu_s_by_processes")}, indent=1))
    print(f"results: {out}/bench.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
