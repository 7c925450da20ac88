"""The pre-promotion gate: run the prompt suite against a target and judge every answer.

    result = run_gate("http://127.0.0.1:30000", load_gate_config("deploy.yaml"), out_dir="runs/gate")
    result.passed  -> bool; result.cases -> named checks; reports written into out_dir

Checks (each its own JUnit case, grouped by temperature where that applies):
  request_errors, finish_usage, <detector>@T<t> for every garbage detector, determinism_sequential,
  determinism_concurrent, variation_distinct, seed_reproducible, spec_accept_length, lossless_t0,
  throughput (recorded, informational); with `coherence.reference: baseline` also
  coherence_vs_baseline@T<t> for every T>0 (validation/coherence.py).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.client import ChatResult, OpenAIClient
from pipeline.errors import TargetError, UsageError
from pipeline.reports import Case, write_html, write_json, write_junit
from validation.coherence import (
    BaselineSample,
    baseline_samples_of,
    hot_temperatures,
    relative_coherence_cases,
    suite_seeds,
    uses_baseline,
)
from validation.config import GateConfig, gate_api_key, lossless_requirement, target_client
from validation.depth import long_copy_case, quality_case, speed_cases
from validation.detectors import DETECTORS, Finding, score_text
from validation.judge import FluencyJudge, judge_verdict, prepare_judge, threshold_for
from validation.lossless import (
    Comparison,
    Continuation,
    Continue,
    EncodedLogprobs,
    compare_answer,
    compare_path,
    control_reanchor,
    decode_logprobs,
    encode_logprobs,
    end_tokens_of,
    read_baseline,
)
from validation.spec import SpecReading, read_spec_metrics
from validation.suite import Prompt, Suite, load_suite


@dataclass
class Sample:
    """One generation and its verdicts."""

    prompt_id: str
    temperature: float
    seed: int | None
    purpose: str  # suite | determinism-seq | determinism-conc | variation | reproduce
    max_tokens: int
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float = 0.0
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    error: str | None = None
    findings: list[Finding] = field(default_factory=list)
    spec_accept_length: float | None = None
    draft_n: int | None = None
    draft_accepted: int | None = None
    category: str | None = None
    fluency: dict[str, Any] | None = None
    reference_own: str | None = None  # why the judge excused this T=0 answer's loop findings (judge_verdict)
    logprobs: EncodedLogprobs | None = None  # T=0 answers of a baseline being recorded (validation/lossless.py)

    @property
    def label(self) -> str:
        s = f"{self.prompt_id}@T{self.temperature:g}"
        return s + (f"/seed{self.seed}" if self.seed is not None and self.temperature > 0 else "")


@dataclass
class GateResult:
    target: str
    model: str
    server_kind: str
    passed: bool
    cases: list[Case]
    samples: list[Sample]
    summary: dict[str, Any]
    out_dir: Path | None = None

    @property
    def failed_cases(self) -> list[Case]:
        return [c for c in self.cases if not c.ok and not c.skipped]


def quote(text: str, limit: int = 160) -> str:
    t = text.replace("\n", "⏎")
    return repr(t[:limit] + ("…" if len(t) > limit else ""))


class Gate:
    """Runs the suite against one target with one config.

    `recording_baseline`: this target IS the baseline (`record-baseline`): with `coherence.reference:
    baseline` its T>0 answers are sampled with `coherence.seeds` and judged with zero tolerance (they are
    what is recorded), not compared against a baseline.
    """

    def __init__(self, target: str, cfg: GateConfig, console: Console | None = None,
                 recording_baseline: bool = False) -> None:
        self.cfg = cfg
        self.relative = uses_baseline(cfg) and not recording_baseline
        if self.relative and not cfg.lossless.baseline and not cfg.baseline_url:
            raise UsageError("coherence.reference is 'baseline' but there is no baseline to compare T>0 answers "
                             "against: record one from the non-speculative deployment with this profile (python -m "
                             "validation record-baseline --config PROFILE) and pass --baseline, or set baseline_url")
        self.baseline_samples: list[BaselineSample] | None = None
        self.api_key = gate_api_key(cfg)  # before any request; the key never reaches a report
        self.client = target_client(target, cfg, self.api_key)
        self.console = console or Console(stderr=True)
        self.suite: Suite = load_suite(cfg.suite)
        if cfg.judge.enabled:
            # one clear error naming what to install, before any request; the weight cache is made here (once)
            prepare_judge(cfg.judge)
        self.judge_s: float | None = None
        # record-baseline (and a live baseline) ask for T=0 log-probs: the lossless check's near-ties
        self.t0_logprobs: int | None = None
        self.baseline_logprobs: dict[str, list[Any]] = {}  # a live baseline's, filled by _baseline_answers
        # prompt -> the T=0 answer lossless_t0 proved to be the target's own greedy text (re-anchored to its end)
        # where the baseline's own answer is clean: T=0 detector hits on it are the model's, not the build's
        self.models_own: dict[str, str] = {}
        for pid in [*cfg.determinism.prompt_ids, *cfg.variation.prompt_ids]:
            try:
                self.suite.get(pid)
            except KeyError:
                raise UsageError(f"config names prompt '{pid}' which is not in suite {cfg.suite}") from None

    # ------------------------------------------------------------------ requests
    def _generate(self, p: Prompt, temperature: float, seed: int | None, purpose: str) -> Sample:
        cfg = self.cfg
        max_tokens = cfg.max_tokens or p.max_tokens
        s = Sample(p.id, temperature, seed, purpose, max_tokens, category=p.category)
        extra = dict(cfg.sampling.extra)
        if self.kind == "sglang":
            extra.setdefault("return_spec_tokens_details", True)
        try:
            r: ChatResult = self.client.chat(
                p.messages(), max_tokens=max_tokens, temperature=temperature,
                top_p=cfg.sampling.top_p if temperature > 0 else None,
                top_k=cfg.sampling.top_k if temperature > 0 else None,
                seed=seed, stream=True, extra=extra or None,
                top_logprobs=(self.t0_logprobs if temperature == 0 and purpose in ("suite", "baseline") else None)
                or (cfg.determinism.top_logprobs if temperature == 0 and cfg.determinism.enabled and p.id
                    in cfg.determinism.prompt_ids and purpose in ("suite", "determinism-seq", "determinism-conc")
                    else None),
            )
        except TargetError as exc:
            s.error = str(exc)
            return s
        s.text, s.finish_reason = r.text, r.finish_reason
        s.prompt_tokens, s.completion_tokens = r.prompt_tokens, r.completion_tokens
        s.latency_s, s.ttft_s, s.tokens_per_s = r.latency_s, r.ttft_s, r.tokens_per_s
        s.spec_accept_length = r.spec_accept_length
        timings = (r.raw.get("last_chunk") or {}).get("timings") or r.raw.get("timings") or {}
        if "draft_n" in timings:
            s.draft_n, s.draft_accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
        s.findings = score_text(s.text, cfg.thresholds)
        if r.logprobs is not None:
            s.logprobs = encode_logprobs(r.logprobs)
        return s

    def _run_all(self, jobs: list[tuple[Prompt, float, int | None, str]], progress: Progress, label: str,
                 workers: int | None = None) -> list[Sample]:
        task = progress.add_task(label, total=len(jobs))
        out: list[Sample] = []
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers or self.cfg.concurrency) as pool:
            for s in pool.map(lambda j: self._generate(*j), jobs):
                out.append(s)
                progress.advance(task)
                if not self.console.is_terminal:  # CI logs: one line per answer instead of a live bar
                    flags = ",".join(f.check for f in s.findings) or ("error" if s.error else "ok")
                    self.console.print(f"[{label}] {len(out)}/{len(jobs)} {s.label}: {s.completion_tokens} tokens "
                                       f"in {s.latency_s:.1f}s ({flags})", highlight=False, markup=False)
        if not self.console.is_terminal:
            self.console.print(f"[{label}] done in {time.perf_counter() - t0:.1f}s", highlight=False, markup=False)
        return out

    # ------------------------------------------------------------------ main
    def run(self) -> GateResult:
        cfg = self.cfg
        t_start = time.perf_counter()
        model = self.client.model  # raises TargetError when unreachable / not OpenAI / no model
        self.kind = self.client.server_kind()
        baseline_answers, source = None, ""
        if cfg.lossless.baseline:  # a wrong baseline file fails before any request; it is read once
            path = cfg.lossless.baseline
            doc = read_baseline(path, model, cfg.suite, cfg.max_tokens)
            if cfg.lossless.enabled:
                baseline_answers, source = baseline_answers_of(doc, path), path
                self.baseline_logprobs = baseline_logprobs_of(doc, path)
            if self.relative:
                self.baseline_samples = baseline_samples_of(doc, path, cfg)
        spec_before = read_spec_metrics(self.client, self.kind)
        samples: list[Sample] = []
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=False) as progress:
            jobs = [(p, t, seed, "suite") for t in cfg.temperatures for seed in suite_seeds(cfg, t)
                    for p in self.suite.prompts]
            samples += self._run_all(jobs, progress, "suite")
            if cfg.determinism.enabled:
                for pid in cfg.determinism.prompt_ids:
                    p = self.suite.get(pid)
                    seq = [(p, 0.0, cfg.seed, "determinism-seq")] * cfg.determinism.repeats
                    samples += self._run_all(seq, progress, f"determinism {pid} sequential", workers=1)
                    conc = [(p, 0.0, cfg.seed, "determinism-conc")] * cfg.determinism.concurrent
                    samples += self._run_all(conc, progress, f"determinism {pid} concurrent",
                                             workers=cfg.determinism.concurrent)
            if cfg.variation.enabled:
                v = cfg.variation
                jobs = [(self.suite.get(pid), v.temperature, s, "variation") for pid in v.prompt_ids for s in v.seeds]
                if v.check_seed_reproducible:
                    jobs += [(self.suite.get(pid), v.temperature, v.seeds[0], "reproduce") for pid in v.prompt_ids]
                samples += self._run_all(jobs, progress, "variation")
            if baseline_answers is None and cfg.baseline_url and cfg.lossless.enabled:
                baseline_answers, source = self._baseline_answers(progress), cfg.baseline_url
            if self.relative and self.baseline_samples is None:
                self.baseline_samples = self._baseline_hot_samples(progress)
        spec_after = read_spec_metrics(self.client, self.kind)
        lossless = None
        if baseline_answers is not None:  # before the detectors: T=0 hits on a proven target path are the model's
            comps, reanchor = self._lossless_paths(samples, baseline_answers)
            self.models_own = models_own_texts(samples, comps, baseline_answers, cfg)
            lossless = lossless_case(baseline_answers, cfg, source, comps, reanchor, self.baseline_logprobs)
        if cfg.judge.enabled:
            self.judge_s = judge_samples(samples, cfg, {p.id: p.prompt for p in self.suite.prompts}, self.console)
        cases = self._judge(samples, spec_before, spec_after)
        if lossless is not None:
            cases.insert(next(i for i, c in enumerate(cases) if c.name == "throughput"), lossless)
        else:
            spec = next(c for c in cases if c.name == "spec_accept_length")
            cases.append(lossless_missing_case(cfg, speculative=cfg.spec.enabled == "on" or not spec.skipped))
        cases += self._depth_cases()
        passed = all(c.ok or c.skipped for c in cases)
        ok_samples = [s for s in samples if not s.error]
        summary = {
            "verdict": "PASS" if passed else "FAIL",
            "target": self.client.base_url,
            "model": model,
            "server_kind": self.kind,
            "suite": f"{Path(cfg.suite).name} (v{self.suite.version})",
            "temperatures": cfg.temperatures,
            "requests": len(samples),
            "request_errors": sum(1 for s in samples if s.error),
            "checks": len(cases),
            "failed_checks": [c.name for c in cases if not c.ok and not c.skipped],
            "duration_s": round(time.perf_counter() - t_start, 2),
            "median_ttft_s": _median(s.ttft_s for s in ok_samples),
            "median_tokens_per_s": _median(s.tokens_per_s for s in ok_samples),
            "spec": spec_after.as_dict() if spec_after else None,
            "judge_s": round(self.judge_s, 2) if self.judge_s is not None else None,
            "skipped_checks": [{"name": c.name, "reason": c.message} for c in cases if c.skipped],
            "waivers": [c.details["waiver"] for c in cases if c.details.get("waiver")],
        }
        return GateResult(self.client.base_url, model, self.kind, passed, cases, samples, summary)

    # ------------------------------------------------------------------ judging
    def _seeds_ignored(self) -> str | None:
        return seeds_ignored_reason(self.kind, self.client.server_info() if self.kind == "sglang" else None)

    def _judge(self, samples: list[Sample], spec_before: SpecReading | None,
               spec_after: SpecReading | None) -> list[Case]:
        cfg = self.cfg
        cases: list[Case] = []
        errs = [s for s in samples if s.error]
        err_msg = "; ".join(f"{s.label}: {s.error}" for s in errs[:5])
        cases.append(Case("request_errors", "transport", not errs, err_msg or f"{len(samples)} requests ok",
                          {"errors": [asdict(s) for s in errs[:20]]}))
        good = [s for s in samples if not s.error]
        bad_fu = []
        for s in good:
            why = []
            if s.finish_reason not in cfg.allowed_finish_reasons:
                why.append(f"finish_reason={s.finish_reason!r}")
            if not s.completion_tokens:
                why.append(f"usage.completion_tokens={s.completion_tokens!r}")
            elif s.finish_reason == "length" and s.completion_tokens != s.max_tokens:
                why.append(f"finish_reason=length but {s.completion_tokens} tokens != max_tokens {s.max_tokens}")
            elif s.completion_tokens > s.max_tokens:
                why.append(f"{s.completion_tokens} tokens > max_tokens {s.max_tokens}")
            if not s.prompt_tokens:
                why.append(f"usage.prompt_tokens={s.prompt_tokens!r}")
            if why:
                bad_fu.append(f"{s.label}: {', '.join(why)}")
        cases.append(Case("finish_usage", "sanity", not bad_fu, "; ".join(bad_fu[:8]) or "finish_reason and usage sane",
                          {"problems": bad_fu}))
        # Garbage detectors, one case per detector and temperature over every sample at that temperature.
        temps = sorted({s.temperature for s in good})
        relative: list[Case] = []
        hot = hot_temperatures(cfg)
        if self.relative:
            assert self.baseline_samples is not None
            relative = relative_coherence_cases(good, self.baseline_samples, cfg)
            temps = sorted({*temps, *hot})
        for t in temps:
            at_t = [s for s in good if s.temperature == t]
            if self.relative and t in hot:  # counted against the baseline (validation/coherence.py)
                cases += [c for c in relative if c.name.endswith(f"@T{t:g}")]
                cases.append(fluency_case(at_t, t, cfg))
                continue
            for det in DETECTORS:
                if det in cfg.thresholds.disabled:
                    cases.append(Case(f"{det}@T{t:g}", "coherence", True, "disabled by config", skipped=True))
                    continue
                hits = [(s, f) for s in at_t for f in s.findings if f.check == det]
                own = [(s, f) for s, f in hits if t == 0 and self._models_own(s)]
                ref_own = [(s, f) for s, f in hits if s.reference_own and (s, f) not in own]
                hits = [h for h in hits if h not in own and h not in ref_own]
                msg = "; ".join(f"{s.label}: {f.reason} — {f.excerpt or quote(s.text)}" for s, f in hits[:6])
                if own:
                    msg = "; ".join(filter(None, [msg, f"{len(own)} hit(s) on answers proven to be the target's own "
                                                       "greedy text (lossless_t0 re-anchored them to their end), "
                                                       "the model's, not the build's: " + "; ".join(
                                                           f"{s.label}: {f.reason}" for s, f in own[:3])]))
                if ref_own:
                    msg = "; ".join(filter(None, [msg, f"{len(ref_own)} loop(s) excused, {ref_own[0][0].reference_own}"
                                                       ": " + "; ".join(f"{s.label}: {f.reason}"
                                                                        for s, f in ref_own[:3])]))
                cases.append(Case(f"{det}@T{t:g}", "coherence", not hits,
                                  msg or f"{len(at_t)} answers clean",
                                  {"offending": [{"sample": s.label, "reason": f.reason, "excerpt": f.excerpt,
                                                  "text": s.text[:2000]} for s, f in hits],
                                   "models_own": [{"sample": s.label, "reason": f.reason, "excerpt": f.excerpt,
                                                   "text": s.text[:2000]} for s, f in own],
                                   "reference_own": [{"sample": s.label, "reason": f.reason, "why": s.reference_own,
                                                      "text": s.text[:2000]} for s, f in ref_own]}))
            cases.append(fluency_case(at_t, t, cfg))
        if not cfg.determinism.enabled:
            for name in ("determinism_sequential", "determinism_concurrent"):
                cases.append(Case(name, "determinism", True, "disabled by config (determinism.enabled: false)",
                                  skipped=True))
        if not cfg.variation.enabled:
            for name in ("variation_distinct", "seed_reproducible"):
                cases.append(Case(name, "variation", True, "disabled by config (variation.enabled: false)",
                                  skipped=True))
        elif not cfg.variation.check_seed_reproducible:
            cases.append(Case("seed_reproducible", "variation", True,
                              "disabled by config (variation.check_seed_reproducible: false)", skipped=True))
        if cfg.determinism.enabled:
            for purpose, name in (("determinism-seq", "determinism_sequential"),
                                  ("determinism-conc", "determinism_concurrent")):
                msgs, ok = [], True
                for pid in cfg.determinism.prompt_ids:
                    texts = [s.text for s in good if s.purpose == purpose and s.prompt_id == pid]
                    base = [s.text for s in good if s.purpose == "suite" and s.prompt_id == pid and s.temperature == 0]
                    texts = base + texts
                    distinct = list(dict.fromkeys(texts))
                    if len(texts) < 2:
                        ok = False
                        msgs.append(f"{pid}: too few successful repeats")
                    elif len(distinct) > 1:
                        ok = False
                        msgs.append(f"{pid}: {len(distinct)} different T=0 answers in {len(texts)}: "
                                    + " vs ".join(quote(d, 80) for d in distinct[:3]))
                cases.append(Case(name, "determinism", ok, "; ".join(msgs) or "identical T=0 answers"))
        if cfg.variation.enabled:
            v = cfg.variation
            msgs, ok = [], True
            for pid in v.prompt_ids:
                texts = [s.text for s in good if s.purpose == "variation" and s.prompt_id == pid]
                if len(set(texts)) < v.min_distinct:
                    ok = False
                    msgs.append(f"{pid}: only {len(set(texts))} distinct answers from seeds {v.seeds} "
                                f"at T={v.temperature}")
            cases.append(Case("variation_distinct", "variation", ok, "; ".join(msgs) or "seeds give different answers"))
            ignored = self._seeds_ignored() if v.check_seed_reproducible else None
            if ignored:
                cases.append(Case("seed_reproducible", "variation", True, ignored, skipped=True))
            elif v.check_seed_reproducible:
                msgs, ok = [], True
                for pid in v.prompt_ids:
                    first = [s.text for s in good if s.purpose == "variation" and s.prompt_id == pid
                             and s.seed == v.seeds[0]]
                    again = [s.text for s in good if s.purpose == "reproduce" and s.prompt_id == pid]
                    if not first or not again or first[0] != again[0]:
                        ok = False
                        msgs.append(f"{pid}: same seed {v.seeds[0]} gave different answers: "
                                    + " vs ".join(quote(t, 80) for t in first[:1] + again[:1]))
                cases.append(Case("seed_reproducible", "variation", ok, "; ".join(msgs) or "same seed, same answer"))
        cases.append(self._spec_case(good, spec_before, spec_after))
        tps = [s.tokens_per_s for s in good if s.tokens_per_s]
        ttft = [s.ttft_s for s in good if s.ttft_s is not None]
        cases.append(Case("throughput", "performance", True,
                          f"median TTFT {_fmt(_median(ttft))} s, median decode {_fmt(_median(tps))} tok/s over "
                          f"{len(good)} requests (recorded, not gated)",
                          {"ttft_s": ttft, "tokens_per_s": tps}))
        return cases

    def _models_own(self, s: Sample) -> bool:
        return self.models_own.get(s.prompt_id) == s.text

    def _reanchor_fn(self) -> tuple[Continue | None, str]:
        """The target-only continuation the lossless check re-anchors near-ties on, or why there is none."""
        cfg = self.cfg
        url = cfg.lossless.reanchor_url or cfg.baseline_url
        if not url:
            return None, "no lossless.reanchor_url or baseline_url to re-anchor on"
        try:
            base = self._same_model_client(url, "re-anchor server")
        except TargetError as exc:
            return None, f"re-anchor server {url} unreachable: {exc}"
        prompts = {p.id: p for p in self.suite.prompts}

        def cont(pid: str, prefix: str) -> Continuation:
            p = prompts[pid]
            r = base.chat([*p.messages(), {"role": "assistant", "content": prefix}],
                          max_tokens=cfg.max_tokens or p.max_tokens, temperature=0.0, seed=cfg.seed, stream=True,
                          extra={"continue_final_message": True},
                          top_logprobs=cfg.lossless.top_logprobs)
            return Continuation(r.text, r.logprobs, r.finish_reason)

        return cont, url

    def _lossless_paths(self, samples: list[Sample], ref: dict[str, str]) -> tuple[dict[str, Comparison], dict]:
        """Every T=0 suite answer compared with the baseline's, re-anchored at near-ties where a target-only
        server can continue (validation/lossless.py); the control runs once, on the near-tie prompt with the
        longest recorded baseline answer."""
        cfg = self.cfg
        mine = _t0_suite(samples)
        lps = self.baseline_logprobs
        tol = cfg.lossless.near_tie_nats
        ends = end_tokens_of([(lps[pid], text) for pid, text in ref.items() if lps.get(pid)])
        first = {pid: compare_answer(mine[pid].text if pid in mine else None, text, lps.get(pid), tol,
                                     ends if pid in mine and mine[pid].finish_reason == "stop" else frozenset())
                 for pid, text in ref.items()}
        tied = [pid for pid, c in first.items() if c.verdict == "near_tie" and not c.ended]
        info: dict[str, Any] = {"url": None, "control": None, "off": None}
        cont: Continue | None = None
        if tied and cfg.lossless.max_reanchors > 0:
            cont, where = self._reanchor_fn()
            if cont is None:
                info["off"] = where
            else:
                info["url"] = where
                # the control runs on the near-tie prompt whose baseline answer has the most recorded tokens
                pid = max(tied, key=lambda q: (len(lps.get(q) or []), q))
                self.console.print(f"[lossless] {len(tied)} near-tie(s): re-anchoring on {where} (control: {pid})",
                                   highlight=False, markup=False)
                bad = control_reanchor(pid, ref[pid], lps[pid], cont, tol)
                info["control"] = bad or f"{pid}: the baseline's answer continued from its middle gives its own rest"
                if bad:
                    cont, info["off"] = None, bad
        elif tied:
            info["off"] = "lossless.max_reanchors is 0"
        comps = {pid: (compare_path(pid, mine[pid].text, mine[pid].finish_reason, ref[pid], lps.get(pid), tol, cont,
                                    cfg.lossless.max_reanchors, info["off"] or "", ends)
                       if c.verdict == "near_tie" else c) for pid, c in first.items()}
        return comps, info

    def _baseline_client(self) -> OpenAIClient:
        assert self.cfg.baseline_url
        return self._same_model_client(self.cfg.baseline_url, "baseline")

    def _same_model_client(self, url: str, role: str) -> OpenAIClient:
        """A client of another deployment of the target's model (the baseline, the re-anchor server); UsageError
        when it serves another model, TargetError when it cannot be reached."""
        base = target_client(url, self.cfg, self.api_key)
        if base.model != self.client.model:
            raise UsageError(f"{role} {url} serves {base.model!r}, target serves {self.client.model!r}: they must "
                             "serve the same model")
        return base

    def _baseline_answers(self, progress: Progress) -> dict[str, str]:
        """T=0 suite answers of the live baseline deployment."""
        base = self._baseline_client()
        saved, self.client = self.client, base
        saved_lp, self.t0_logprobs = self.t0_logprobs, self.cfg.lossless.top_logprobs
        try:
            got = self._run_all([(p, 0.0, self.cfg.seed, "baseline") for p in self.suite.prompts], progress,
                                "baseline T=0")
        finally:
            self.client, self.t0_logprobs = saved, saved_lp
        errs = [s for s in got if s.error]
        if errs:
            raise TargetError(f"baseline {self.cfg.baseline_url} failed: {errs[0].error}")
        self.baseline_logprobs = {s.prompt_id: decode_logprobs(s.logprobs) for s in got if s.logprobs}
        return {s.prompt_id: s.text for s in got}

    def _baseline_hot_samples(self, progress: Progress) -> list[BaselineSample]:
        """T>0 suite answers of the live baseline deployment, with the seeds the candidate used."""
        base = self._baseline_client()
        cfg = self.cfg
        saved, self.client = self.client, base
        try:
            got = self._run_all([(p, t, seed, "suite") for t in hot_temperatures(cfg) for seed in suite_seeds(cfg, t)
                                 for p in self.suite.prompts], progress, "baseline T>0")
        finally:
            self.client = saved
        errs = [s for s in got if s.error]
        if errs:
            raise TargetError(f"baseline {cfg.baseline_url} failed: {errs[0].error}")
        return [BaselineSample(s.prompt_id, s.temperature, s.seed, s.text) for s in got]

    def _depth_cases(self) -> list[Case]:
        cfg = self.cfg
        cases: list[Case] = []
        if cfg.quality.enabled:
            self.console.print("[depth] quality smoke set", highlight=False, markup=False)
            cases.append(quality_case(self.client, cfg.quality, cfg.concurrency))
        else:
            cases.append(Case("quality_accuracy", "quality", True, "disabled by config (quality.enabled: false)",
                              skipped=True))
        if cfg.long_copy.enabled:
            self.console.print(f"[depth] long-context copy ({cfg.long_copy.passage_words} words)", highlight=False,
                               markup=False)
            cases.append(long_copy_case(self.client, cfg.long_copy))
        else:
            cases.append(Case("long_copy", "long_context", True, "disabled by config (long_copy.enabled: false)",
                              skipped=True))
        if cfg.baseline_url:
            self.console.print(f"[depth] speed against baseline {cfg.baseline_url}", highlight=False, markup=False)
            cases += speed_cases(self.client, self._baseline_client(), cfg.speed)
        else:
            cases.append(Case("speed_vs_baseline", "speed", True, "no baseline_url configured: nothing to compare "
                              "tok/s against", skipped=True))
        return cases

    def _spec_case(self, good: list[Sample], before: SpecReading | None, after: SpecReading | None) -> Case:
        cfg = self.cfg.spec
        per_req = [s.spec_accept_length for s in good if s.spec_accept_length is not None]
        drafted = [(s.completion_tokens or 0, s.draft_accepted or 0) for s in good if s.draft_n]
        lengths = list(per_req)
        for toks, acc in drafted:
            steps = toks - acc
            if steps > 0:
                lengths.append(toks / steps)
        server_len = after.accept_length if after else None
        reported = bool(lengths) or server_len is not None
        if cfg.enabled == "off" or (cfg.enabled == "auto" and not reported):
            return Case("spec_accept_length", "speculative", True,
                        "server reports no speculative decoding" if not reported else "disabled", skipped=True)
        if not reported:
            return Case("spec_accept_length", "speculative", False,
                        "spec.enabled=on but the server reports no accept length (responses, /server_info, /metrics)")
        mean = statistics.fmean(lengths) if lengths else server_len
        assert mean is not None
        rate = None
        if drafted:
            total_draft = sum(s.draft_n or 0 for s in good)
            rate = sum(a for _, a in drafted) / total_draft if total_draft else 0.0
        ok = mean >= cfg.min_accept_length and (rate is None or rate >= cfg.min_accept_rate)
        msg = (f"mean accept length {mean:.2f} tokens/step (floor {cfg.min_accept_length})"
               + (f", draft accept rate {rate:.0%} (floor {cfg.min_accept_rate:.0%})" if rate is not None else "")
               + (f", server {server_len:.2f}" if server_len is not None else ""))
        dist = {"min": min(lengths), "p50": statistics.median(lengths), "max": max(lengths)} if lengths else {}
        return Case("spec_accept_length", "speculative", ok, msg,
                    {"per_request": lengths, "distribution": dist, "server": after.as_dict() if after else None,
                     "server_before": before.as_dict() if before else None})


def load_baseline(path: str, model: str, cfg: GateConfig) -> dict[str, str]:
    """Answers recorded by `record-baseline`, checked against the target's model and the suite."""
    return baseline_answers_of(read_baseline(path, model, cfg.suite, cfg.max_tokens), path)


