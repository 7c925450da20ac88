"""One generation of the gate and its findings (the unit every check judges)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sglfleet.textscore.detectors import Finding
from sglfleet.validation.lossless import EncodedLogprobs


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
    backstop: list[Finding] = field(default_factory=list)  # what no correct engine emits (textscore/backstop.py)
    score: Any = None  # the answer scored under the target model (validation/likelihood.py), T>0 in oracle mode
    output_ids: list[int] | None = None  # the token ids the server sampled, where it says them (SGLang)
    sampling: dict[str, Any] | None = None  # T>0: the top_p / top_k / min_p it was sampled with (0 / 1: off)

    def params(self) -> Any:
        """Its tokenlaw.SamplingParams (None at T=0 or when not recorded)."""
        from sglfleet.validation.tokenlaw import SamplingParams

        if self.temperature <= 0 or not self.sampling:
            return None
        return SamplingParams(self.temperature, **self.sampling)

    @property
    def label(self) -> str:
        s = f"{self.prompt_id}@T{self.temperature:g}"
        return s + (f"/seed{self.seed}" if self.seed is not None and self.temperature > 0 else "")


def quote(text: str, limit: int = 160) -> str:
    t = text.replace("\n", "⏎")
    return repr(t[:limit] + ("…" if len(t) > limit else ""))
