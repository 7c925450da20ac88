"""Issue 41 items 4 and 5 on the H200, in the README's production sequence (tests/ddtree/gpu_session.sh, steps
`trainwarm` and `prodseq`; the raw file is rendered by tests/ddtree/render_prodseq.py into docs/production-gate.md).

The production sequence: a target-only server records the baseline FILE (`python -m sglfleet.validation
record-baseline`),
it is stopped, and every speculative candidate is gated with
`python -m sglfleet.validation run --target URL --config PROFILE --baseline FILE` and nothing else (no --baseline-url,
                                                                                                    no
--reanchor-url: the candidate scores its own T>0 answers through its prefill, trusted only once it reproduces the
baseline's recorded target-only scores, and is forced onto the baseline's path at T=0 near-ties). `--no-judge` and
`--out` are the only other arguments: with a baseline file the fluency judge judges nothing (every temperature has
its oracle), and its weights are not on the device.

Target: SmolLM2-135M-Instruct in bf16 (`python -m testbed.models convert` of the embedded GGUF,
                                       /tmp/smollm2); drafter: a
2-layer DFlash drafter trained on the device (`python -m testbed.models train-drafter`,
                                              /tmp/smollm2-dflash). The servers are
the commands validation/grids/sglang-smollm2.yaml renders (tokenizer on, OpenAI routes, CUDA graphs, KV capped at
30,000 tokens a server): the DFLASH chain, DDTree b7/k4 and b16/k4 (the patch series), b16/k4 with each test fault
of the worker's sampler (SGLANG_DDTREE_TEST_FAULT, patches/ddtree/sglang_ddtree/sampling.py) and b7/k4 without the
tree-verify patches (`unpatched`: it replays the chain's CUDA graph with the wrong mask).

Phases, one device call each, on one warm machine (/tmp/prodseq keeps what a later call needs):

  warm    beside the drafter's training: the target-only server and three candidates with a dummy-weight drafter,
          so the JIT kernels are compiled before `gates`; every server stopped at the end
  gates   starts the target-only server and the candidates at once (each in its own process session, so the
          candidates outlive the call when --keep is given); records the baseline file on the target-only
          server as soon as it is up (unless an earlier call did); stops it and checks its port refuses; then
          gates the candidates, --workers at a time: each fault and the unpatched build --fault-runs times, the
          correct builds up to --runs times, interleaved so whatever finishes covers every build; run 1 uses the
          profile's seeds, run r > 1 seeds of its own. A later call with the servers still up goes on where the
          last stopped (runs that got no verdict are run again).

Writes $OUT/prodseq.json: every gate record of every call so far (verdict, failing checks, the per-token test's
numbers, the scorer-trust numbers, lossless_t0's re-anchoring, wall times), the baseline's record, the servers';
$OUT/prodseq-reports.tgz (this call's report.json files, samples stripped when the archive would be too large);
$OUT/prodseq-logs.tgz (the servers' log tails); $OUT/baseline.json.gz (the baseline file).

    python3 tests/ddtree/prodseq.py warm --deadline 520
    python3 tests/ddtree/prodseq.py gates --drafter /tmp/smollm2-dflash --deadline 560 --keep
    python3 tests/ddtree/prodseq.py gates --drafter /tmp/smollm2-dflash --deadline 500        # the last call
    python3 tests/ddtree/prodseq.py plan                                                     # CPU: the plan only
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import gzip
import hashlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_matrix as sm

ROOT = sm.ROOT
sys.path.insert(0, str(ROOT))  # testbed (models)
sys.path.insert(0, str(ROOT / "src"))  # sglfleet
OUT = sm.OUT
STATE = Path(os.environ.get("PRODSEQ_STATE", "/tmp/prodseq"))
# src/sglfleet/ of one commit (gpu_session.sh unpacks .carry/src/src.tgz there): the gates run that
# code, not whatever the working tree that travelled holds mid-edit; unset, the working tree's
SRC = Path(os.environ["PRODSEQ_SRC"]) if os.environ.get("PRODSEQ_SRC") else ROOT
sys.path.insert(0, str(SRC / "src"))  # the driver's own imports of sglfleet too (testbed.models: the working tree's)
PROFILE = SRC / "src" / "sglfleet" / "validation" / "profiles" / "sglang-smollm2.yaml"
GRID = ROOT / "src" / "sglfleet" / "validation" / "grids" / "sglang-smollm2.yaml"
ALL_FAULTS = ("verify_temperature_one", "verify_no_top_p", "row_shift", "min_p_on_t1", "step_shared_random",
              "step_replay_random", "greedy_if_any", "support_one_short")
# PRODSEQ_FAULTS=a,b: only these faults get a server (a short device budget spent where the verdict is in doubt;
# the raw's "faults" names the ones that ran)
FAULTS = tuple(f for f in os.environ.get("PRODSEQ_FAULTS", ",".join(ALL_FAULTS)).split(",") if f)
if not set(FAULTS) <= set(ALL_FAULTS):
    raise SystemExit(f"PRODSEQ_FAULTS: unknown fault(s) {sorted(set(FAULTS) - set(ALL_FAULTS))}; known: {ALL_FAULTS}")


def _overlap_trees(text: str) -> tuple[tuple[int, int], ...]:
    """PRODSEQ_OVERLAP_TREES=16:4,31:4: the DDTree budget:top-k builds gated under the overlap scheduler
    (16:4 unset)."""
    out = []
    for item in (x for x in text.split(",") if x):
        b, _, k = item.partition(":")
        if not (b.isdigit() and k.isdigit() and int(b) >= 1 and int(k) >= 1):
            raise SystemExit(f"PRODSEQ_OVERLAP_TREES: {item!r} is not BUDGET:TOPK (e.g. 16:4,31:4)")
        out.append((int(b), int(k)))
    return tuple(out)


# with --overlap: the correct trees under the overlap scheduler, and the worker faults served there as well
# (PRODSEQ_OVERLAP_FAULTS=a,b: each a build that must be refused on the overlap path too; none unset)
OVERLAP_TREES = _overlap_trees(os.environ.get("PRODSEQ_OVERLAP_TREES", "16:4"))
OVERLAP_FAULTS = tuple(f for f in os.environ.get("PRODSEQ_OVERLAP_FAULTS", "").split(",") if f)
if not set(OVERLAP_FAULTS) <= set(ALL_FAULTS):
    raise SystemExit(f"PRODSEQ_OVERLAP_FAULTS: unknown fault(s) {sorted(set(OVERLAP_FAULTS) - set(ALL_FAULTS))}; "
                     f"known: {ALL_FAULTS}")
BASE_PORT = 31300
# a later session's runs take seeds no earlier session used (PRODSEQ_RUN_OFFSET=100: run r seeds 10000 * (r + 100) + j)
RUN_OFFSET = int(os.environ.get("PRODSEQ_RUN_OFFSET", "0"))
TAIL = 2500


class Srv(sm.Server):
    """One SGLang server of the plan, started in a process session of its own (setsid): a later device call on
    the same warm machine finds it still serving; stop() ends its whole process group."""

    def __init__(self, name: str, variant: str | None, budget: int | None, topk: int, port: int, argv: list[str],
                 role: str, env: dict[str, str] | None = None):
        super().__init__(name, variant, budget, True, port)
        self.topk, self.argv, self.role = topk, argv, role
        self.env = dict(env or {})
        self.pid: int | None = None
        self.log = STATE / "logs" / f"{name}.log"

    def cmd(self) -> list[str]:
        return self.argv

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def broken(self) -> bool:
        """A build that must be refused: a worker test fault or the unpatched tree verify."""
        return self.role in ("fault", "unpatched")

    def start(self, plug: Path) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = ":".join([str(sm.VAR / (self.variant or "patched")), str(plug), str(sm.SITE)])
        env.update(self.env)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.cmd(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/tmp",
                                         start_new_session=True)
        self.pid = self.proc.pid

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        return True

    def healthy(self, timeout: float = 3.0) -> bool:
        try:
            urllib.request.urlopen(f"{self.url}/health", timeout=timeout)
            return True
        except OSError:
            return False

    def poll_up(self) -> bool:
        if self.up_s is not None:
            return True
        if self.pid is None or self.error:
            return False
        if not self.alive():
            self.error = f"exited rc={self.proc.returncode if self.proc else '?'}: {log_tail(self.log)}"
            return False
        if self.healthy():
            self.up_s = time.time() - self.t0
            return True
        return False

    def stop(self, wait: float = 15.0) -> None:
        """SIGTERM to the server's process group (its scheduler and detokenizer too), SIGKILL after `wait`."""
        if self.pid is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.pid, sig)
            except OSError:
                return
            end = time.time() + wait
            while time.time() < end:
                if self.proc is not None and self.proc.poll() is not None:
                    break
                if self.proc is None and not self.alive():
                    break
                time.sleep(0.5)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "variant": self.variant, "budget": self.budget,
                "topk": self.topk, "env": self.env, "port": self.port, "pid": self.pid, "up_s": self.up_s,
                "error": self.error, "cmd": self.cmd()}