def load_baseline_logprobs(path: str, cfg: GateConfig) -> dict[str, list[Any]]:
    """The T=0 answers' token log-probs `record-baseline` kept ({} for a file recorded without them)."""
    return baseline_logprobs_of(read_baseline(path, None, cfg.suite, cfg.max_tokens), path)


def baseline_answers_of(doc: dict[str, Any], path: str) -> dict[str, str]:
    """The T=0 answers of a baseline document read by lossless.read_baseline."""
    answers = doc.get("answers")
    if not isinstance(answers, dict):
        raise UsageError(f"cannot read baseline {path}: no answers")
    return dict(answers)


def baseline_logprobs_of(doc: dict[str, Any], path: str) -> dict[str, list[Any]]:
    """The decoded T=0 log-probs of a baseline document read by lossless.read_baseline ({} without any)."""
    raw = doc.get("logprobs") or {}
    try:
        return {pid: decode_logprobs(rows) for pid, rows in raw.items()}
    except (ValueError, AttributeError) as exc:
        raise UsageError(f"cannot read the log-probs of baseline {path}: {exc}") from None


def seeds_ignored_reason(kind: str | None, server_info: dict[str, Any] | None) -> str | None:
    """Why a server cannot honour a request's seed, or None. SGLang 0.5.23 builds per-request
    sampling seeds only with --enable-deterministic-inference (sampling_batch_info.py: the seed
    tensor is None otherwise); /server_info reports the flag (top level or internal_states)."""
    if kind != "sglang" or not server_info:
        return None
    states = [server_info, *[x for x in server_info.get("internal_states") or [] if isinstance(x, dict)]]
    flags = [st["enable_deterministic_inference"] for st in states if "enable_deterministic_inference" in st]
    if flags and not any(flags):
        return ("not applicable: this SGLang server runs without --enable-deterministic-inference, so it ignores "
                "request seeds (sglang builds no per-request seed tensor then); same-seed answers may differ")
    return None


