"""GPU proof of DDTree through real `python -m sglang.launch_server` (0.5.23) servers.

Runs on the GPU machine after `source .carry/sglang/p2/on-device.sh` (site dir /tmp/site with
the stock sglang 0.5.23). Builds three sglang variants from the repo's patch series:

- patched:   the whole series (patches/sglang-0.5.23/series);
- unpatched: only the argument patches (0010 verify width, 0015 DDTree args + worker hook, 0016
             the decode KV reserve), i.e.
             the tree-verify backend fixes 0011-0014 left out;
- mutant:    the series + tests/ddtree/mutants/seeds-block-size-indexing.patch (the incident:
             the triton backend indexes the tree mask by the DFlash block size);

installs the sglang-ddtree plugin and the TEST-ONLY oracle drafter (tests/ddtree/oracle) from
wheels, starts target-only baselines and DDTree servers (a tiny Llama with dummy weights, a
dummy DFlashDraftModel drafter of block 8), all at once on the one GPU, sends the same
concurrent greedy requests (4 prompts of different lengths) to each, and writes
$OUT/serve-matrix.json: per server its config, start time, per-request output ids and
meta_info, /server_info's internal states and the Prometheus spec lines. Comparison and the
near-tie analysis are done by tests/ddtree/render_serve_matrix.py from that file.

    python3 tests/ddtree/serve_matrix.py [--only smoke|full|overlap] [--deadline 560]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT", "/tmp/serve-matrix"))
SITE = Path(os.environ.get("SITE", "/tmp/site"))
VAR = Path("/tmp/ddtree-var")
V = 49152
BLOCK = 8
MAX_NEW = 48
MAX_NEW_BOX = [MAX_NEW]
TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=V, hidden_size=256,
            intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5,
            rope_theta=10000.0, tie_word_embeddings=True, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
DRAFT = dict(TINY, architectures=["DFlashDraftModel"], num_hidden_layers=1,
             dflash_config=dict(block_size=BLOCK, target_layer_ids=[1, 2], mask_token_id=V - 1))
EAGER = ["--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"]
GRAPH = ["--cuda-graph-bs-decode", "1", "2", "4", "--disable-prefill-cuda-graph"]
PROMPT_LENS = (6, 41, 157, 700)  # tiny model: random prompt ids of these lengths
# SmolLM2-135M-Instruct (the embedded target, converted from its GGUF by `python -m testbed.models convert`):
# chat prompts of different lengths, tokenized on the machine with the checkpoint's tokenizer.
_PASSAGE = (
    "The history of the lighthouse is a history of trade. Ports grew where ships could find them at night, "
    "and the first towers were simple fires kept burning on hills. Later, keepers trimmed oil lamps and "
    "polished lenses, and a good keeper knew every vessel that passed. Storms tested them; fog hid them; "
    "electric light and radio beacons finally replaced most of them. ")
CHAT_PROMPTS = (
    "Write a short poem about the ocean.",
    "Explain how a refrigerator keeps food cold, step by step.",
    _PASSAGE + "\n\nSummarize the passage above in two sentences.",
    (_PASSAGE * 6) + "\n\nList three facts from the passage above.",
)
TOPKS = (1, 4, 8)
SERVER_TOPK = 8


MODEL = {"path": "/tmp/tiny", "draft": "/tmp/tiny-draft", "load": ["--load-format", "dummy"], "real": False,
         "draft_load": ["--speculative-draft-load-format", "dummy"]}


def prompts() -> list[list[int]]:
    if MODEL["real"]:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(MODEL["path"])
        out = []
        for p in CHAT_PROMPTS:
            ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
            if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
                ids = ids["input_ids"]
            ids = [int(t) for t in ids]
            if len(ids) < 8:
                raise SystemExit(f"tokenized prompt is implausibly short ({len(ids)} ids): {p[:40]!r}")
            out.append(ids)
        return out
    rng = random.Random(20261201)
    return [[rng.randrange(3, V - 2) for _ in range(n)] for n in PROMPT_LENS]


def setup_model(name: str, trained_drafter: str | None = None) -> None:
    """Write the model configs: the tiny dummy Llama, or the converted SmolLM2 and a DFlash
    drafter (dummy weights) shaped for it."""
    if name == "tiny":
        for d, cfg in (("/tmp/tiny", TINY), ("/tmp/tiny-draft", DRAFT)):
            os.makedirs(d, exist_ok=True)
            Path(d, "config.json").write_text(json.dumps(cfg))
        return
    target = Path("/tmp/smollm2")
    if not (target / "model.safetensors").exists():
        raise SystemExit("/tmp/smollm2 missing: run python3 -m testbed.models convert --gguf ... --out "
                         "/tmp/smollm2 first")
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "src"))
    from testbed.models.drafter import drafter_config_for

    cfg = json.loads((target / "config.json").read_text())
    draft = drafter_config_for(cfg, block_size=BLOCK)  # checked against the target (models/drafter.py)
    os.makedirs("/tmp/smollm2-draft", exist_ok=True)
    Path("/tmp/smollm2-draft/config.json").write_text(json.dumps(draft))
    MODEL.update(path=str(target), draft="/tmp/smollm2-draft", load=[], real=True)
    if trained_drafter:  # python -m testbed.models train-drafter output: real weights, checked against the target
        from testbed.models.drafter import check_dirs

        check_dirs(target, trained_drafter, block_size=BLOCK)
        MODEL.update(draft=trained_drafter, draft_load=[])


def series(variant: str) -> list[Path]:
    d = ROOT / "src" / "sglfleet" / "patches" / "sglang-0.5.23"
    names = [ln.strip() for ln in (d / "series").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    if variant == "unpatched":
        names = [n for n in names if n.startswith(("0010", "0015", "0016"))]
    files = [d / n for n in names]
    if variant == "mutant":
        files.append(ROOT / "tests" / "ddtree" / "mutants" / "seeds-block-size-indexing.patch")
    return files


def build_variant(variant: str) -> Path:
    dest = VAR / variant
    if (dest / ".done").exists():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copytree(SITE / "sglang", dest / "sglang", symlinks=True)
    for p in series(variant):
        r = subprocess.run(["patch", "-p1", "--fuzz=0", "--batch", "-s", "-i", str(p)], cwd=dest,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{variant}: {p.name} does not apply: {r.stdout}{r.stderr}")
    if variant == "mutant":
        src = (dest / "sglang/srt/layers/attention/triton_backend.py").read_text()
        if src.count("MUTANT seeds") < 3:
            raise SystemExit("mutant variant lacks its markers")
    (dest / ".done").write_text("ok")
    return dest


def install_plugins() -> Path:
    plug = Path("/tmp/ddtree-plug")
    shutil.rmtree(plug, ignore_errors=True)
    wheels = sorted((ROOT / ".carry" / "ddtree-srv").glob("*.whl"))
    if len(wheels) < 2:
        raise SystemExit("missing .carry/ddtree-srv/*.whl (run tests/ddtree/make_server_carry.sh)")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(plug), *map(str, wheels)], check=True)
    return plug


class Server:
    def __init__(self, name: str, variant: str | None, budget: int | None, graph: bool, port: int):
        self.name, self.variant, self.budget, self.graph, self.port = name, variant, budget, graph, port
        self.proc: subprocess.Popen | None = None
        self.t0 = 0.0
        self.up_s: float | None = None
        self.error: str | None = None
        self.results: list[dict] = []
        self.info: dict = {}
        self.env: dict[str, str] = {}  # put into the server's environment (a test fault of the worker)
        self.overlap = False  # a speculative server under sglang's overlap scheduler (DDTree: SGLANG_DDTREE_OVERLAP=1)

    def cmd(self) -> list[str]:
        c = [sys.executable, "-m", "sglang.launch_server", "--model-path", MODEL["path"], *MODEL["load"],
             "--skip-tokenizer-init", "--attention-backend", "triton", "--sampling-backend", "pytorch",
             "--disable-radix-cache", "--mem-fraction-static", "0.5", "--max-total-tokens", "40000",
             "--enable-metrics", "--port", str(self.port), "--host", "127.0.0.1",
             # below Linux's ephemeral range (32768+): there, any outgoing connection can take the port
             # between sglang's check and its bind (2 of 28 servers lost to EADDRINUSE on 33108 / 33116)
             "--nccl-port", str(self.port - 8000)]
        c += GRAPH if self.graph else EAGER
        if self.budget is not None:
            c += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", MODEL["draft"],
                  *MODEL["draft_load"], "--speculative-num-draft-tokens", str(BLOCK),
                  "--speculative-ddtree-budget", str(self.budget), "--speculative-ddtree-topk", str(SERVER_TOPK),
                  *overlap_flags(self.overlap)]
        return c

    def start(self, plug: Path) -> None:
        env = dict(os.environ)
        paths = [str(VAR / (self.variant or "patched")), str(plug), str(SITE)]
        env["PYTHONPATH"] = ":".join(paths)
        env["DDTREE_ORACLE"] = str(OUT / "oracle.json")
        if self.overlap:
            env["SGLANG_DDTREE_OVERLAP"] = "1"  # the plugin's opt-in (sglang_ddtree/config.py OVERLAP_ENV)
        env.update(self.env)
        self.log = OUT / "logs" / f"{self.name}.log"
        self.t0 = time.time()
        with open(self.log, "w") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.cmd(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/tmp")

    def poll_up(self) -> bool:
        if self.up_s is not None:
            return True
        if self.proc is None or self.error:
            return False
        if self.proc.poll() is not None:
            self.error = f"exited rc={self.proc.returncode}: " + self.log.read_text(errors="replace")[-2500:]
            return False
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=3)
            self.up_s = time.time() - self.t0
            return True
        except OSError:
            return False

    def post(self, path: str, body: dict, timeout: float = 120) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        return json.load(urllib.request.urlopen(req, timeout=timeout))

    def get(self, path: str) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30).read().decode()

    def round(self, tag: str, ps: list[list[int]], params: dict) -> None:
        def one(ids):
            t = time.time()
            try:
                r = self.post("/generate", {"input_ids": ids, "sampling_params": params,
                                            **({"return_logprob": True, "top_logprobs_num": 2}
                                               if tag == "baseline" else {})})
                meta = r.get("meta_info", {})
                keep = {k: meta.get(k) for k in ("spec_verify_ct", "spec_accept_length", "spec_accept_rate",
                                                  "completion_tokens", "finish_reason")}
                if tag == "baseline":
                    keep["top2"] = [[(lp, tid) for lp, tid, *_ in row] for row in meta.get("output_top_logprobs", [])]
                return {"tag": tag, "prompt_len": len(ids), "output_ids": r.get("output_ids"), "meta": keep,
                        "wall_s": time.time() - t}
            except Exception as e:  # recorded, compared as a failure
                return {"tag": tag, "prompt_len": len(ids), "error": repr(e)[:500]}

        with cf.ThreadPoolExecutor(len(ps)) as ex:
            self.results += list(ex.map(one, ps))

    def summary(self) -> dict:
        return {"name": self.name, "variant": self.variant, "budget": self.budget, "graph": self.graph,
                "overlap": self.overlap,
                "up_s": self.up_s, "error": self.error, "results": self.results, "info": self.info,
                "cmd": self.cmd()}


def overlap_flags(overlap: bool) -> list[str]:
    """A speculative server's scheduler flag: none under the overlap scheduler (sglang's default)."""
    return [] if overlap else ["--disable-overlap-schedule"]


def plan(only: str) -> list[Server]:
    port = iter(range(31100, 31200))
    s = [Server("base-eager", None, None, False, next(port)), Server("base-graph", None, None, True, next(port))]
    if only == "warm":  # compile the JIT kernels once (a later full run starts every server at once)
        return [s[0], Server("patched-b16-graph", "patched", 16, True, next(port))]
    if only == "rerun":  # the servers an earlier full run could not start (see docs/ddtree-serve.md)
        names = {"base-graph", "patched-b1-graph", "patched-b1-eager", "patched-b3-graph", "patched-b3-eager",
                 "mutant-b3-graph", "mutant-b3-eager", "unpatched-b3-graph"}
        return [x for x in plan("full") if x.name == "base-eager" or x.name in names]
    if only == "overlap":  # DDTree under sglang's overlap scheduler (SGLANG_DDTREE_OVERLAP=1) beside non-overlap twins
        out = [s[0]]
        for b in (7, 16, 31):
            for ov in (True, False):
                x = Server(f"patched-b{b}-graph{'-overlap' if ov else ''}", "patched", b, True, next(port))
                x.overlap = ov
                out.append(x)
        mutant = Server("mutant-b16-graph-overlap", "mutant", 16, True, next(port))
        mutant.overlap = True  # the check keeps its power under the overlap scheduler
        return [*out, mutant]
    if only == "smoke":
        return [s[0], Server("patched-b16-graph", "patched", 16, True, next(port)),
                Server("mutant-b16-graph", "mutant", 16, True, next(port))]
    for b in (1, 3, 7, 8, 15, 16, 31, 63):
        for g in (True, False):
            s.append(Server(f"patched-b{b}-{'graph' if g else 'eager'}", "patched", b, g, next(port)))
    for b, g in ((3, True), (7, True), (16, True), (31, True), (3, False), (16, False)):
        s.append(Server(f"mutant-b{b}-{'graph' if g else 'eager'}", "mutant", b, g, next(port)))
    for b, g in ((3, True), (7, True), (16, True), (7, False)):
        s.append(Server(f"unpatched-b{b}-{'graph' if g else 'eager'}", "unpatched", b, g, next(port)))
    return s


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("smoke", "warm", "full", "rerun", "overlap"), default="full")
    ap.add_argument("--deadline", type=float, default=560.0, help="seconds; stop waiting and report")
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--max-new", type=int, default=MAX_NEW)
    ap.add_argument("--no-waves", action="store_true", help="start every server at once (JIT caches warm)")
    ap.add_argument("--drafter", help="a trained DFlash drafter dir (smollm2 only); default: dummy weights")
    a = ap.parse_args()
    t_start = time.time()
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    setup_model(a.model, a.drafter)
    MAX_NEW_BOX[0] = a.max_new
    servers = plan(a.only)
    for v in sorted({s.variant or "patched" for s in servers}):
        build_variant(v)
    plug = install_plugins()
    print(f"variants + plugins ready in {time.time() - t_start:.0f}s", flush=True)
    wave1 = servers if a.no_waves else [s for s in servers if s.name in ("base-eager", "patched-b16-graph")]
    rest = [s for s in servers if s not in wave1]
    for s in wave1:
        s.start(plug)
    ps = prompts()
    base = servers[0]
    started_rest = False
    baseline_done = False
    deadline = t_start + a.deadline

    def remaining():
        return [s for s in servers if s.proc is not None and s.up_s is None and s.error is None]

    while time.time() < deadline:
        for s in servers:
            s.poll_up()
        if base.error:
            print("baseline server failed:", base.error[-1500:], flush=True)
            break
        if not started_rest and (all(s.up_s or s.error for s in wave1) or time.time() - t_start > 260):
            for s in rest:
                s.start(plug)
                time.sleep(1.0)
            started_rest = True
            print(f"wave 1: {[(s.name, s.up_s, bool(s.error)) for s in wave1]}; started {len(rest)} more", flush=True)
        if base.up_s and not baseline_done:
            base.round("baseline", ps, {"max_new_tokens": MAX_NEW_BOX[0], "temperature": 0})
            table = {",".join(map(str, p)): r.get("output_ids") or [] for p, r in zip(ps, base.results, strict=True)}
            (OUT / "oracle.json").write_text(json.dumps(table))
            baseline_done = True
            print("baseline recorded", flush=True)
        if started_rest and baseline_done and not remaining():
            break
        time.sleep(2)
    print(f"servers up: {sum(1 for s in servers if s.up_s)}/{len(servers)} at {time.time() - t_start:.0f}s",
          flush=True)

    def run_server(s: Server) -> None:
        if not s.up_s or (s is base):
            return
        greedy = {"max_new_tokens": MAX_NEW_BOX[0], "temperature": 0}
        if s.budget is None:
            s.round("t0", ps, greedy)
        else:
            for k in TOPKS:
                for oracle in (True, False):
                    s.round(f"k{k}-{'oracle' if oracle else 'drafter'}", ps,
                            {**greedy, "custom_params": {"ddtree_test_topk": k, "ddtree_oracle": oracle}})
            s.round("t0.8-drafter", ps, {"max_new_tokens": MAX_NEW_BOX[0], "temperature": 0.8})
        try:
            s.info["server_info"] = json.loads(s.get("/server_info")).get("internal_states")
        except Exception as e:
            s.info["server_info_error"] = repr(e)[:300]
        try:
            lines = s.get("/metrics").splitlines()
            s.info["metrics"] = [ln for ln in lines if "spec_" in ln and not ln.startswith("#")]
        except Exception as e:
            s.info["metrics_error"] = repr(e)[:300]

    with cf.ThreadPoolExecutor(16) as ex:
        list(ex.map(run_server, servers))
    for s in servers:
        if s.proc is not None and s.up_s is None and s.error is None:
            s.error = "not up before the deadline: " + s.log.read_text(errors="replace")[-1500:]
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": _machine(),
           "command": " ".join(sys.argv), "model": a.model, "model_path": MODEL["path"], "block": BLOCK,
           "max_new_tokens": MAX_NEW_BOX[0], "prompt_lens": PROMPT_LENS,
           "server_topk": SERVER_TOPK, "wall_s": time.time() - t_start, "servers": [s.summary() for s in servers]}
    (OUT / "serve-matrix.json").write_text(json.dumps(doc))  # before the servers stop (they drain slowly)
    stop_all(servers)
    subprocess.run(["tar", "-C", str(OUT), "-czf", str(OUT / "logs.tgz"), "logs"], check=False)
    shutil.rmtree(OUT / "logs", ignore_errors=True)
    bad = [s.name for s in servers if s.error]
    print(f"done in {time.time() - t_start:.0f}s; failed to serve: {bad}", flush=True)
    return 0


def stop_all(servers: list) -> None:
    """SIGTERM every server at once, then SIGKILL what is still up after 10 s."""
    live = [s.proc for s in servers if s.proc and s.proc.poll() is None]
    for p in live:
        p.terminate()
    end = time.time() + 10
    for p in live:
        try:
            p.wait(max(0.1, end - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()


def _machine() -> str:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        gpu = "?"
    import torch

    return f"{gpu}; torch {torch.__version__}; python {sys.version.split()[0]}"


if __name__ == "__main__":
    sys.exit(main())