def log_tail(path: Path, n: int = TAIL) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def graphs_up_to(argv: list[str], most: int) -> list[str]:
    """``argv`` with its ``--cuda-graph-bs-decode`` sizes cut to ``most`` (at least the smallest kept): a gate sends
    its profile's concurrency at once, so larger batches never form, and every size captured costs each of the
    ten servers start-up time on the shared machine (2026-12-05: the candidates were up at 332 s)."""
    if "--cuda-graph-bs-decode" not in argv:
        return list(argv)
    i = argv.index("--cuda-graph-bs-decode") + 1
    j = i
    while j < len(argv) and argv[j].isdigit():
        j += 1
    sizes = [x for x in argv[i:j] if int(x) <= most] or argv[i:i + 1]
    return [*argv[:i], *sizes, *argv[j:]]


def gate_concurrency() -> int:
    """The profile's requests at once (the largest batch a gate forms)."""
    from sglfleet.validation.config import load_gate_config

    return int(load_gate_config(str(PROFILE)).concurrency)


def plan(dummy_drafter: bool = False, overlap: bool = False) -> list[Srv]:
    """The target-only server and the nine candidates, as the grid's sglang kind renders them. ``overlap``: DDTree
    under sglang's overlap scheduler too (the plugin's opt-in, SGLANG_DDTREE_OVERLAP=1, and the grid's
    --disable-overlap-schedule left out): OVERLAP_TREES, correct builds that must pass like their non-overlap twins
    (b16/k4 unset), and OVERLAP_FAULTS, worker faults that must be refused on that path too."""
    from sglfleet.flow.sweep import load_sweep_config
    from sglfleet.flow.sweep_sglang import cell_command, server_command

    cfg = load_sweep_config(str(GRID)).sglang.model_copy(
        update={"model_path": sm.MODEL["path"], "draft_model_path": sm.MODEL["draft"], "python": sys.executable})
    extra = list(sm.MODEL["draft_load"]) if dummy_drafter else []
    port = iter(range(BASE_PORT, BASE_PORT + 100))

    most = gate_concurrency()

    def tree(name: str, variant: str, b: int, k: int, role: str, env: dict[str, str] | None = None) -> Srv:
        p = next(port)
        argv = graphs_up_to(cell_command(cfg, {"budget": b, "topk": k}, p, name) + extra, most)
        return Srv(name, variant, b, k, p, argv, role, env)

    p0, p1 = next(port), next(port)
    servers = [Srv("base", None, None, 0, p0, graphs_up_to(server_command(cfg, p0, None), most), "target-only"),
               Srv("chain", "patched", None, 0, p1, graphs_up_to(server_command(cfg, p1, {}) + extra, most),
                   "correct"),
               tree("b7-k4", "patched", 7, 4, "correct"), tree("b16-k4", "patched", 16, 4, "correct")]
    servers += [tree(f"fault-{f}-b16-k4", "patched", 16, 4, "fault", {"SGLANG_DDTREE_TEST_FAULT": f})
                for f in FAULTS]
    servers.append(tree("unpatched-b7-k4", "unpatched", 7, 4, "unpatched"))
    if overlap:
        def over(name: str, b: int, k: int, role: str, env: dict[str, str]) -> Srv:
            s = tree(name, "patched", b, k, role, {"SGLANG_DDTREE_OVERLAP": "1", **env})
            s.argv = [x for x in s.argv if x != "--disable-overlap-schedule"]
            return s

        trees = [over(f"b{b}-k{k}-overlap", b, k, "correct", {}) for b, k in OVERLAP_TREES]
        trees += [over(f"fault-{f}-b16-k4-overlap", 16, 4, "fault", {"SGLANG_DDTREE_TEST_FAULT": f})
                  for f in OVERLAP_FAULTS]
        servers[4:4] = trees
    # PRODSEQ_ONLY=a,b: only these candidates get a server (with the target-only one, which records the baseline)
    only = [x for x in os.environ.get("PRODSEQ_ONLY", "").split(",") if x]
    if only:
        unknown = sorted(set(only) - {s.name for s in servers})
        if unknown:
            raise SystemExit(f"PRODSEQ_ONLY: unknown server(s) {unknown}; known: {[s.name for s in servers[1:]]}")
        servers = [s for s in servers if s.role == "target-only" or s.name in only]
    return servers