def lossless_missing_case(cfg: GateConfig, speculative: bool) -> Case:
    """lossless_t0 when there is nothing to compare against: skipped with its reason, waived, or failed.

    A speculative deployment is never promoted without the lossless check unless its config waives it
    explicitly (`lossless.waiver: "<reason>"`); the waiver is shown in every report.
    """
    problem = lossless_requirement(cfg, speculative)
    if problem:
        return Case("lossless_t0", "speculative", False, problem, {"speculative": True})
    if speculative and cfg.lossless.waiver:
        return Case("lossless_t0", "speculative", True, f"WAIVED by config (lossless.waiver): {cfg.lossless.waiver}",
                    {"waiver": {"check": "lossless_t0", "reason": cfg.lossless.waiver}}, skipped=True)
    if not cfg.lossless.enabled:
        return Case("lossless_t0", "speculative", True, "disabled by config (lossless.enabled: false); the deployment "
                    "is not speculative", skipped=True)
    return Case("lossless_t0", "speculative", True, "no baseline (lossless.baseline / --baseline / baseline_url) and "
                "the deployment is not speculative: nothing to compare T=0 answers against", skipped=True)


def _t0_suite(samples: list[Sample]) -> dict[str, Sample]:
    """The T=0 suite answer of each prompt (the one lossless_t0 compares)."""
    return {s.prompt_id: s for s in samples if not s.error and s.purpose == "suite" and s.temperature == 0}


