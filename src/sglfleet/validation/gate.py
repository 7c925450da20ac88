"""The pre-promotion gate: run the prompt suite against a target, then every registered check over the answers.

    result = run_gate("http://127.0.0.1:30000", load_gate_config("deploy.yaml"), out_dir="runs/gate")
    result.passed  -> bool; result.cases -> named checks; reports written into out_dir

The Gate sends the requests (the suite at every temperature, determinism repeats, seed variation, the
target-only baseline's answers where one is live), measures what needs more requests (lossless re-anchoring,
the target's likelihood of every T>0 answer, quality, long copy, speed) and hands it all to the registry of
checks (validation/checks.py), which decides. The verdict comes from the target itself where a target-only
baseline is available (oracle mode: lossless_t0 at T=0, likelihood@T at T>0), else from the detectors and
the fluency judge (the weaker mode, labelled in every report); the backstop is zero tolerance in both.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sglfleet.pipeline.client import ChatResult, OpenAIClient
from sglfleet.pipeline.errors import TargetError, UsageError
from sglfleet.pipeline.reports import Case, write_html, write_json, write_junit
from sglfleet.textscore.backstop import Backstop
from sglfleet.textscore.detectors import score_text
from sglfleet.textscore.judge import FluencyJudge, judge_verdict, prepare_judge, threshold_for
from sglfleet.validation.baseline import BaselineSample, hot_temperatures
from sglfleet.validation.baseline import samples_of as baseline_samples_of
from sglfleet.validation.checks import GateContext, LosslessData, run_checks
from sglfleet.validation.config import GateConfig, gate_api_key, target_client
from sglfleet.validation.depth import long_copy_case, quality_case, speed_cases
from sglfleet.validation.likelihood import (
    Answer,
    answer_seed,
    check_trust,
    design_problem,
    likelihood_verdicts,
)
from sglfleet.validation.lossless import (  # noqa: F401  (re-exported)
    Comparison,
    Continuation,
    Continue,
    PlaceAt,
    compare_answer,
    compare_forced,
    compare_path,
    control_reanchor,
    decode_logprobs,
    encode_logprobs,
    end_tokens_of,
    lossless_case,
    lossless_missing_case,
    near_tie_rule,
    place_at,
    read_baseline,
    token_bytes,
)
from sglfleet.validation.samples import Sample, quote  # noqa: F401  (quote: re-exported)
from sglfleet.validation.scorers import check_recorded_scores, ended_at_end_of_turn, make_scorer
from sglfleet.validation.spec import read_spec_metrics
from sglfleet.validation.suite import Prompt, Suite, load_suite


@dataclass(frozen=True)
class _LikelihoodPlan:
    scorer: Any  # validation.scorers.Scorer
    baseline: list[BaselineSample] | None  # recorded T>0 answers; None: sampled live from baseline_url
    # the candidate scores itself (its non-speculative prefill; no live target-only server): trusted only after
    # it reproduces these recorded log-probs of the baseline's answers (likelihood.check_trust)
    trust: dict[str, list[float]] | None = None


@dataclass(frozen=True)
class GateSummary:
    """The gate's verdict and what decided it: report.json's `summary`, the console table's title, what the
    deploy flow reads (flow/promote.py gate_stage). One type, read by attribute; `as_dict()` for the reports."""

    verdict: str  # PASS | FAIL
    target: str
    model: str
    server_kind: str
    suite: str
    temperatures: list[float]
    verdict_mode: dict[str, str]  # T<t> -> who decided at that temperature (oracle or the weaker detectors mode)
    requests: int
    request_errors: int
    checks: int
    failed_checks: list[str]
    not_run_checks: list[dict[str, str]]
    duration_s: float
    median_ttft_s: float | None
    median_tokens_per_s: float | None
    spec: dict[str, Any] | None  # the server's speculative metrics after the gate (validation/spec.py)
    judge_s: float | None
    skipped_checks: list[dict[str, str]]
    waivers: list[dict[str, Any]]
    companion_requests: int = 0  # greedy requests kept in flight beside the suite (sampling.companions), not judged
    # where the gate's time went, in seconds: requests (the suite, determinism, variation), baseline (a live
    # baseline's answers), likelihood (scoring both sides under the target, the tests, the power statement),
    # lossless (lossless_t0's paths: re-anchoring and placement), judge, checks; the rest of duration_s is
    # set-up (the baseline file, the server's metrics)
    phase_s: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    @property
    def accept_length(self) -> float | None:
        return (self.spec or {}).get("accept_length")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GateResult:
    target: str
    model: str
    server_kind: str
    passed: bool
    cases: list[Case]
    samples: list[Sample]
    summary: GateSummary
    out_dir: Path | None = None

    @property
    def failed_cases(self) -> list[Case]:
        return [c for c in self.cases if not c.ok and not c.skipped]


class Gate:
    """Runs the suite against one target with one config, then the registered checks (validation/checks.py).

    `recording_baseline`: this target IS the baseline (`record-baseline`): its answers are what is recorded,
    not compared against a baseline.
    """

    def __init__(self, target: str, cfg: GateConfig, console: Console | None = None,
                 recording_baseline: bool = False) -> None:
        self.cfg = cfg
        self.recording_baseline = recording_baseline
        self.api_key = gate_api_key(cfg)  # before any request; the key never reaches a report
        self.client = target_client(target, cfg, self.api_key)
        self._peers: dict[str, OpenAIClient] = {}  # the baseline / re-anchor servers: /v1/models asked once each
        self.console = console or Console(stderr=True)
        self.suite: Suite = load_suite(cfg.suite)
        self.backstop = Backstop(tuple(cfg.backstop_tokens))
        self.judge_s: float | None = None
        # record-baseline (and a live baseline) ask for T=0 log-probs: the lossless check's near-ties
        self.t0_logprobs: int | None = None
        # lossless_t0 compares the T=0 suite answers against a baseline: each answer comes with its own tokens
        # (one listed alternative), which name where it parted from the baseline (lossless.compare_answer)
        self.t0_tokens = False
        self.baseline_logprobs: dict[str, list[Any]] = {}  # a live baseline's, filled by _baseline_answers
        for pid in [*cfg.determinism.prompt_ids, *cfg.variation.prompt_ids]:
            try:
                self.suite.get(pid)
            except KeyError:
                raise UsageError(f"config names prompt '{pid}' which is not in suite {cfg.suite}") from None
        hot = hot_temperatures(cfg)
        judged = recording_baseline or bool(cfg.lossless.baseline or cfg.baseline_url)  # the likelihood will run
        if cfg.likelihood.enabled and hot and judged:  # a plan whose test cannot fail: one error before any request
            problem = design_problem(cfg.likelihood, len(self.suite.prompts), len(hot))
            if problem:
                raise UsageError(problem)
        self._judge_ready = False
        if not self._oracle_everywhere():  # the judge may decide: one clear error before any request
            self._prepare_judge()
        self.companion_requests = 0  # greedy requests sent beside the suite (_companions)
        self.derive_seeds = recording_baseline and cfg.likelihood.enabled  # and in oracle mode (run)

    def _oracle_everywhere(self) -> bool:
        """Whether the config alone puts every temperature in oracle mode (then the judge is never needed,
        unless no scorer of the target can be made: checked again in run)."""
        cfg = self.cfg
        if self.recording_baseline:
            return False
        t0 = not any(t == 0 for t in cfg.temperatures) or (
            cfg.lossless.enabled and bool(cfg.lossless.baseline or cfg.baseline_url))
        hot = not hot_temperatures(cfg) or (cfg.likelihood.enabled and bool(cfg.lossless.baseline or cfg.baseline_url))
        return t0 and hot

    def _prepare_judge(self) -> None:
        """One clear error naming what to install, before any request; the weight cache is made here (once)."""
        if self.cfg.judge.enabled and not self._judge_ready:
            prepare_judge(self.cfg.judge)
            self._judge_ready = True

    # ------------------------------------------------------------------ requests
    def _generate(self, client: OpenAIClient, p: Prompt, temperature: float, seed: int | None, purpose: str
                  ) -> Sample:
        """One request to `client` (the target's, or the live baseline's for purpose "baseline" and its T>0
        suite answers): the server kind asked for is the target's (a baseline serves the same model)."""
        cfg = self.cfg
        max_tokens = cfg.max_tokens or p.max_tokens
        s = Sample(p.id, temperature, seed, purpose, max_tokens, category=p.category)
        extra = dict(cfg.sampling.extra)
        # the suite's T>0 requests (the candidate's and the baseline's) carry the production-like mix the per-token
        # test places their tokens in; the variation check's seeded requests test seeds only: the profile's plain
        # parameters (a low-entropy mix entry made the small embedded model loop there, a detector failure, 2026-12-04)
        params = None if temperature <= 0 else (cfg.sampling_for(p.id, temperature) if purpose == "suite"
                                                else cfg.sampling.plain(temperature))
        if params is not None:  # every truncation field explicit: the law the per-token test places tokens in
            extra.update(params.request_fields(self.kind))
            s.sampling = params.as_dict()
        if self.kind == "sglang":
            extra.setdefault("return_spec_tokens_details", True)
            extra.setdefault("return_output_ids_in_sglext", True)  # the likelihood test scores what was sampled
        n_alts = self._t0_logprobs(p, temperature, purpose)
        # llama.cpp names the sampled ids only in its log-prob entries: ask for one alternative on the T>0 answers
        # the likelihood test scores, keep the ids, drop the rows (sampling is the same with or without them)
        ids_only = (n_alts is None and self.kind == "llamacpp" and temperature > 0 and purpose == "suite"
                    and cfg.likelihood.enabled)
        try:
            r: ChatResult = client.chat(
                p.messages(), max_tokens=max_tokens, temperature=temperature,
                top_p=None, top_k=None,  # in `extra` at T>0 (params.request_fields)
                seed=self._request_seed(p, temperature, seed, purpose), stream=True, extra=extra or None,
                top_logprobs=1 if ids_only else n_alts,
            )
        except TargetError as exc:
            s.error = str(exc)
            return s
        s.text, s.finish_reason = r.text, r.finish_reason
        s.prompt_tokens, s.completion_tokens = r.prompt_tokens, r.completion_tokens
        s.latency_s, s.ttft_s, s.tokens_per_s = r.latency_s, r.ttft_s, r.tokens_per_s
        s.spec_accept_length = r.spec_accept_length
        s.output_ids = r.output_ids
        timings = (r.raw.get("last_chunk") or {}).get("timings") or r.raw.get("timings") or {}
        if "draft_n" in timings:
            s.draft_n, s.draft_accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
        if purpose != "companion":  # a companion's answer is load, thrown away: no detector reads it
            s.findings = score_text(s.text, cfg.thresholds)
            s.backstop = self.backstop.findings(s.text, s.finish_reason)
        if r.logprobs is not None and not ids_only:
            s.logprobs = encode_logprobs(r.logprobs)
        return s

    def _request_seed(self, p: Prompt, temperature: float, seed: int | None, purpose: str) -> int | None:
        """The seed sent for one request. The likelihood test's T>0 suite answers (the candidate's, the baseline's
        live or being recorded) each get their own sampler stream (likelihood.answer_seed): one seed shared by
        every prompt correlates the prompts' answers and the test falsely fails (docs/likelihood.md)."""
        if purpose == "suite" and temperature > 0 and seed is not None and self.derive_seeds:
            return answer_seed(seed, p.id, temperature)
        return seed

    def _t0_logprobs(self, p: Prompt, temperature: float, purpose: str) -> int | None:
        """Alternatives per token asked on a T=0 request: a live baseline's answers (`lossless.top_logprobs`: the
        lossless check's near-ties), the suite's answers when `t0_logprobs` is set (record-baseline), and the
        determinism prompts' suite answer and repeats (validation/determinism.py); None otherwise."""
        if temperature != 0:
            return None
        want = (self.cfg.lossless.top_logprobs if purpose == "baseline" else
                self.t0_logprobs if purpose == "suite" else None)
        if purpose == "suite" and self.t0_tokens:  # the candidate's own tokens for lossless_t0 (compare_answer)
            want = max(want or 0, 1)
        dc = self.cfg.determinism
        if dc.enabled and p.id in dc.prompt_ids and purpose in ("suite", "determinism-seq", "determinism-conc"):
            want = max(want or 0, dc.top_logprobs)
        return want

    def _run_all(self, client: OpenAIClient, jobs: Sequence[tuple[Prompt, float, int | None, str]],
                 progress: Progress, label: str, workers: int | None = None) -> list[Sample]:
        task = progress.add_task(label, total=len(jobs))
        out: list[Sample] = []
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers or self.cfg.concurrency) as pool:
            for s in pool.map(lambda j: self._generate(client, *j), jobs):
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
        oracle_t0 = cfg.lossless.enabled and bool(cfg.lossless.baseline or cfg.baseline_url) \
            and not self.recording_baseline
        self.t0_tokens = oracle_t0
        likely = None if self.recording_baseline else self._likelihood_plan(model)
        self.derive_seeds = self.derive_seeds or likely is not None
        hot = hot_temperatures(cfg)
        weak = [t for t in cfg.temperatures if (t == 0 and not oracle_t0) or (t > 0 and likely is None)]
        if weak or self.recording_baseline:
            self._prepare_judge()
        phase = _Phases()
        try:  # the scorer stays open through lossless_t0, which places tokens with it (Gate._placer)
            spec_before = read_spec_metrics(self.client, self.kind)
            samples: list[Sample] = []
            with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=self.console, transient=False) as progress:
                with phase("requests"):
                    samples += self._request_phases(progress, likely is not None)
                if baseline_answers is None and cfg.baseline_url and cfg.lossless.enabled and oracle_t0:
                    with phase("baseline"):
                        baseline_answers, source = self._baseline_answers(progress), cfg.baseline_url
                verdicts: dict[float, Any] = {}
                if likely is not None:
                    with phase("likelihood"):
                        verdicts = self._likelihood_verdicts(likely, samples, hot, progress)
            spec_after = read_spec_metrics(self.client, self.kind)
            lossless = None
            if baseline_answers is not None:
                with phase("lossless"):
                    comps, reanchor = self._lossless_paths(samples, baseline_answers, self._placer(likely))
                lossless = LosslessData(baseline_answers, source, comps, reanchor, self.baseline_logprobs)
        finally:
            if likely is not None:
                likely.scorer.close()
        if cfg.judge.enabled:
            # recording a baseline, only its T=0 answers can refuse the recording (record-baseline keeps the T>0
            # detector hits of the target's own samples, and the file keeps no judge score), so only they are
            # judged: the T>0 samples' judging cost 470 s of numpy on the H200 machine's CPU (2026-12-04)
            judged = [s for s in samples
                      if s.temperature in weak and not (self.recording_baseline and s.temperature > 0)]
            if judged:  # every temperature under an oracle: nothing to judge, no judge started, no judge phase
                with phase("judge"):
                    self.judge_s = judge_samples(judged, cfg, {p.id: p.prompt for p in self.suite.prompts},
                                                 self.console)
        spec_on = cfg.spec.enabled == "on" or any(
            s.spec_accept_length is not None or s.draft_n for s in samples) or bool(
            spec_after and spec_after.accept_length is not None)
        ctx = GateContext(cfg, self.kind, samples, spec_before, spec_after,
                          seeds_ignored=self._seeds_ignored() if cfg.variation.enabled else None,
                          lossless=lossless, speculative=spec_on, likelihood=verdicts,
                          likelihood_off=self.likelihood_off, likelihood_error=self.likelihood_error,
                          depth=self._depth_cases())
        with phase("checks"):
            results = run_checks(ctx)
        cases = [r.case() for r in results]
        passed = all((c.ok or c.skipped) and not c.not_run for c in cases)
        summary = self._summary(ctx, cases, passed, model, time.perf_counter() - t_start, phase.seconds)
        return GateResult(self.client.base_url, model, self.kind, passed, cases, samples, summary)

    @contextlib.contextmanager
    def _companions(self, n: int) -> Iterator[None]:
        """`n` greedy requests kept in flight while the body runs: each companion sends the suite's prompts at T=0
        one after another, so the server's batches hold a greedy row beside every sampled one (an engine whose
        sampled rows change with a greedy batch mate shows in the per-token test). Their answers are load: not
        kept, not judged; the body's end waits for each companion's last answer."""
        if n <= 0 or not self.suite.prompts:
            yield
            return
        stop = threading.Event()
        sent = [0] * n

        def loop(i: int) -> None:
            k = i
            while not stop.is_set():
                p = self.suite.prompts[k % len(self.suite.prompts)]
                s = self._generate(self.client, p, 0.0, self.cfg.seed, "companion")
                sent[i] += 1
                k += n
                if s.error:  # the target fails: the suite's own requests report it; no retry loop beside them
                    return

        threads = [threading.Thread(target=loop, args=(i,), daemon=True, name=f"companion-{i}") for i in range(n)]
        for t in threads:
            t.start()
        try:
            yield
        finally:
            stop.set()
            for t in threads:
                t.join()
            self.companion_requests += sum(sent)
            if not self.console.is_terminal:
                self.console.print(f"[companion] {sum(sent)} greedy request(s) beside the suite", highlight=False,
                                   markup=False)

    def _request_phases(self, progress: Progress, derived_seeds: bool) -> list[Sample]:
        """Every request of the gate but the baseline's and the scorer's: the suite at each temperature, then the
        determinism repeats (sequential, then concurrent) and the seed-variation requests when enabled."""
        cfg = self.cfg
        jobs = [(p, t, seed, "suite") for t in cfg.temperatures for seed in self.seeds(t, derived_seeds)
                for p in self.suite.prompts]
        if cfg.sampling.interleave:  # production-like batches: every temperature and parameter set at once
            import random

            random.Random(cfg.seed).shuffle(jobs)
        # companions only where there is something to mix them with: interleaved sampled requests
        mix = cfg.sampling.interleave and any(t > 0 for t in cfg.temperatures)
        with self._companions(cfg.sampling.companions if mix else 0):
            samples = self._run_all(self.client, jobs, progress, "suite")
        if cfg.determinism.enabled:
            for pid in cfg.determinism.prompt_ids:
                p = self.suite.get(pid)
                seq = [(p, 0.0, cfg.seed, "determinism-seq")] * cfg.determinism.repeats
                samples += self._run_all(self.client, seq, progress, f"determinism {pid} sequential", workers=1)
                conc = [(p, 0.0, cfg.seed, "determinism-conc")] * cfg.determinism.concurrent
                samples += self._run_all(self.client, conc, progress, f"determinism {pid} concurrent",
                                         workers=cfg.determinism.concurrent)
        if cfg.variation.enabled:
            v = cfg.variation
            jobs = [(self.suite.get(pid), v.temperature, s, "variation") for pid in v.prompt_ids for s in v.seeds]
            if v.check_seed_reproducible:
                jobs += [(self.suite.get(pid), v.temperature, v.seeds[0], "reproduce") for pid in v.prompt_ids]
            samples += self._run_all(self.client, jobs, progress, "variation")
        return samples

    def _summary(self, ctx: GateContext, cases: list[Case], passed: bool, model: str, duration_s: float,
                 phase_s: dict[str, float]) -> GateSummary:
        """The report's summary block (report.json `summary`, the console table's header); ``phase_s``: the run's
        seconds per phase (_Phases.seconds)."""
        cfg, samples, spec_after = self.cfg, ctx.samples, ctx.spec_after
        ok_samples = [s for s in samples if not s.error]
        modes = {f"T{t:g}": ("oracle: lossless_t0 against the target-only baseline" if t == 0 else
                             "oracle: the target's likelihood of every sampled token, against the target-only "
                             "baseline")
                 if ctx.mode(t) == "oracle" else "detectors + judge (weaker: no target-only baseline)"
                 for t in cfg.temperatures}
        return GateSummary(
            verdict="PASS" if passed else "FAIL",
            target=self.client.base_url,
            model=model,
            server_kind=self.kind,
            suite=f"{Path(cfg.suite).name} (v{self.suite.version})",
            temperatures=list(cfg.temperatures),
            verdict_mode=modes,
            requests=len(samples),
            request_errors=sum(1 for s in samples if s.error),
            checks=len(cases),
            failed_checks=[c.name for c in cases if not c.ok and not c.skipped],
            not_run_checks=[{"name": c.name, "reason": c.message} for c in cases if c.not_run],
            duration_s=round(duration_s, 2),
            median_ttft_s=_median(s.ttft_s for s in ok_samples),
            median_tokens_per_s=_median(s.tokens_per_s for s in ok_samples),
            spec=spec_after.as_dict() if spec_after else None,
            judge_s=round(self.judge_s, 2) if self.judge_s is not None else None,
            skipped_checks=[{"name": c.name, "reason": c.message} for c in cases if c.skipped],
            waivers=[c.details["waiver"] for c in cases if c.details.get("waiver")],
            companion_requests=self.companion_requests,
            phase_s=dict(phase_s),
        )

    # ------------------------------------------------------------------ the target's likelihood at T>0
    likelihood_off: str | None = None  # why T>0 is not judged by the target's likelihood (detectors mode)
    likelihood_error: str | None = None  # why the likelihood verdict could not run (not_run, never a pass)
    scorer_trust: Any = None  # likelihood.ScorerTrust where the candidate scored itself

    def _likelihood_plan(self, model: str) -> _LikelihoodPlan | None:
        """The scorer and the baseline's T>0 answers that judge T>0 under the target model, or None with the
        reason in likelihood_off. A scorer that cannot score is a UsageError here, before any gate request."""
        cfg = self.cfg
        lc = cfg.likelihood
        if not hot_temperatures(cfg):
            self.likelihood_off = "no T>0 temperature configured"
            return None
        if not lc.enabled:
            self.likelihood_off = "disabled by config (likelihood.enabled: false)"
            return None
        rows = None
        doc: dict[str, Any] = {}
        if cfg.lossless.baseline:
            doc = read_baseline(cfg.lossless.baseline, model, cfg.suite, cfg.max_tokens)
            if doc.get("samples") or not cfg.baseline_url:
                rows = baseline_samples_of(doc, cfg.lossless.baseline, cfg)
        if rows is None and not cfg.baseline_url:
            self.likelihood_off = ("no target-only baseline (baseline_url, or a baseline file recorded with T>0 "
                                   "samples by record-baseline)")
            return None
        kind = lc.scorer
        if kind is None:  # a live target-only SGLang server the gate already talks to scores the answers
            for role, url in (("baseline", cfg.baseline_url), ("re-anchor server", cfg.lossless.reanchor_url)):
                if url and self._same_model_client(url, role).server_kind() == "sglang":
                    kind = url
                    break
        trust = None
        if kind is None and self.kind == "sglang" and rows is not None:
            # the production sequence (a baseline file, no live target-only server): the candidate's own prefill
            # (input log-probs: the target model, no drafting) scores, once it reproduces the baseline's scores
            recorded = doc.get("scores") if cfg.lossless.baseline else None
            if not isinstance(recorded, dict) or not isinstance(recorded.get("logprobs"), dict):
                raise UsageError(f"baseline {cfg.lossless.baseline} holds no target-only scores of its T>0 answers "
                                 "(recorded before they were kept): the candidate cannot be trusted as the target's "
                                 "scorer without them; re-record it (python -m sglfleet.validation "
                                 "record-baseline), or set baseline_url / likelihood.scorer to a live target-only "
                                 "server")
            check_recorded_scores(recorded, rows, str(cfg.lossless.baseline))
            kind, trust = self.client.base_url, recorded["logprobs"]
        if kind is not None:  # a scorer named, or a live target-only SGLang server: one that cannot score is bad input
            scorer = make_scorer(kind, cfg, model=model, candidate_url=self.client.base_url, api_key=self.api_key)
            scorer.order = self.sampler_order()
            if trust is not None:
                scorer.method = f"the candidate's own prefill (no drafting), trusted on the baseline's scores: " \
                                f"{scorer.method}"
            return _LikelihoodPlan(scorer, rows, trust)
        try:  # the in-process reference model scores only the model it is (the embedded target)
            scorer = make_scorer("reference", cfg, model=model, candidate_url=self.client.base_url,
                                 api_key=self.api_key)
        except UsageError as exc:
            self.likelihood_off = f"no scorer of the target model: {exc}"
            return None
        scorer.order = self.sampler_order()
        return _LikelihoodPlan(scorer, rows)

    def sampler_order(self) -> tuple[str, ...]:
        """The order in which the candidate's engine applies temperature, top-k, top-p and min-p (the law the
        per-token test places each token in): likelihood.sampler_order, else SGLang's, else the sampler chain
        llama.cpp's /props names. UsageError when none is known."""
        from sglfleet.validation.tokenlaw import ORDERS, order_of

        lc = self.cfg.likelihood
        try:
            if lc.sampler_order is not None:
                return order_of(lc.sampler_order if isinstance(lc.sampler_order, str) else list(lc.sampler_order))
            if self.kind == "sglang":
                return ORDERS["sglang"]
            params = ((self.client.props() or {}).get("default_generation_settings") or {}).get("params") or {}
            chain = params.get("samplers")
            if isinstance(chain, list) and chain:
                return order_of([str(x) for x in chain])
        except ValueError as exc:
            raise UsageError(f"likelihood: {exc}") from None
        raise UsageError(f"likelihood: {self.client.base_url} names no sampler order (SGLang, or llama.cpp's /props "
                         "samplers): set likelihood.sampler_order")

    def _likelihood_verdicts(self, plan: _LikelihoodPlan, samples: list[Sample], hot: list[float],
                             progress: Progress) -> dict[float, Any]:
        """Every T>0 suite answer of the candidate and of the baseline scored under the target model, then one
        two-sample verdict per temperature (validation/likelihood.py)."""
        cfg = self.cfg
        prompts = {p.id: p for p in self.suite.prompts}
        base = plan.baseline
        if base is None:
            base = self._baseline_hot_answers(progress)
        mine = [s for s in samples if s.purpose == "suite" and s.temperature > 0 and not s.error]
        cand = [Answer(s.prompt_id, s.temperature, s.seed, s.text, ended_at_end_of_turn(s.finish_reason, s.sampling),
                       tuple(s.output_ids) if s.output_ids else None, s.params()) for s in mine]
        ref = [Answer(b.prompt_id, b.temperature, b.seed, b.text, ended_at_end_of_turn(b.finish_reason, b.sampling),
                      b.output_ids, b.params()) for b in base]
        lc = cfg.likelihood
        n_var = len({(b.prompt_id, b.temperature) for b in base}) * lc.power_answers_per_prompt * len(
            lc.power_families) if lc.power_reps else 0
        task = progress.add_task(f"likelihood: scoring under {plan.scorer.name}", total=len(cand) + len(ref) + n_var)
        t0 = time.perf_counter()
        base_scored: list[Any] = []
        try:
            verdicts = likelihood_verdicts(cand, ref, plan.scorer, cfg, lambda pid: prompts[pid].messages(), hot,
                                           on_score=lambda _sc: progress.advance(task), on_baseline=base_scored.extend)
        except TargetError as exc:
            self.likelihood_error = f"scoring failed on {plan.scorer.name}: {str(exc)[:300]}"
            return {}
        self.console.print(f"[likelihood] {len(cand)} candidate and {len(ref)} baseline answers scored, with the "
                           f"power estimate's variants, in {time.perf_counter() - t0:.1f}s", highlight=False,
                           markup=False)
        if plan.trust is not None:
            self.scorer_trust = check_trust(plan.trust, base_scored, plan.scorer.name, cfg.likelihood)
            self.console.print(f"[likelihood] scorer trust: {self.scorer_trust.reason}", highlight=False,
                               markup=False)
            if not self.scorer_trust.ok:
                for v in verdicts:
                    v.ok, v.reason = False, f"the scorer is not trusted: {self.scorer_trust.reason}; {v.reason}"
            for v in verdicts:
                v.statistic["scorer_trust"] = self.scorer_trust.as_dict()
        return {v.temperature: v for v in verdicts}

    def _baseline_hot_answers(self, progress: Progress) -> list[BaselineSample]:
        """T>0 suite answers of the live baseline deployment, with `likelihood.baseline_seeds`."""
        cfg = self.cfg
        got = self._run_all(self._baseline_client(), [(p, t, seed, "suite") for t in hot_temperatures(cfg)
                                                      for seed in cfg.likelihood.baseline_seeds
                                                      for p in self.suite.prompts],
                            progress, "baseline T>0")
        errs = [s for s in got if s.error]
        if errs:
            raise TargetError(f"baseline {cfg.baseline_url} failed: {errs[0].error}")
        return [BaselineSample(s.prompt_id, s.temperature, s.seed, s.text, s.finish_reason,
                               tuple(s.output_ids) if s.output_ids else None, s.sampling) for s in got]

    def seeds(self, t: float, oracle_hot: bool) -> list[int]:
        """The suite's seeds at one temperature: `seed` at T=0 and in detectors mode; at T>0 in oracle mode the
        candidate's `likelihood.seeds`, and while recording a baseline `likelihood.baseline_seeds`."""
        cfg = self.cfg
        if t == 0:
            return [cfg.seed]
        if self.recording_baseline and cfg.likelihood.enabled:
            return list(cfg.likelihood.baseline_seeds)
        return list(cfg.likelihood.seeds) if oracle_hot else [cfg.seed]

    # ------------------------------------------------------------------ judging
    def _seeds_ignored(self) -> str | None:
        return seeds_ignored_reason(self.kind, self.client.server_info() if self.kind == "sglang" else None)

    def _reanchor_fn(self) -> tuple[Continue | None, str, bool]:
        """The continuation the lossless check re-anchors near-ties on, where it comes from, and whether it is the
        candidate itself forced back onto the baseline's path (lossless.compare_forced: the production sequence,
        a baseline file and no live target-only server); (None, why, False) when there is none."""
        cfg = self.cfg
        url = cfg.lossless.reanchor_url or cfg.baseline_url
        forced = not url and bool(cfg.lossless.baseline)
        if not url and not forced:
            return None, "no lossless.reanchor_url, baseline_url or baseline file to re-anchor on", False
        try:
            base = self.client if forced else self._same_model_client(str(url), "re-anchor server")
        except TargetError as exc:
            return None, f"re-anchor server {url} unreachable: {exc}", False
        prompts = {p.id: p for p in self.suite.prompts}

        def cont(pid: str, prefix: str) -> Continuation:
            p = prompts[pid]
            r = base.chat([*p.messages(), {"role": "assistant", "content": prefix}],
                          max_tokens=cfg.max_tokens or p.max_tokens, temperature=0.0, seed=cfg.seed, stream=True,
                          extra={"continue_final_message": True},
                          top_logprobs=cfg.lossless.top_logprobs)
            return Continuation(r.text, r.logprobs, r.finish_reason)

        if forced:
            return cont, f"the candidate {self.client.base_url}, forced onto the baseline's recorded path", True
        return cont, str(url), False

    def _placer(self, plan: _LikelihoodPlan | None) -> tuple[PlaceAt | None, str]:
        """The target's scorer as lossless_t0's placer (lossless.compare_answer `place`): the likelihood plan's
        scorer once it is trusted (the candidate's own prefill only after it reproduced the baseline's recorded
        scores); (None, why) otherwise."""
        k = self.cfg.lossless.place_top_k
        if k <= 0:
            return None, "lossless.place_top_k is 0"
        if plan is None:
            return None, f"no scorer of the target model ({self.likelihood_off or 'no likelihood plan'})"
        if self.likelihood_error:
            return None, f"the scorer failed: {self.likelihood_error}"
        if plan.trust is not None and not (self.scorer_trust is not None and self.scorer_trust.ok):
            return None, "the candidate is not trusted as the target's scorer"
        prompts = {p.id: p for p in self.suite.prompts}
        scorer = plan.scorer

        def place(pid: str, before: str) -> list[tuple[bytes, float]] | None:
            return scorer.next_token_row(prompts[pid].messages(), before, k)

        return place, f"{scorer.name}: {scorer.method}"

    def _lossless_paths(self, samples: list[Sample], ref: dict[str, str],
                        placer: tuple[PlaceAt | None, str] = (None, "no scorer")
                        ) -> tuple[dict[str, Comparison], dict]:
        """Every T=0 suite answer compared with the baseline's, re-anchored at near-ties where a target-only
        server can continue (validation/lossless.py); the control runs once, on the near-tie prompt with the
        longest recorded baseline answer. `placer`: the target's scorer where the candidate's token is not among
        the baseline's recorded alternatives (Gate._placer)."""
        cfg = self.cfg
        mine = _t0_suite(samples)
        lps = self.baseline_logprobs
        tol = near_tie_rule(cfg.lossless, list(lps.values()))
        ends = end_tokens_of([(lps[pid], text) for pid, text in ref.items() if lps.get(pid)])
        calls: list[str] = []  # the prompts a token was placed for, in the report
        pl: PlaceAt | None = None
        if (place_fn := placer[0]) is not None:
            def pl(pid: str, before: str) -> list[tuple[bytes, float]] | None:
                calls.append(pid)
                return place_fn(pid, before)
        toks = {pid: token_bytes(decode_logprobs(s.logprobs)) for pid, s in mine.items() if s.logprobs}
        first = {pid: compare_answer(mine[pid].text if pid in mine else None, text, lps.get(pid), tol,
                                     ends if pid in mine and mine[pid].finish_reason == "stop" else frozenset(),
                                     place_at(pl, pid), toks.get(pid))
                 for pid, text in ref.items()}
        tied = [pid for pid, c in first.items() if c.verdict == "near_tie" and not c.ended]
        info: dict[str, Any] = {"url": None, "control": None, "off": None, "placer": placer[1], "placed": calls}
        cont: Continue | None = None
        forced = False
        if tied and cfg.lossless.max_reanchors > 0:
            cont, where, forced = self._reanchor_fn()
            info["forced"] = forced
            if cont is None:
                info["off"] = where
            else:
                info["url"] = where
                # the control runs on the near-tie prompt whose baseline answer has the most recorded tokens
                pid = max(tied, key=lambda q: (len(lps.get(q) or []), q))
                self.console.print(f"[lossless] {len(tied)} near-tie(s): re-anchoring on {where} (control: {pid})",
                                   highlight=False, markup=False)
                bad = control_reanchor(pid, ref[pid], lps[pid], cont, tol, pl)
                info["control"] = bad or f"{pid}: the baseline's answer continued from its middle gives its own rest"
                if bad:
                    cont, info["off"] = None, bad
        elif tied:
            info["off"] = "lossless.max_reanchors is 0"
        if forced:
            comps = {pid: (compare_forced(pid, mine[pid].text, mine[pid].finish_reason, ref[pid], lps.get(pid), tol,
                                          cont, cfg.lossless.max_reanchors, ends, pl, toks.get(pid))
                           if c.verdict == "near_tie" else c) for pid, c in first.items()}
            return comps, info
        comps = {pid: (compare_path(pid, mine[pid].text, mine[pid].finish_reason, ref[pid], lps.get(pid), tol, cont,
                                    cfg.lossless.max_reanchors, info["off"] or "", ends, pl, toks.get(pid))
                       if c.verdict == "near_tie" else c) for pid, c in first.items()}
        return comps, info

    def _baseline_client(self) -> OpenAIClient:
        assert self.cfg.baseline_url
        return self._same_model_client(self.cfg.baseline_url, "baseline")

    def _same_model_client(self, url: str, role: str) -> OpenAIClient:
        """A client of another deployment of the target's model (the baseline, the re-anchor server); UsageError
        when it serves another model, TargetError when it cannot be reached."""
        if url not in self._peers:
            self._peers[url] = target_client(url, self.cfg, self.api_key)
        base = self._peers[url]
        if base.model != self.client.model:
            raise UsageError(f"{role} {url} serves {base.model!r}, target serves {self.client.model!r}: they must "
                             "serve the same model")
        return base

    def _baseline_answers(self, progress: Progress) -> dict[str, str]:
        """T=0 suite answers of the live baseline deployment, with `lossless.top_logprobs` alternatives per token
        (purpose "baseline": _t0_logprobs)."""
        got = self._run_all(self._baseline_client(), [(p, 0.0, self.cfg.seed, "baseline") for p in self.suite.prompts],
                            progress, "baseline T=0")
        errs = [s for s in got if s.error]
        if errs:
            raise TargetError(f"baseline {self.cfg.baseline_url} failed: {errs[0].error}")
        self.baseline_logprobs = {s.prompt_id: decode_logprobs(s.logprobs) for s in got if s.logprobs}
        return {s.prompt_id: s.text for s in got}

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