def run_profile(r: int) -> tuple[Path, list[int]]:
    """The profile of run r (1-based) and its T>0 seeds: run 1 the shipped profile, run r > 1 seeds of its own
    (disjoint from the baseline's), so the runs are independent draws at T>0."""
    import yaml

    doc = yaml.safe_load(PROFILE.read_text())
    if r == 1 and not RUN_OFFSET:
        return PROFILE, list(doc["gate"]["likelihood"]["seeds"])
    n = len(doc["gate"]["likelihood"]["seeds"])
    seeds = [10000 * (r + RUN_OFFSET) + j for j in range(1, n + 1)]
    doc["gate"]["likelihood"]["seeds"] = seeds
    path = STATE / "profiles" / f"run-{r:02d}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path, seeds


def validation_env() -> dict[str, str]:
    env = dict(os.environ)
    gate_py = Path("/tmp/gate-py") if Path("/tmp/gate-py").is_dir() else ROOT / ".carry" / "gate-py"
    env["PYTHONPATH"] = ":".join([str(SRC / "src"), str(gate_py), str(sm.SITE)])
    # numpy's BLAS threads: ten gates on 16 cores beside nine servers would each start 16
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


JUDGE_GGUF = Path(os.environ.get("PRODSEQ_JUDGE_GGUF", "/tmp/gguf/smollm2.gguf"))


def baseline_profile() -> tuple[Path, list[str]]:
    """record-baseline runs with the fluency judge on, as `make record-baseline` does: it is what excuses the
    target's own greedy loops at T=0 (judge.own_loop_max_gap; without it the target-only server's own poem loop
    refused the recording twice on 2026-12-04). The judge's model is the embedded GGUF, which is not installed as a
    package on the device: the profile plus judge.model_path. No GGUF: --no-judge."""
    import yaml

    if not JUDGE_GGUF.is_file():
        return PROFILE, ["--no-judge"]
    doc = yaml.safe_load(PROFILE.read_text())
    doc["gate"].setdefault("judge", {})["model_path"] = str(JUDGE_GGUF)
    path = STATE / "profiles" / "baseline.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path, []