def models_own_texts(samples: list[Sample], comps: dict[str, Comparison], ref: dict[str, str],
                     cfg: GateConfig) -> dict[str, str]:
    """Prompt -> the T=0 answer re-anchored to its end (the target's own greedy text), where the baseline's
    own answer to that prompt is clean: a detector hit on it is the model's, not the build's."""
    mine = _t0_suite(samples)
    return {pid: mine[pid].text for pid, c in comps.items()
            if c.verdict == "reanchored" and pid in mine and not score_text(ref[pid], cfg.thresholds)}


def lossless_case(ref: dict[str, str], cfg: GateConfig, source: str, comps: dict[str, Comparison],
                  reanchor: dict[str, Any], ref_logprobs: dict[str, list[Any]] | None = None) -> Case:
    """T=0 answers must equal those of the non-speculative deployment (file or live), up to near-ties
    of the baseline where its token log-probs were recorded, each re-anchored on a target-only server
    where one can continue (`comps` and `reanchor` from Gate._lossless_paths; validation/lossless.py)."""
    lps = ref_logprobs or {}
    tol = cfg.lossless.near_tie_nats
    diffs = [f"{pid}: {c.detail}" for pid, c in comps.items() if not c.ok]
    ties = [f"{pid}: {c.detail}" for pid, c in comps.items() if c.verdict in ("near_tie", "reanchored")]
    identical = sum(1 for c in comps.values() if c.verdict == "identical")
    whole = sum(1 for c in comps.values() if c.verdict == "reanchored")
    same = 1 - len(diffs) / max(1, len(ref))
    ok = not diffs if cfg.lossless.require_identical else same >= cfg.lossless.min_identical_fraction
    basis = (f"near-ties up to {tol:g} nats from the baseline's log-probs ({len(lps)} of {len(ref)} answers "
             "recorded with them)" if lps and tol > 0 else "exact comparison (no recorded log-probs)")
    ra = reanchor
    if ties and ra.get("url") and not ra.get("off"):
        basis += f"; re-anchored on {ra['url']}"
    elif ties and ra.get("off"):
        basis += f"; not re-anchored: {ra['off']}"
    msg = "; ".join(diffs[:5]) if diffs else (
        f"{identical} of {len(ref)} T=0 answers identical to the baseline, {len(ties)} differ from a near-tie on"
        + (f" ({whole} of them re-anchored to their end: the target's own greedy text)" if ties else "")
        + f" ({source}; {basis})")
    return Case("lossless_t0", "speculative", ok, msg,
                {"identical_fraction": same, "identical": identical, "near_ties": ties, "diffs": diffs,
                 "baseline": source, "basis": basis, "reanchored": whole, "reanchor": ra,
                 "per_prompt": {pid: {"verdict": c.verdict, "char": c.char, "token": c.token, "gap_nats": c.gap_nats,
                                      "reanchors": c.reanchors} for pid, c in comps.items()}})


