"""The target-only baseline's sampled (T>0) answers: what `record-baseline` keeps and the gate compares against.

The T>0 verdict in oracle mode (validation/likelihood.py) compares the candidate's sampled answers with
the target-only server's own, sampled at the same prompts and temperatures with `likelihood.baseline_seeds`
(disjoint from the candidate's `likelihood.seeds`, so the comparison never rests on a seeded identity).
They come live from `baseline_url` or from a file written by `record-baseline` (its `samples` key, texts
only: every answer is scored at gate time by the same scorer as the candidate's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sglfleet.pipeline.errors import UsageError
from sglfleet.validation.config import GateConfig

if TYPE_CHECKING:
    from sglfleet.validation.samples import Sample

SEED_STREAMS = "answer_seed"  # every T>0 answer sampled with its own seed (validation/likelihood.answer_seed)
RERECORD = "re-record the baseline with this profile (python -m sglfleet.validation record-baseline --config PROFILE)"


@dataclass(frozen=True)
class BaselineSample:
    """One T>0 suite answer of the target-only deployment."""

    prompt_id: str
    temperature: float
    seed: int | None
    text: str
    finish_reason: str | None = None
    output_ids: tuple[int, ...] | None = None  # the ids the server sampled (SGLang), scored instead of the text
    sampling: dict[str, Any] | None = None  # the top_p / top_k / min_p it was sampled with (older files: none)

    def params(self) -> Any:
        """Its tokenlaw.SamplingParams (None when the file did not record them)."""
        from sglfleet.validation.tokenlaw import SamplingParams

        return SamplingParams(self.temperature, **self.sampling) if self.sampling else None

    @classmethod
    def from_record(cls, r: dict[str, Any], text: str | None = None) -> BaselineSample:
        """One recorded answer (a baseline file's or a gate report's sample row), its ids and sampling parameters
        checked (TypeError / KeyError / ValueError on a malformed row); ``text`` replaces a missing one."""
        return cls(str(r["prompt_id"]), float(r["temperature"]), r.get("seed"),
                   str(r["text"]) if text is None else text, r.get("finish_reason"), _ids(r.get("output_ids")),
                   _sampling(r.get("sampling")))


def _ids(raw: Any) -> tuple[int, ...] | None:
    """A recorded answer's sampled ids; None where none were recorded (older baselines, other servers)."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in raw):
        raise TypeError("output_ids is not a list of token ids")
    return tuple(raw) or None


def _sampling(raw: Any) -> dict[str, Any] | None:
    """A recorded answer's sampling parameters, checked; None where none were recorded (older baselines)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not {"top_p", "top_k", "min_p"} <= set(raw) <= {"top_p", "top_k", "min_p", "stop"}:
        raise TypeError("sampling is not {top_p, top_k, min_p[, stop]}")
    stop = raw.get("stop", [])
    if not isinstance(stop, list) or (not stop and "stop" in raw):
        raise TypeError("sampling.stop is not a non-empty list of strings")
    from sglfleet.validation.tokenlaw import SamplingParams

    # ValueError when out of range or a stop string is empty
    p = SamplingParams(1.0, float(raw["top_p"]), int(raw["top_k"]), float(raw["min_p"]), tuple(stop))
    return {"top_p": p.top_p, "top_k": p.top_k, "min_p": p.min_p, **({"stop": list(p.stop)} if p.stop else {})}


def hot_temperatures(cfg: GateConfig) -> list[float]:
    return sorted({t for t in cfg.temperatures if t > 0})


def samples_record(samples: list[Sample]) -> list[dict[str, Any]]:
    """The `samples` key of a baseline file: the T>0 suite answers, their texts and, where the server said
    them, the token ids it sampled."""
    return [{"prompt_id": s.prompt_id, "temperature": s.temperature, "seed": s.seed, "text": s.text,
             "finish_reason": s.finish_reason, **({"output_ids": s.output_ids} if s.output_ids else {}),
             **({"sampling": s.sampling} if s.sampling else {})}
            for s in samples if s.purpose == "suite" and s.temperature > 0 and not s.error]


def samples_of(doc: dict[str, Any], path: str, cfg: GateConfig) -> list[BaselineSample]:
    """The T>0 answers of a baseline document already read (and checked) by lossless.read_baseline, checked to
    hold every (prompt, temperature, baseline seed) this config compares. UsageError otherwise."""
    rows = doc.get("samples")
    try:
        samples = [] if rows is None else [BaselineSample.from_record(r) for r in rows]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"cannot read baseline samples from {path}: {type(exc).__name__}") from None
    if samples and doc.get("seed_streams") != SEED_STREAMS:
        raise UsageError(f"baseline {path} was recorded with one seed shared by every prompt (before per-answer "
                         f"seed streams): its T>0 answers are correlated across prompts: {RERECORD}")
    if not samples:
        raise UsageError(f"baseline {path} has no T>0 samples to compare the candidate's sampled answers against: "
                         f"{RERECORD}")
    have = {(s.prompt_id, s.temperature, s.seed) for s in samples}
    from sglfleet.validation.suite import load_suite

    need = [(p.id, t, seed) for t in hot_temperatures(cfg) for seed in cfg.likelihood.baseline_seeds
            for p in load_suite(cfg.suite).prompts]
    missing = [n for n in need if n not in have]
    if missing:
        shown = ", ".join(f"{pid}@T{t:g}/seed{seed}" for pid, t, seed in missing[:4])
        raise UsageError(f"baseline {path} lacks {len(missing)} of the {len(need)} T>0 samples this profile "
                         f"compares against ({shown}{', …' if len(missing) > 4 else ''}): {RERECORD}")
    kept = [s for s in samples if (s.prompt_id, s.temperature, s.seed) in set(need)]
    for s in kept:
        want = cfg.sampling_for(s.prompt_id, s.temperature).as_dict()
        if s.sampling != want:
            got = "no sampling parameters (recorded before they were kept)" if s.sampling is None else s.sampling
            raise UsageError(f"baseline {path}: {s.prompt_id}@T{s.temperature:g} was sampled with {got}, this "
                             f"profile samples it with {want}: the two sides would not share a law; {RERECORD}")
    return kept


def from_report(report: dict[str, Any]) -> list[BaselineSample]:
    """Baseline samples from a gate report of the target-only server (its T>0 suite answers)."""
    return [BaselineSample.from_record(r, text=r.get("text") or "")
            for r in report.get("samples") or []
            if r.get("purpose") == "suite" and float(r["temperature"]) > 0 and not r.get("error")]


__all__ = ["RERECORD", "SEED_STREAMS", "BaselineSample", "from_report", "hot_temperatures", "samples_of",
           "samples_record"]