def record_baseline(base: Srv, out: Path, timeout: float) -> dict[str, Any]:
    """`validation record-baseline` on the target-only server, with the profile (and the judge: baseline_profile)."""
    profile, extra = baseline_profile()
    cmd = [sys.executable, "-m", "sglfleet.validation", "record-baseline", "--target", base.url, "--out", str(out),
           "--config", str(profile), *extra]
    t = time.time()
    rec: dict[str, Any] = {"cmd": " ".join(cmd)}
    env = validation_env()
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # the judge's numpy: every core
        env.pop(k, None)
    try:
        r = subprocess.run(cmd, cwd=SRC, env=env, capture_output=True, text=True, timeout=timeout)
        rec.update(rc=r.returncode, tail=(r.stdout + r.stderr)[-4000:])
    except subprocess.TimeoutExpired as exc:
        rec.update(rc=None, timed_out=True, tail=_text(exc.stdout)[-2000:] + _text(exc.stderr)[-2000:])
    rec["wall_s"] = round(time.time() - t, 1)
    if out.is_file():
        rec["file"] = baseline_summary(out)
    return rec


def baseline_summary(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    doc = json.loads(raw)
    scores = doc.get("scores") or {}
    temps: dict[str, int] = {}
    for s in doc.get("samples") or []:
        temps[f"{s.get('temperature'):g}"] = temps.get(f"{s.get('temperature'):g}", 0) + 1
    return {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw), "model": doc.get("model"),
            "server_kind": doc.get("server_kind"), "answers_t0": len(doc.get("answers") or {}),
            "t0_with_logprobs": len(doc.get("logprobs") or {}), "samples_by_temperature": temps,
            "samples_with_ids": sum(1 for s in doc.get("samples") or [] if s.get("output_ids")),
            "samples_with_sampling": sum(1 for s in doc.get("samples") or [] if s.get("sampling")),
            "scores_answers": len(scores.get("logprobs") or {}) if isinstance(scores, dict) else 0,
            "scores_keys": sorted(k for k in scores if k != "logprobs") if isinstance(scores, dict) else []}


def _text(b: Any) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else str(b)


# ---------------------------------------------------------------------------------------------- the gate's report


def _num(x: Any) -> Any:
    """Six significant digits (p-values far below 1e-6 stay readable)."""
    return float(f"{x:.6g}") if isinstance(x, float) else x


def likelihood_numbers(case: dict[str, Any]) -> dict[str, Any]:
    """What the table shows of one likelihood@T case: the per-token test, the scorer trust, the answer-level
    statistics, the support check, the power statements."""
    d = case.get("details") or {}
    st = d.get("statistic") or {}
    tok = d.get("per_token") if isinstance(d.get("per_token"), dict) else None
    out: dict[str, Any] = {"ok": case.get("ok"), "p_value": _num(d.get("p_value")),
                           "reason": str(d.get("reason"))[:600], "n_candidate": d.get("n_candidate"),
                           "n_baseline": d.get("n_baseline"),
                           "on_ids": d.get("on_ids"), "alpha": _num(d.get("alpha")),
                           "per_token_recorded": "redacted" if d.get("per_token") == "***" else tok is not None}
    if tok is not None:
        keep = ("ok", "n_candidate", "n_baseline", "ks_d", "ks_p", "baseline_ks_d", "baseline_ks_p", "noise_allowance",
                "outside_candidate", "outside_baseline", "outside_p", "alpha_ks", "alpha_outside", "mean_u",
                "approximate_share", "reason", "mean_p", "mean_allowance", "baseline_mean_u", "alpha_mean",
                "answers", "dispersion", "baseline_dispersion", "dispersion_inflation", "dispersion_p",
                "alpha_dispersion", "edge_candidate", "edge_expected_candidate", "edge_baseline",
                "edge_expected_baseline", "edge_positions", "edge_p", "alpha_edge", "serial_candidate",
                "serial_baseline", "serial_pairs", "serial_z", "serial_p", "alpha_serial", "past_reach",
                "reach_margin", "farthest_reach", "baseline_farthest_reach", "cut_reach_bar")
        out["per_token"] = {k: _num(tok.get(k)) for k in keep}
        # per truncation [tokens, outside] (the pooled counts by cut); per threshold cut the reaches of the tokens
        # it leaves outside (the counts at any bar)
        for k in ("cut_candidate", "cut_baseline", "cut_reach_candidate", "cut_reach_baseline"):
            if isinstance(tok.get(k), dict):
                out["per_token"][k] = tok[k]
        if isinstance(tok.get("pooled"), dict):  # the statistics pooled over the temperatures (likelihood_pooled)
            out["per_token"]["pooled"] = {k: v if isinstance(v, dict) else _num(v) for k, v in tok["pooled"].items()}
        pw = tok.get("power") or {}
        out["per_token"]["power"] = {
            "estimated": pw.get("estimated", bool(pw.get("families"))), "target": pw.get("target"),
            "n_tokens": pw.get("n_tokens"), "min_rate_all_families": _num(pw.get("min_rate_all_families")),
            "families": {f: _num((v or {}).get("min_rate")) for f, v in (pw.get("families") or {}).items()},
            "min_mean_tv_all_families": _num(pw.get("min_mean_tv_all_families")),
            "unrefused_families": pw.get("unrefused_families"),
            "mean_tv_of_law": {f: _num((v or {}).get("mean_tv_of_law")) for f, v in (pw.get("families") or {}).items()}}
        both = pw.get("all_temperatures") or {}
        if both:
            out["per_token"]["power"]["all_temperatures"] = {
                "n_tokens": both.get("n_tokens"),
                "min_mean_tv_all_families": _num(both.get("min_mean_tv_all_families")),
                "families": {f: _num((v or {}).get("min_rate")) for f, v in (both.get("families") or {}).items()}}
    trust = st.get("scorer_trust")
    if isinstance(trust, dict):
        out["scorer_trust"] = {k: _num(v) for k, v in trust.items()}
    out["statistics"] = {n: {"z": _num((st.get(n) or {}).get("z")), "p": _num((st.get(n) or {}).get("p_value"))}
                         for n in ("mean_nll", "worst_window_nll", "pit_lag1") if isinstance(st.get(n), dict)}
    sup = d.get("support") or {}
    out["support"] = {"impossible": len(sup.get("impossible") or []), "min_log_p_T": _num(sup.get("min_log_p_T")),
                      "log_eps": _num(sup.get("log_eps")), "n_tokens": sup.get("n_tokens")}
    pw = d.get("power") or {}
    out["answer_power_min_rate"] = _num(pw.get("min_detectable_rate"))
    out["method"] = str(d.get("method"))[:400]
    return out