def judge_samples(samples: list[Sample], cfg: GateConfig, prompts: dict[str, str], console: Console) -> float:
    """Score every distinct answer with the fluency judge; failing ones get a `fluency` finding.
    Returns the judge's busy time (server start, forward passes, projection) in seconds."""
    jc = cfg.judge
    todo: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        if not s.error and s.text.strip():
            todo.setdefault((s.prompt_id, s.text), []).append(s)
    t0 = time.perf_counter()
    with FluencyJudge(jc) as judge:
        for (pid, text), group in todo.items():
            sc = judge.score(text, prompts.get(pid))
            limit = threshold_for(jc, group[0].category)
            d = {**sc.as_dict(), "limit": limit}
            for s in group:
                s.fluency = d
                v = judge_verdict(s.findings, sc, limit, jc, s.temperature)
                if v.excuse:  # kept on the sample; the detector cases report them as excused, not as hits
                    s.reference_own = v.excuse
                    s.findings = v.excused
                else:
                    s.findings = v.findings
        busy = judge.busy_s
    console.print(f"[judge] {len(todo)} distinct answers judged in {time.perf_counter() - t0:.1f}s "
                  f"(busy {busy:.1f}s)", highlight=False, markup=False)
    return time.perf_counter() - t0


def fluency_case(at_t: list[Sample], t: float, cfg: GateConfig) -> Case:
    name = f"fluency@T{t:g}"
    if not cfg.judge.enabled:
        return Case(name, "coherence", True, "disabled by config (judge.enabled: false)", skipped=True)
    hits = [(s, f) for s in at_t for f in s.findings if f.check == "fluency"]
    short = sum(1 for s in at_t if s.fluency and s.fluency.get("judged", 0) < cfg.judge.min_tokens)
    msg = "; ".join(f"{s.label}: {f.reason} — {f.excerpt!r}" for s, f in hits[:6])
    return Case(name, "coherence", not hits,
                msg or f"{len(at_t)} answers judged fluent" + (f" ({short} too short to judge)" if short else ""),
                {"offending": [{"sample": s.label, "reason": f.reason, "excerpt": f.excerpt, "text": s.text[:2000]}
                               for s, f in hits],
                 "scores": {s.label: s.fluency for s in at_t}})


