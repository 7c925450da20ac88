"""Baseline-relative coherence at T>0 (`coherence.reference: baseline`, off by default).

A production-size model never trips a garbage detector, so by default any hit fails its
`<detector>@T<t>` case (zero tolerance). A tiny model (SmolLM2-135M) loops or emits soup at T 0.6-1.0
by itself, and a correct speculative build draws different random samples than the target-only
server, so zero tolerance fails correct builds by chance. In baseline mode the gate samples every
prompt at every T>0 once per `coherence.seeds` entry and compares, per temperature, how many of the
candidate's suite answers any corruption detector flags (k_c of n_c) with the target-only baseline's
(k_b of n_b, texts recorded by `record-baseline` and re-scored here with the current detectors):

- `coherence_vs_baseline@T<t>` fails when the candidate is significantly worse — one-sided Fisher
  exact test p < alpha / (number of T>0 temperatures), Bonferroni — or when k_c / n_c > max_rate,
  whatever the baseline did;
- the per-detector cases `<detector>@T<t>` at T>0 keep their names and carry the counts and the
  offending excerpts, informational (ok): the verdict is the one above.

T=0 is untouched (one sample per prompt, zero tolerance), and so is the fluency judge's case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.errors import UsageError
from pipeline.reports import Case
from validation.config import GateConfig
from validation.detectors import DETECTORS, Finding, score_text

if TYPE_CHECKING:
    from validation.gate import Sample

RERECORD = "re-record the baseline with this profile (python -m validation record-baseline --config PROFILE)"


@dataclass(frozen=True)
class BaselineSample:
    """One T>0 suite answer of the target-only deployment (texts only; scored at gate time)."""

    prompt_id: str
    temperature: float
    seed: int | None
    text: str


def fisher_exact_greater(k_c: int, n_c: int, k_b: int, n_b: int) -> float:
    """One-sided Fisher exact p-value that the candidate's rate k_c/n_c exceeds the baseline's k_b/n_b.

    P(X >= k_c) for X hypergeometric: n_c draws from n_c + n_b items of which k_c + k_b are flagged.
    """
    if not (0 <= k_c <= n_c and 0 <= k_b <= n_b) or n_c + n_b == 0:
        raise ValueError(f"bad counts {k_c}/{n_c} vs {k_b}/{n_b}")
    n, k = n_c + n_b, k_c + k_b
    total = math.comb(n, n_c)
    tail = sum(math.comb(k, x) * math.comb(n - k, n_c - x) for x in range(k_c, min(k, n_c) + 1))
    return min(1.0, tail / total)


def uses_baseline(cfg: GateConfig) -> bool:
    return cfg.coherence.reference == "baseline"


def suite_seeds(cfg: GateConfig, temperature: float) -> list[int]:
    """The seeds of the suite at one temperature: `seed`, or `coherence.seeds` at T>0 in baseline mode."""
    return list(cfg.coherence.seeds) if uses_baseline(cfg) and temperature > 0 else [cfg.seed]


def hot_temperatures(cfg: GateConfig) -> list[float]:
    return sorted({t for t in cfg.temperatures if t > 0})


def baseline_samples_record(samples: list[Sample]) -> list[dict[str, Any]]:
    """The `samples` key of a baseline file: the T>0 suite answers, texts only."""
    return [{"prompt_id": s.prompt_id, "temperature": s.temperature, "seed": s.seed, "text": s.text}
            for s in samples if s.purpose == "suite" and s.temperature > 0 and not s.error]


def load_baseline_samples(path: str, model: str | None, cfg: GateConfig) -> list[BaselineSample]:
    """T>0 baseline answers recorded by `record-baseline`, checked against the target's model, the suite
    and every (prompt, temperature, seed) this config samples."""
    from validation.lossless import read_baseline

    return baseline_samples_of(read_baseline(path, model, cfg.suite, cfg.max_tokens), path, cfg)


def baseline_samples_of(doc: dict[str, Any], path: str, cfg: GateConfig) -> list[BaselineSample]:
    """load_baseline_samples on a baseline document already read (and checked) by lossless.read_baseline."""
    rows = doc.get("samples")
    try:
        samples = None if rows is None else [
            BaselineSample(str(r["prompt_id"]), float(r["temperature"]), r.get("seed"), str(r["text"])) for r in rows]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"cannot read baseline samples from {path}: {type(exc).__name__}") from None
    if not samples:
        raise UsageError(f"baseline {path} has no T>0 samples, which coherence.reference 'baseline' compares "
                         f"against: {RERECORD}")
    have = {(s.prompt_id, s.temperature, s.seed) for s in samples}
    from validation.suite import load_suite

    need = [(p.id, t, seed) for t in hot_temperatures(cfg) for seed in suite_seeds(cfg, t)
            for p in load_suite(cfg.suite).prompts]
    missing = [n for n in need if n not in have]
    if missing:
        shown = ", ".join(f"{pid}@T{t:g}/seed{seed}" for pid, t, seed in missing[:4])
        raise UsageError(f"baseline {path} lacks {len(missing)} of the {len(need)} T>0 samples this profile "
                         f"compares against ({shown}{', …' if len(missing) > 4 else ''}): {RERECORD}")
    return samples


def _corruption(findings: list[Finding], cfg: GateConfig) -> list[Finding]:
    return [f for f in findings if f.check in DETECTORS and f.check not in cfg.thresholds.disabled]


def _hit_line(label: str, f: Finding, text: str) -> str:
    from validation.gate import quote

    return f"{label}: {f.check}: {f.reason} — {f.excerpt or quote(text)}"


def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:.0f} %" if n else "n/a"


def relative_coherence_cases(samples: list[Sample], baseline: list[BaselineSample], cfg: GateConfig,
                             ) -> list[Case]:
    """Per T>0 temperature of `cfg`: the `<detector>@T<t>` cases (counts, informational) and the verdict
    `coherence_vs_baseline@T<t>`. `samples` are the candidate's answers with their findings (any n per
    temperature; only the suite's answers are compared); the baseline's texts are scored here with
    `cfg.thresholds`, so both sides are judged by the same detectors."""
    temps = hot_temperatures(cfg)
    threshold = cfg.coherence.alpha / max(1, len(temps))
    scored = [(b, _corruption(score_text(b.text, cfg.thresholds), cfg)) for b in baseline]
    cases: list[Case] = []
    for t in temps:
        at_t = [s for s in samples if s.temperature == t and not s.error]
        mine = [(s, _corruption(s.findings, cfg)) for s in at_t if s.purpose == "suite"]
        other = [(s, _corruption(s.findings, cfg)) for s in at_t if s.purpose != "suite"]
        base = [(b, fs) for b, fs in scored if b.temperature == t]
        n_c, k_c = len(mine), sum(1 for _, fs in mine if fs)
        n_b, k_b = len(base), sum(1 for _, fs in base if fs)
        for det in DETECTORS:
            name = f"{det}@T{t:g}"
            if det in cfg.thresholds.disabled:
                cases.append(Case(name, "coherence", True, "disabled by config", skipped=True))
                continue
            hits = [(s, f) for s, fs in mine for f in fs if f.check == det]
            b_hits = [(b, f) for b, fs in base for f in fs if f.check == det]
            o_hits = [(s, f) for s, fs in other for f in fs if f.check == det]
            c_n = len({id(s) for s, _ in hits})
            b_n = len({id(b) for b, _ in b_hits})
            msg = (f"{c_n} of {n_c} answers; baseline {b_n} of {n_b} (informational: judged by "
                   f"coherence_vs_baseline@T{t:g})")
            if o_hits:
                msg += f"; {len({id(s) for s, _ in o_hits})} of {len(other)} non-suite answers (not compared)"
            quoted = [_hit_line(s.label, f, s.text) for s, f in (hits + o_hits)[:6]]
            cases.append(Case(name, "coherence", True, msg + (": " + "; ".join(quoted) if quoted else ""), {
                "candidate_flagged": c_n, "candidate_n": n_c, "baseline_flagged": b_n, "baseline_n": n_b,
                "offending": [{"sample": s.label, "reason": f.reason, "excerpt": f.excerpt, "text": s.text[:2000]}
                              for s, f in hits + o_hits],
                "baseline_offending": [{"sample": _blabel(b), "reason": f.reason, "excerpt": f.excerpt}
                                       for b, f in b_hits]}))
        cases.append(_verdict_case(t, mine, base, k_c, n_c, k_b, n_b, threshold, len(temps), cfg))
    return cases


def _blabel(b: BaselineSample) -> str:
    return f"{b.prompt_id}@T{b.temperature:g}" + (f"/seed{b.seed}" if b.seed is not None else "")


def _verdict_case(t: float, mine: list[tuple[Sample, list[Finding]]], base: list[tuple[BaselineSample, list[Finding]]],
                  k_c: int, n_c: int, k_b: int, n_b: int, threshold: float, m: int, cfg: GateConfig) -> Case:
    name = f"coherence_vs_baseline@T{t:g}"
    cc = cfg.coherence
    details: dict[str, Any] = {"candidate_flagged": k_c, "candidate_n": n_c, "baseline_flagged": k_b,
                               "baseline_n": n_b, "alpha": cc.alpha, "temperatures_tested": m,
                               "p_threshold": threshold, "max_rate": cc.max_rate}
    if n_c == 0 or n_b == 0:
        who = "the candidate" if n_c == 0 else "the baseline"
        return Case(name, "coherence", False, f"{who} has no suite answers at T={t:g}: nothing to compare"
                    + ("" if n_c == 0 else f"; {RERECORD}"), details)
    p = fisher_exact_greater(k_c, n_c, k_b, n_b)
    rate = k_c / n_c
    worse, capped = p < threshold, rate > cc.max_rate
    details.update({"p_value": p, "rate": rate, "baseline_rate": k_b / n_b, "significant": worse,
                    "over_max_rate": capped,
                    "offending": [{"sample": s.label, "checks": [f.check for f in fs],
                                   "reason": fs[0].reason, "excerpt": fs[0].excerpt, "text": s.text[:2000]}
                                  for s, fs in mine if fs],
                    "baseline_offending": [{"sample": _blabel(b), "checks": [f.check for f in fs],
                                            "reason": fs[0].reason, "excerpt": fs[0].excerpt, "text": b.text[:2000]}
                                           for b, fs in base if fs]})
    counts = (f"{k_c} of {n_c} answers flagged ({_pct(k_c, n_c)}), baseline {k_b} of {n_b} ({_pct(k_b, n_b)}); "
              f"one-sided Fisher p={p:.3g} {'<' if worse else '>='} {threshold:.3g} (alpha {cc.alpha:g} / {m} T>0 "
              f"temperatures); rate {'>' if capped else '<='} max_rate {cc.max_rate:g}")
    if not (worse or capped):
        return Case(name, "coherence", True, counts, details)
    why = " and ".join(w for w, on in (("significantly worse than the baseline", worse),
                                        (f"over max_rate {cc.max_rate:g}", capped)) if on)
    quoted = "; ".join([_hit_line(s.label, fs[0], s.text) for s, fs in mine if fs][:6])
    return Case(name, "coherence", False, f"{why}: {counts}: {quoted}", details)


def rescored_sample(row: dict[str, Any], cfg: GateConfig) -> Sample:
    """A Sample from a stored `samples.jsonl` / report row, its findings re-computed with `cfg.thresholds`
    (the stored ones are from the code of the day; a stored fluency finding is kept)."""
    from validation.gate import Sample

    s = Sample(row["prompt_id"], float(row["temperature"]), row.get("seed"), row.get("purpose", "suite"),
               int(row.get("max_tokens") or 0), text=row.get("text") or "", error=row.get("error"),
               category=row.get("category"))
    if not s.error:
        s.findings = score_text(s.text, cfg.thresholds) + [
            Finding(f["check"], f.get("reason", ""), f.get("excerpt", "")) for f in row.get("findings") or []
            if f.get("check") == "fluency"]
    return s


def baseline_from_report(report: dict[str, Any]) -> list[BaselineSample]:
    """Baseline samples from a gate report of the target-only server (its T>0 suite answers)."""
    return [BaselineSample(r["prompt_id"], float(r["temperature"]), r.get("seed"), r.get("text") or "")
            for r in report.get("samples") or []
            if r.get("purpose") == "suite" and float(r["temperature"]) > 0 and not r.get("error")]