def lossless_numbers(case: dict[str, Any]) -> dict[str, Any]:
    d = case.get("details") or {}
    pp = d.get("per_prompt") or {}
    ra = d.get("reanchor") or {}
    return {"ok": case.get("ok"), "message": str(case.get("message"))[:700], "identical": d.get("identical"),
            "answers": len(pp), "near_ties": len(d.get("near_ties") or []), "reanchored": d.get("reanchored"),
            "diffs": [str(x)[:300] for x in d.get("diffs") or []][:8], "basis": str(d.get("basis"))[:300],
            "reanchor": {k: (str(v)[:300] if v is not None else None) for k, v in ra.items()},
            "per_prompt": {p: {k: (v.get(k) if k != "piece" else str(v.get(k))[:40])
                               for k in ("verdict", "char", "gap_nats", "reanchors", "piece")}
                           for p, v in pp.items()}}


def report_numbers(doc: dict[str, Any]) -> dict[str, Any]:
    """A gate's report.json reduced to what prodseq.json keeps."""
    summ = doc.get("summary") or {}
    cases = doc.get("cases") or []
    rec: dict[str, Any] = {
        "passed": doc.get("passed", summ.get("verdict") == "PASS"), "verdict": summ.get("verdict"),
        "summary": {k: summ.get(k) for k in ("requests", "request_errors", "failed_checks", "not_run_checks",
                                             "duration_s", "median_tokens_per_s", "spec", "skipped_checks",
                                             "verdict_mode", "companion_requests", "phase_s")},
        "failed": [{"name": c.get("name"), "message": str(c.get("message"))[:900]} for c in cases
                   if not c.get("ok") and not c.get("skipped")],
        "likelihood": {}, "lossless": None}
    for c in cases:
        name = str(c.get("name"))
        if name.startswith("likelihood@"):
            rec["likelihood"][name.split("@", 1)[1]] = {"skipped": c.get("skipped"), "not_run": c.get("not_run"),
                                                        "message": str(c.get("message"))[:900],
                                                        **likelihood_numbers(c)}
        elif name == "lossless_t0":
            rec["lossless"] = lossless_numbers(c)
    return rec


# ---------------------------------------------------------------------------------------------- the gates


class Ledger:
    """Every gate record of this machine's calls (STATE/gates.jsonl), so a later call goes on where one stopped."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        if path.is_file():
            self.records = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]

    def done(self) -> set[tuple[str, int]]:
        """(server, run) pairs that have a verdict (any exit code; not a timeout, not a gate never started)."""
        return {(r["server"], r["run"]) for r in self.records if r.get("rc") is not None}

    def add(self, rec: dict[str, Any]) -> None:
        with self.lock:
            self.records.append(rec)
            with open(self.path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")


def jobs_for(servers: list[Srv], runs: int, fault_runs: int, done: set[tuple[str, int]]) -> list[tuple[Srv, int]]:
    """Runs interleaved by round: every candidate's run 1, then run 2, ...; the broken builds stop at fault_runs."""
    out = []
    for r in range(1, max(runs, fault_runs) + 1):
        for s in servers:
            if (s.name, r) in done or r > (fault_runs if s.broken else runs):
                continue
            out.append((s, r))
    return out