def _median(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return round(statistics.median(v), 4) if v else None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def write_reports(result: GateResult, out_dir: str | Path, cfg: GateConfig) -> dict[str, Path]:
    """report.json, junit.xml, report.html (+ samples.jsonl) in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result.out_dir = out
    samples = [{**asdict(s), "findings": [asdict(f) for f in s.findings]} for s in result.samples]
    paths = {
        "json": write_json(out / "report.json", {"summary": result.summary, "config": cfg.model_dump(mode="json"),
                                                  "cases": result.cases, "samples": samples}),
        "junit": write_junit(out / "junit.xml", "validation", result.cases),
        "html": write_html(out / "report.html", f"Validation gate — {result.model}", verdict=result.summary["verdict"],
                           summary={k: v for k, v in result.summary.items() if k != "spec"}, cases=result.cases,
                           tables=[("Answers at each temperature", ["prompt", "T", "tokens", "tok/s", "findings",
                                                                    "text"],
                                    [[s.prompt_id, s.temperature, s.completion_tokens, _fmt(s.tokens_per_s),
                                      ", ".join(f.check for f in s.findings) or "-", s.text[:300]]
                                     for s in result.samples if s.purpose == "suite"])]),
    }
    with open(out / "samples.jsonl", "w", encoding="utf-8") as fh:
        for s in samples:
            fh.write(json.dumps(s) + "\n")
    return paths


def print_summary(result: GateResult, console: Console) -> None:
    from rich.table import Table

    table = Table(title=f"gate {result.summary['verdict']} — {result.model} @ {result.target}", show_lines=False)
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for c in result.cases:
        res = "[dim]skip[/]" if c.skipped else ("[green]pass[/]" if c.ok else "[bold red]FAIL[/]")
        table.add_row(c.name, res, c.message if not c.ok or c.skipped else c.message[:100])
    console.print(table)


def run_gate(target: str, cfg: GateConfig, out_dir: str | Path | None = None,
             console: Console | None = None, on_result: Callable[[GateResult], None] | None = None) -> GateResult:
    """Run the gate, write reports when out_dir is given, print the summary table."""
    console = console or Console(stderr=True)
    result = Gate(target, cfg, console).run()
    if out_dir is not None:
        write_reports(result, out_dir, cfg)
    print_summary(result, console)
    if on_result:
        on_result(result)
    return result