class _Phases:
    """Seconds per named phase of a gate run (GateSummary.phase_s): ``with phases("likelihood"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - t0, 2)


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


def _t0_suite(samples: list[Sample]) -> dict[str, Sample]:
    """The T=0 suite answer of each prompt (the one lossless_t0 compares)."""
    return {s.prompt_id: s for s in samples if not s.error and s.purpose == "suite" and s.temperature == 0}


def judge_samples(samples: list[Sample], cfg: GateConfig, prompts: dict[str, str], console: Console) -> float:
    """Score every distinct answer with the fluency judge; failing ones get a `fluency` finding.
    Returns the judge's busy time (server start, forward passes, projection) in seconds."""
    jc = cfg.judge
    todo: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        if not s.error and s.text.strip():
            todo.setdefault((s.prompt_id, s.text), []).append(s)
    t0 = time.perf_counter()
    console.print(f"[judge] starting the fluency judge for {len(todo)} distinct answers", highlight=False,
                  markup=False)
    step = max(1, len(todo) // 10)
    with FluencyJudge(jc) as judge:
        for n, ((pid, text), group) in enumerate(todo.items(), 1):
            if n > 1 and (n - 1) % step == 0:  # progress: the judge's forward passes take minutes on a CPU
                console.print(f"[judge] {n - 1}/{len(todo)} answers judged ({time.perf_counter() - t0:.0f}s)",
                              highlight=False, markup=False)
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
        "json": write_json(out / "report.json", {"summary": result.summary.as_dict(),
                                                  "config": cfg.model_dump(mode="json"),
                                                  "cases": result.cases, "samples": samples}),
        "junit": write_junit(out / "junit.xml", "validation", result.cases),
        "html": write_html(out / "report.html", f"Validation gate — {result.model}", verdict=result.summary.verdict,
                           summary={k: v for k, v in result.summary.as_dict().items() if k != "spec"},
                           cases=result.cases,
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

    table = Table(title=f"gate {result.summary.verdict} — {result.model} @ {result.target}", show_lines=False)
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for c in result.cases:
        res = "[dim]skip[/]" if c.skipped else ("[green]pass[/]" if c.ok else "[bold red]FAIL[/]")
        table.add_row(c.name, res, c.message if not c.ok or c.skipped else c.message[:100])
    console.print(table)
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in result.summary.phase_s.items())
    console.print(f"time: {result.summary.duration_s:.1f} s ({phases})" if phases else
                  f"time: {result.summary.duration_s:.1f} s", highlight=False, markup=False)


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