def run_gate(s: Srv, r: int, baseline: Path, deadline: float, call: int, t0: float) -> dict[str, Any]:
    profile, seeds = run_profile(r)
    name = f"{s.name}-r{r:02d}"
    out = STATE / "gates" / name
    cmd = [sys.executable, "-m", "sglfleet.validation", "run", "--target", s.url, "--config", str(profile),
           "--baseline", str(baseline), "--out", str(out), "--no-judge"]
    rec: dict[str, Any] = {"name": name, "server": s.name, "role": s.role, "run": r, "seeds": seeds, "call": call,
                           "profile": str(profile.relative_to(SRC) if profile.is_relative_to(SRC) else profile),
                           "cmd": " ".join(cmd), "started_s": round(time.time() - t0, 1)}
    t = time.time()
    try:
        p = subprocess.run(cmd, cwd=SRC, env=validation_env(), capture_output=True, text=True,
                           timeout=max(10.0, deadline - time.time()))
        rec.update(rc=p.returncode, tail=(p.stdout + p.stderr)[-TAIL:])
    except subprocess.TimeoutExpired as exc:  # no verdict, never a pass; run again by a later call
        rec.update(rc=None, timed_out=True, tail=(_text(exc.stdout) + _text(exc.stderr))[-1500:])
    rec["wall_s"] = round(time.time() - t, 1)
    rep = out / "report.json"
    if rep.is_file() and rec.get("rc") is not None:
        try:
            rec.update(report_numbers(json.loads(rep.read_text())))
        except (ValueError, OSError) as exc:
            rec["report_error"] = repr(exc)[:300]
    return rec


def gate_all(servers: list[Srv], baseline: Path, ledger: Ledger, a: argparse.Namespace, t0: float, end: float,
             call: int, checkpoint: Any = None) -> dict[str, Any]:
    jobs = jobs_for([s for s in servers if s.role != "target-only" and s.up_s is not None], a.runs, a.fault_runs,
                    ledger.done())
    walls: list[float] = [g["wall_s"] for g in ledger.records if g.get("rc") is not None]
    lock = threading.Lock()
    queue = list(jobs)
    skipped: list[dict[str, Any]] = []

    def need() -> float:
        """The time a gate needs to finish: --min-gate-s until one has, then 1.1 x the longest of the first three
        or the 75th percentile of more."""
        with lock:
            if not walls:
                return a.min_gate_s
            w = sorted(walls)
            return max(a.min_gate_s, 1.1 * (w[-1] if len(w) < 3 else w[int(0.75 * (len(w) - 1))]))

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                s, r = queue.pop(0)
            left = end - time.time()
            if left < need():
                with lock:
                    skipped.append({"server": s.name, "run": r})
                continue
            try:
                rec = run_gate(s, r, baseline, end, call, t0)
            except Exception as exc:  # the driver's own fault: recorded as no verdict, the worker goes on
                rec = {"name": f"{s.name}-r{r:02d}", "server": s.name, "role": s.role, "run": r, "call": call,
                       "rc": None, "driver_error": repr(exc)[:500], "wall_s": 0.0}
            ledger.add(rec)
            with lock:
                if rec.get("rc") is not None:
                    walls.append(rec["wall_s"])
                if checkpoint is not None:  # $OUT/prodseq.json current even if the call is cut off
                    checkpoint()
            with contextlib.suppress(OSError):
                print(f"[{time.time() - t0:5.0f}s] {rec['name']}: rc={rec.get('rc')} {rec.get('verdict')} "
                      f"{[f['name'] for f in rec.get('failed', [])]} in {rec['wall_s']:.0f}s", flush=True)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, a.workers))]
    for th in threads:
        th.start()
        time.sleep(1.0)  # the gates' first requests spread out
    for th in threads:
        th.join()
    return {"jobs": len(jobs), "not_started": skipped}


# ---------------------------------------------------------------------------------------------- outputs


def _sizeof(tar_bytes: io.BytesIO) -> int:
    return len(tar_bytes.getvalue())


def pack_reports(names: list[str], limit: int = 14 * 2**20) -> None:
    """This call's report.json files in one archive: whole while they fit, else without their samples."""
    dirs = [STATE / "gates" / n for n in names if (STATE / "gates" / n / "report.json").is_file()]
    for strip in (False, True):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for d in dirs:
                raw = (d / "report.json").read_bytes()
                if strip:
                    doc = json.loads(raw)
                    doc["samples"] = f"stripped ({len(doc.get('samples') or [])} samples): the archive's size limit"
                    raw = json.dumps(doc).encode()
                info = tarfile.TarInfo(f"gates/{d.name}/report.json")
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
        if _sizeof(buf) <= limit:
            break
    (OUT / "prodseq-reports.tgz").write_bytes(buf.getvalue())


def pack_logs(servers: list[Srv]) -> None:
    """Each server's log: its first 4 kB, every error line, its last 12 kB."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for s in servers:
            text = log_tail(s.log, 10**9)
            errs = [ln for ln in text.splitlines() if ("Error" in ln or "Traceback" in ln or "error" in ln)
                    and "Ignore import error" not in ln][:200]
            body = (text[:4000] + "\n...\n[error lines]\n" + "\n".join(errs) + "\n...\n[tail]\n"
                    + text[-12000:]).encode()
            info = tarfile.TarInfo(f"logs/{s.name}.log")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    (OUT / "prodseq-logs.tgz").write_bytes(buf.getvalue())


def machine() -> str:
    try:
        return sm._machine()
    except Exception as exc:  # CPU dry runs: no torch / nvidia-smi
        return f"unknown ({type(exc).__name__})"


def write_doc(doc: dict[str, Any], ledger: Ledger) -> None:
    doc["gates"] = ledger.records
    doc["written"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (STATE / "prodseq.json").write_text(json.dumps(doc))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "prodseq.json").write_text(json.dumps(doc))


# ---------------------------------------------------------------------------------------------- the phases


def prepare(drafter: str | None) -> Path:
    """The sglang variants (patched, unpatched), the plugin wheels, the model configs; the plugin's dir."""
    for v in ("patched", "unpatched"):
        sm.build_variant(v)
    plug = Path("/tmp/ddtree-plug")
    if not (plug / ".installed").is_file():
        plug = sm.install_plugins()
        (plug / ".installed").write_text("ok")
    sys.path.insert(0, str(plug))  # sglang_ddtree: the cells' commands are checked with its rules
    sm.setup_model("smollm2", drafter)
    return plug


def wait_up(servers: list[Srv], until: float, on_up: Any = None) -> None:
    """Until every server is up or has failed, or `until`; each polled every round (so its up_s is when it came
    up); on_up() after each round."""
    while time.time() < until:
        pending = [s for s in servers if not s.poll_up() and not s.error]
        if on_up is not None:
            on_up()
        if not pending:
            return
        time.sleep(2)


def phase_warm(a: argparse.Namespace) -> int:
    """The JIT caches: the target-only server and three candidates with a dummy-weight drafter (the drafter is
    still training), up or out of time, then stopped."""
    t0 = time.time()
    plug = prepare(None)
    servers = [s for s in plan(dummy_drafter=True) if s.name in ("base", "chain", "b7-k4", "b16-k4")]
    for s in servers:
        s.name = f"warm-{s.name}"
        s.log = STATE / "logs" / f"{s.name}.log"
        s.start(plug)
        time.sleep(0.5)
    wait_up(servers, t0 + a.deadline)
    doc = {"phase": "warm", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
           "wall_s": round(time.time() - t0, 1), "servers": [s.record() for s in servers]}
    for s in servers:
        s.stop()
    pack_logs(servers)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "prodseq-warm.json").write_text(json.dumps(doc))
    (STATE / "warm.json").write_text(json.dumps(doc))
    print(json.dumps([(s.name, s.up_s, (s.error or "")[-300:]) for s in servers]), flush=True)
    return 0


def phase_gates(a: argparse.Namespace) -> int:
    t0 = time.time()
    end = t0 + a.deadline
    STATE.mkdir(parents=True, exist_ok=True)
    plug = prepare(a.drafter)
    state_file = STATE / "state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {"calls": []}
    call = len(state["calls"]) + 1
    ledger = Ledger(STATE / "gates.jsonl")
    baseline = STATE / "baseline.json"
    servers = plan(overlap=a.overlap)
    base = servers[0]
    cands = servers[1:]
    known = {r["name"]: r for r in state.get("servers", [])}
    started: list[str] = []
    for s in servers:
        k = known.get(s.name)
        if k and k.get("pid"):  # an earlier call's server: still serving?
            s.pid, s.up_s = k["pid"], k.get("up_s")
            if s.role != "target-only" and s.alive() and s.healthy():
                continue
            s.pid, s.up_s = None, None
            if k.get("error"):
                s.error = k["error"]
                continue
        if s.role == "target-only" and baseline.is_file():
            continue  # recorded by an earlier call; the target-only server stays stopped
        s.start(plug)
        started.append(s.name)
        time.sleep(0.5)
    print(f"[{time.time() - t0:5.0f}s] call {call}: started {started or 'none'}", flush=True)
    doc: dict[str, Any] = json.loads((STATE / "prodseq.json").read_text()) if (STATE / "prodseq.json").is_file() \
        else {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
              "commit": os.environ.get("PRODSEQ_COMMIT", "unknown"), "profile": str(PROFILE.relative_to(SRC)),
              "validation_src": str(SRC), "profile_text": PROFILE.read_text(), "grid": str(GRID.relative_to(ROOT)),
              "drafter": a.drafter, "faults": list(FAULTS), "runs_target": a.runs, "fault_runs": a.fault_runs,
              "calls": []}
    train = Path(a.drafter) / "train.json"
    if train.is_file():
        doc["drafter_train"] = json.loads(train.read_text())
    warm = STATE / "warm.json"
    if warm.is_file():
        doc["warm"] = json.loads(warm.read_text())
    this = {"call": call, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "deadline_s": a.deadline,
            "workers": a.workers, "started_servers": started, "command": " ".join(sys.argv)}
    doc["calls"].append(this)

    # the baseline: recorded as soon as the target-only server is up, beside the candidates' start
    rec_box: dict[str, Any] = {}

    def record_when_up() -> None:
        if base.pid is None or "future" in rec_box or not base.up_s:
            return
        rec_box["future"] = bg.submit(record_and_stop)

    def record_and_stop() -> dict[str, Any]:
        rec = {"at_s": round(time.time() - t0, 1), "server_up_s": base.up_s,
               **record_baseline(base, baseline, max(60.0, min(300.0, end - time.time() - 60)))}
        base.stop()
        rec["stopped_at_s"] = round(time.time() - t0, 1)
        rec["port_refuses_after_stop"] = not base.healthy(timeout=2)
        return rec

    with cf.ThreadPoolExecutor(1) as bg:
        wait_up(servers if base.pid is not None else cands, end - a.gate_reserve, record_when_up)
        if base.pid is not None and "future" not in rec_box:  # the target-only server never came up
            doc["baseline"] = {"rc": None, "tail": "target-only server not up: " + (base.error or log_tail(base.log))}
            base.stop()
        elif "future" in rec_box:
            doc["baseline"] = rec_box["future"].result()
    up = [s for s in cands if s.up_s is not None]
    this["servers_up_at_s"] = round(time.time() - t0, 1)
    this["servers_up"] = [s.name for s in up]
    print(f"[{time.time() - t0:5.0f}s] candidates up: {len(up)}/{len(cands)}; baseline "
          f"rc={(doc.get('baseline') or {}).get('rc')}", flush=True)
    state["servers"] = [s.record() for s in servers]
    state["calls"].append(this)
    state_file.write_text(json.dumps(state))
    doc["servers"] = state["servers"]
    write_doc(doc, ledger)
    if baseline.is_file() and base.alive():
        raise SystemExit("the target-only server is still alive: the production sequence gates without it")
    if baseline.is_file() and up:
        this.update(gate_all(servers, baseline, ledger, a, t0, end, call, lambda: write_doc(doc, ledger)))
    else:
        this["not_gated"] = "no baseline file" if not baseline.is_file() else "no candidate up"
    this["gates_done_at_s"] = round(time.time() - t0, 1)
    for s in cands:  # died while serving
        if s.up_s is not None and not s.alive():
            s.error = f"exited while serving: {log_tail(s.log, 1500)}"
    doc["servers"] = [s.record() for s in servers]
    state["servers"] = doc["servers"]
    state_file.write_text(json.dumps(state))
    this["wall_s"] = round(time.time() - t0, 1)
    write_doc(doc, ledger)
    pack_reports([g["name"] for g in ledger.records if g.get("call") == call])
    pack_logs(servers)
    if baseline.is_file():
        (OUT / "baseline.json.gz").write_bytes(gzip.compress(baseline.read_bytes()))
    if not a.keep:
        for s in cands:
            s.stop(wait=8)
    done = [g for g in ledger.records if g.get("rc") is not None]
    by: dict[str, list[str]] = {}
    for g in done:
        by.setdefault(g["server"], []).append("P" if g.get("passed") else "F")
    print(json.dumps({k: "".join(v) for k, v in by.items()}), flush=True)
    print(f"[{time.time() - t0:5.0f}s] call {call} done: {len(done)} gate verdicts so far; "
          f"median wall {statistics.median([g['wall_s'] for g in done]) if done else 0:.0f}s", flush=True)
    return 0


def phase_plan(a: argparse.Namespace) -> int:
    """CPU: the servers' commands and the gate jobs, printed; nothing started."""
    sm.MODEL.update(path="/tmp/smollm2", draft=a.drafter or "/tmp/smollm2-dflash", load=[], real=True)
    servers = plan(dummy_drafter=a.dummy, overlap=a.overlap)
    for s in servers:
        print(f"{s.name:32s} {s.role:11s} {s.variant or '-':9s} {' '.join(f'{k}={v}' for k, v in s.env.items())}")
        print("    " + " ".join(s.cmd()))
    jobs = jobs_for(servers[1:], a.runs, a.fault_runs, set())
    print(f"{len(jobs)} gate runs; first 12: {[f'{s.name}-r{r:02d}' for s, r in jobs[:12]]}")
    for r in (1, 2):
        p, seeds = run_profile(r)
        print(f"run {r}: {p} seeds {seeds}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("phase", choices=("warm", "gates", "plan"))
    ap.add_argument("--drafter", default="/tmp/smollm2-dflash",
                    help="python -m testbed.models train-drafter output dir")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds from the start: the last gate ends by it")
    ap.add_argument("--runs", type=int, default=20, help="gate runs of each correct build (all calls together)")
    ap.add_argument("--fault-runs", type=int, default=3, help="gate runs of each fault and of the unpatched build")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "10")), help="gates at once")
    ap.add_argument("--min-gate-s", type=float, default=250.0,
                    help="a gate starts only with this much time left (more once gates have finished: need()); "
                    "twelve gates at once took 255-282 s each at 25,000 permutations on the H100 (2026-12-06), "
                    "and 150 s let a first call start gates its limit then cut")
    ap.add_argument("--gate-reserve", type=float, default=200.0, help="seconds kept for the gates after the servers' "
                    "wait")
    ap.add_argument("--keep", action="store_true", help="leave the candidates serving for a later call")
    ap.add_argument("--dummy", action="store_true", help="plan: the warm phase's dummy-drafter commands")
    ap.add_argument("--overlap", action="store_true",
                    help="also gate DDTree under the overlap scheduler (PRODSEQ_OVERLAP_TREES, b16/k4 unset: correct "
                    "builds; PRODSEQ_OVERLAP_FAULTS: faults there); every call the same")
    a = ap.parse_args()
    if a.runs < 1 or a.fault_runs < 1 or a.workers < 1 or a.min_gate_s <= 0:
        print("error: --runs, --fault-runs, --workers must be >= 1 and --min-gate-s > 0", file=sys.stderr)
        return 2
    STATE.mkdir(parents=True, exist_ok=True)
    return {"warm": phase_warm, "gates": phase_gates, "plan": phase_plan}[a.phase](a)


if __name__ == "__main__":
    sys.exit(main())
