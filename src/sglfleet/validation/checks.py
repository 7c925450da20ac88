"""The gate as a registry of checks.

Every check is registered once, in report order, with the group it belongs to and the temperatures it
judges (none, every temperature, T=0 only, T>0 only). A check first says whether it applies (or why not:
its skip reason) and then returns one typed result per temperature (`CheckResult`: status, temperature,
message, evidence). Reports (JSON, JUnit, HTML) are built from these results alone.

    results = run_checks(ctx)        # ctx: GateContext, every answer and what the gate measured beside them

Statuses: `pass`, `fail`, `skip` (disabled by config or not applicable, with the reason) and `not_run` (it
should have run but could not: requests failed, zero answers to judge): listed with the reason and never a
pass. A check over zero answers is `not_run`, never `pass`.

Who decides (the gate's *mode*, per temperature, shown in every report):
- `oracle`: the target itself, served without speculation, is the judge. At T=0 `lossless_t0` (the answers
  equal the target-only server's up to numerical near-ties); at T>0 `likelihood@T` (the candidate's sampled
  answers are as likely under the target model as the target-only server's own, validation/likelihood.py).
- `detectors`: no target-only baseline could be consulted at that temperature (a non-speculative deployment
  without a recorded baseline): the named text detectors and the fluency judge decide. This mode is weaker
  and labelled so in every report.
In both modes the backstop (textscore/backstop.py: invalid UTF-8, control characters, leaked chat-template
tokens, empty answers) is zero tolerance, and in oracle mode the detectors explain a failing answer (what
kind of garbage, quoted) without deciding.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sglfleet.pipeline.reports import Case
from sglfleet.textscore.detectors import DETECTORS
from sglfleet.validation.config import GateConfig
from sglfleet.validation.lossless import lossless_case, lossless_missing_case
from sglfleet.validation.samples import Sample, quote

if TYPE_CHECKING:
    from sglfleet.validation.spec import SpecReading

ORACLE = "oracle"
DETECTORS_MODE = "detectors"
WEAKER = "detectors + judge (weaker mode: no target-only baseline at this temperature)"


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"  # disabled or not applicable: neutral, with its reason
    NOT_RUN = "not_run"  # should have run and could not: never a pass


@dataclass
class CheckResult:
    """One check's verdict at one temperature (or none)."""

    name: str
    group: str
    status: Status
    message: str
    temperature: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    mode: str | None = None  # oracle | detectors, for the checks that judge answers
    time_s: float = 0.0

    @property
    def label(self) -> str:
        return self.name if self.temperature is None else f"{self.name}@T{self.temperature:g}"

    def case(self) -> Case:
        details = dict(self.evidence)
        if self.mode:
            details.setdefault("mode", self.mode)
        if self.temperature is not None:
            details.setdefault("temperature", self.temperature)
        return Case(self.label, self.group, self.status in (Status.PASS, Status.SKIP), self.message, details,
                    time_s=self.time_s, skipped=self.status is Status.SKIP, not_run=self.status is Status.NOT_RUN)


@dataclass
class LosslessData:
    """What the gate measured for lossless_t0 before the checks ran (validation/lossless.py)."""

    answers: dict[str, str]  # the baseline's T=0 answers
    source: str
    comparisons: dict[str, Any]  # prompt -> Comparison
    reanchor: dict[str, Any]
    logprobs: dict[str, list[Any]]


@dataclass
class GateContext:
    """Everything the checks judge: the answers, the server's readings and what the gate measured beside them."""

    cfg: GateConfig
    kind: str
    samples: list[Sample]
    spec_before: SpecReading | None = None
    spec_after: SpecReading | None = None
    seeds_ignored: str | None = None  # why this server cannot honour request seeds (validation/gate.py)
    lossless: LosslessData | None = None
    speculative: bool = False
    likelihood: dict[float, Any] = field(default_factory=dict)  # T -> LikelihoodVerdict (validation/likelihood.py)
    likelihood_off: str | None = None  # why T>0 is not judged by the target's likelihood (detectors mode)
    likelihood_error: str | None = None  # the likelihood verdict should have run and could not (not_run)
    depth: list[Case] = field(default_factory=list)  # quality / long copy / speed, run by the gate (requests)

    @property
    def good(self) -> list[Sample]:
        return [s for s in self.samples if not s.error]

    @property
    def temperatures(self) -> list[float]:
        return sorted({*self.cfg.temperatures, *(s.temperature for s in self.samples if s.purpose == "suite")})

    def mode(self, t: float) -> str:
        if t == 0:
            return ORACLE if self.lossless is not None else DETECTORS_MODE
        return ORACLE if t in self.likelihood or self.likelihood_error else DETECTORS_MODE

    def at(self, t: float, purpose: str | None = None) -> list[Sample]:
        return [s for s in self.good if s.temperature == t and (purpose is None or s.purpose == purpose)]

    def failed_at(self, t: float) -> list[Sample]:
        return [s for s in self.samples if s.error and s.temperature == t]


Runner = Callable[[GateContext, float | None], list[CheckResult]]
Temps = Callable[[GateContext], list[float]] | None


@dataclass(frozen=True)
class Check:
    name: str
    group: str
    run: Runner
    temperatures: Temps = None  # None: one result without a temperature
    applies: Callable[[GateContext], str | None] = lambda ctx: None  # None: applies; else its skip reason
    verdicts: tuple[str, ...] = ()  # the result names it can return (one per name at each temperature)


REGISTRY: list[Check] = []


def register(name: str, group: str, temperatures: Temps = None,
             applies: Callable[[GateContext], str | None] | None = None,
             verdicts: tuple[str, ...] = ()) -> Callable[[Runner], Runner]:
    """Add a check to the registry (report order is registration order). A name is registered once."""
    def deco(fn: Runner) -> Runner:
        if any(c.name == name for c in REGISTRY):
            raise ValueError(f"check {name!r} registered twice")
        REGISTRY.append(Check(name, group, fn, temperatures, applies or (lambda ctx: None), verdicts or (name,)))
        return fn
    return deco


def run_checks(ctx: GateContext, registry: list[Check] | None = None) -> list[CheckResult]:
    """Every registered check, in order; a check that does not apply is listed as skipped with its reason."""
    out: list[CheckResult] = []
    for chk in registry or REGISTRY:
        temps: list[float | None] = list(chk.temperatures(ctx)) if chk.temperatures else [None]
        why = chk.applies(ctx)
        for t in temps:
            if why is not None:
                out += [CheckResult(n, chk.group, Status.SKIP, why, t) for n in chk.verdicts]
            else:
                out += chk.run(ctx, t)
    return out


def all_temperatures(ctx: GateContext) -> list[float]:
    return ctx.temperatures


def t0_only(ctx: GateContext) -> list[float]:
    return [t for t in ctx.temperatures if t == 0]


def hot_only(ctx: GateContext) -> list[float]:
    return [t for t in ctx.temperatures if t > 0]


def _no_answers(name: str, group: str, ctx: GateContext, t: float, mode: str | None = None) -> CheckResult:
    failed = ctx.failed_at(t)
    why = (f"no answers at T={t:g} to judge: {len(failed)} request(s) failed (see request_errors)" if failed
           else f"no answers at T={t:g} to judge")
    return CheckResult(name, group, Status.NOT_RUN, why, t, mode=mode)


def _offending(pairs: list[tuple[Sample, Any]]) -> list[dict[str, Any]]:
    return [{"sample": s.label, "check": f.check, "reason": f.reason, "excerpt": f.excerpt, "text": s.text[:2000]}
            for s, f in pairs]


def explain(samples: list[Sample], limit: int = 6) -> str:
    """What the detectors and the backstop see in the given answers: the explanation of a failing verdict."""
    parts = [f"{s.label}: {f.check}: {f.reason} — {f.excerpt or quote(s.text, 80)}"
             for s in samples for f in [*s.backstop, *s.findings]]
    return "; ".join(parts[:limit])


# ------------------------------------------------------------------------------------------- transport, sanity
@register("request_errors", "transport")
def _request_errors(ctx: GateContext, t: float | None) -> list[CheckResult]:
    errs = [s for s in ctx.samples if s.error]
    if not ctx.samples:
        return [CheckResult("request_errors", "transport", Status.NOT_RUN, "no request was sent")]
    msg = "; ".join(f"{s.label}: {s.error}" for s in errs[:5])
    return [CheckResult("request_errors", "transport", Status.FAIL if errs else Status.PASS,
                        msg or f"{len(ctx.samples)} requests ok", evidence={"errors": [asdict(s) for s in errs[:20]]})]


@register("finish_usage", "sanity")
def _finish_usage(ctx: GateContext, t: float | None) -> list[CheckResult]:
    cfg = ctx.cfg
    if not ctx.good:
        return [CheckResult("finish_usage", "sanity", Status.NOT_RUN, "no successful answer to check")]
    bad = []
    for s in ctx.good:
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
            bad.append(f"{s.label}: {', '.join(why)}")
    return [CheckResult("finish_usage", "sanity", Status.FAIL if bad else Status.PASS,
                        "; ".join(bad[:8]) or "finish_reason and usage sane", evidence={"problems": bad})]


@register("stop_strings", "sanity")
def _stop_strings(ctx: GateContext, t: float | None) -> list[CheckResult]:
    """The requests of the mix that carry stop strings: no answer's text may hold one. A speculative step commits
    several tokens at once; an engine that checks the stop strings only at a step's last token, or trims at the
    wrong occurrence, runs past the stop (zero tolerance: a correct engine never returns the stop string)."""
    asked = [s for s in ctx.good if s.sampling and s.sampling.get("stop")]
    if not asked:
        return [CheckResult("stop_strings", "sanity", Status.SKIP,
                            "no request carried stop strings (sampling.mix has no entry with stop)")]
    bad = []
    for s in asked:
        hit = [x for x in s.sampling["stop"] if x in s.text] if s.sampling else []
        if hit:
            at = s.text.index(hit[0])
            bad.append(f"{s.label}: the text holds the stop string {hit[0]!r} at character {at} of {len(s.text)} "
                       f"({quote(s.text[max(0, at - 30):at + 30], 60)})")
    stopped = sum(s.finish_reason == "stop" for s in asked)
    msg = "; ".join(bad[:6]) or (f"{len(asked)} answers asked with stop strings ({stopped} ended with "
                                 "finish_reason stop), none holds one"
                                 + ("; none met a stop string, so this check could not have failed" if not stopped
                                    else ""))
    return [CheckResult("stop_strings", "sanity", Status.FAIL if bad else Status.PASS, msg,
                        evidence={"asked": len(asked), "finish_stop": stopped, "problems": bad})]


# ------------------------------------------------------------------------------------------- backstop
@register("backstop", "backstop", all_temperatures)
def _backstop(ctx: GateContext, t: float | None) -> list[CheckResult]:
    assert t is not None
    at_t = ctx.at(t)
    if not at_t:
        return [_no_answers("backstop", "backstop", ctx, t)]
    hits = [(s, f) for s in at_t for f in s.backstop]
    # A byte-level model's sampler can pick a token that is one byte at T>0: a lone byte of a multi-byte character
    # (2 of 456 real answers of the embedded model, docs/likelihood.md) or a control byte (SmolLM2's token 199,
    # U+000B, three times in a code answer at T=1 of a correct build on the H200, 2026-12-05, whose per-token
    # test at T=1 passed). These are zero tolerance at T=0 only; at T>0 they are listed, and the target's
    # likelihood (oracle mode) or the text detectors judge the answer.
    sampled = [(s, f) for s, f in hits if t > 0 and f.check in SAMPLED_BYTES]
    hits = [h for h in hits if h not in sampled]
    msg = "; ".join(f"{s.label}: {f.check}: {f.reason} — {f.excerpt!r}" for s, f in hits[:6])
    note = (f"; {len(sampled)} answer(s) with invalid UTF-8 or control characters, which a sampler at T>0 can emit "
            "by itself (listed, not failed)" if sampled else "")
    return [CheckResult("backstop", "backstop", Status.FAIL if hits else Status.PASS,
                        (msg or f"{len(at_t)} answers free of what no correct engine emits (invalid UTF-8 and control "
                         "characters at T=0, chat-template tokens, empty answers)") + note, t,
                        {"offending": _offending(hits), "sampled_invalid_utf8": _offending(sampled)})]


# the backstop classes a correct sampler can draw at T>0 from a byte-level vocabulary (a one-byte token)
SAMPLED_BYTES = ("invalid_utf8", "control_char")


# ------------------------------------------------------------------------------------------- coherence
@register("lossless_t0", "speculative")
def _lossless(ctx: GateContext, t: float | None) -> list[CheckResult]:
    if ctx.lossless is None:
        return [_from_case(lossless_missing_case(ctx.cfg, ctx.speculative), None, None)]
    ld = ctx.lossless
    c = lossless_case(ld.answers, ctx.cfg, ld.source, ld.comparisons, ld.reanchor, ld.logprobs)
    if not c.ok:
        # the detectors explain what the diverging answers hold; they do not decide
        bad = {pid for pid, cmp in ld.comparisons.items() if not cmp.ok}
        why = explain([s for s in ctx.at(0.0, "suite") if s.prompt_id in bad])
        if why:
            c.message += f"; what the diverging answers hold: {why}"
            c.details["explanations"] = why
    return [_from_case(c, None, ORACLE)]


def _token_power_text(tpw: dict[str, Any]) -> str:
    """The per-token power statement in words: per wrong law, the smallest share of tokens drawn from it refused
    with the target probability and the mean total-variation distance from p_T it makes."""
    parts = []
    for f, d in tpw["families"].items():
        if d.get("no_deviation"):
            continue
        if d.get("min_mean_tv") is not None:
            parts.append(f"{f} {d['min_rate']:.1%} (mean TV {d['min_mean_tv']:.3f})")
        else:
            parts.append(f"{f} not refused even at 100% (mean TV {d.get('mean_tv_of_law', float('nan')):.3f})")
    worst = tpw.get("min_mean_tv_all_families")
    return (f"the smallest share of tokens drawn from a wrong law refused with probability >= {tpw['target']:.0%}, "
            f"and the mean total-variation distance from the target's law it makes: {', '.join(parts)}"
            + (f"; every law farther than {worst:.3f} from p_T in one of these directions is refused"
               if worst is not None else ""))


@register("likelihood", "coherence", hot_only)
def _likelihood(ctx: GateContext, t: float | None) -> list[CheckResult]:
    assert t is not None
    if ctx.likelihood_error:
        return [CheckResult("likelihood", "coherence", Status.NOT_RUN, ctx.likelihood_error, t, mode=ORACLE)]
    if t not in ctx.likelihood:
        why = ctx.likelihood_off or "no target-only baseline to score against"
        return [CheckResult("likelihood", "coherence", Status.SKIP, f"{why}: T={t:g} is judged in the {WEAKER}",
                            t, mode=DETECTORS_MODE)]
    v = ctx.likelihood[t]
    if not v.n_candidate:
        return [_no_answers("likelihood", "coherence", ctx, t, ORACLE)]
    ev = v.as_dict()
    pw = v.power or {}
    power = (f"; power: a candidate with {pw['min_detectable_rate']:.0%} of its answers corrupted is refused with "
             f"probability >= {pw['target']:.0%}" if pw.get("min_detectable_rate") is not None else
             ("; power: no corruption rate tried reaches the target probability" if pw.get("estimated") else ""))
    tok = v.per_token or {}
    tpw = tok.get("power") or {}
    if tpw.get("estimated"):
        power += f"; per-token power ({tpw['n_tokens']} tokens): {_token_power_text(tpw)}"
        both = tpw.get("all_temperatures") or {}
        if both.get("estimated") and both.get("min_mean_tv_all_families") is not None:
            power += (f"; with every T>0 temperature's test ({both['n_tokens']} tokens), a sampler that far off at "
                      f"every temperature is refused from a mean TV of {both['min_mean_tv_all_families']:.3f}")
    on_ids = v.on_ids or {}
    drawn = (f" ({on_ids.get('candidate', 0)} + {on_ids.get('baseline', 0)} on the ids the servers sampled, the "
             "rest on their text)" if any(on_ids.values()) else " (on their text)")
    msg = (f"{v.n_candidate} candidate vs {v.n_baseline} target-only answers scored under the target{drawn}: "
           f"{v.reason}{power}")
    if not v.ok:
        flagged = {e.get("answer") or (e.get("impossible") or {}).get("answer") for e in v.evidence}
        why = explain([s for s in ctx.at(t, "suite") if s.label in flagged])
        if why:
            msg += f"; what those answers hold: {why}"
            ev["explanations"] = why
    return [CheckResult("likelihood", "coherence", Status.PASS if v.ok else Status.FAIL, msg, t, ev, ORACLE)]


def _pooled_off(ctx: GateContext) -> str | None:
    if ctx.likelihood_error:
        return None  # the likelihood verdict's own not_run says why
    if not ctx.likelihood:
        return (ctx.likelihood_off or "no target-only baseline to score against") + ": no per-token test to pool"
    if not all((v.per_token or {}).get("pooled") for v in ctx.likelihood.values()):
        return "the answers carry no sampling parameters (a baseline recorded before they were kept): no per-token test"
    return None


@register("likelihood_pooled", "coherence", applies=_pooled_off)
def _likelihood_pooled(ctx: GateContext, t: float | None) -> list[CheckResult]:
    """The per-token statistics pooled over every T>0 temperature (tokenlaw.pooled_test): the support kept too
    wide or cut short, and consecutive tokens moving together, with the tokens of all temperatures at once."""
    if ctx.likelihood_error:
        return [CheckResult("likelihood_pooled", "coherence", Status.NOT_RUN, ctx.likelihood_error, None,
                            mode=ORACLE)]
    pooled = next(iter(ctx.likelihood.values())).per_token["pooled"]
    return [CheckResult("likelihood_pooled", "coherence", Status.PASS if pooled["ok"] else Status.FAIL,
                        f"per-token statistics pooled over the T>0 temperatures: {pooled['reason']}", None,
                        {"pooled": pooled}, ORACLE)]


@register("detectors", "coherence", all_temperatures, verdicts=(*DETECTORS, "fluency"))
def _detectors(ctx: GateContext, t: float | None) -> list[CheckResult]:
    """The weaker mode's verdict at a temperature the target cannot judge; in oracle mode one line of
    explanations (skipped: the oracle decides)."""
    assert t is not None
    cfg = ctx.cfg
    at_t = ctx.at(t)
    if ctx.mode(t) == ORACLE:
        verdict = "lossless_t0" if t == 0 else f"likelihood@T{t:g}"
        flagged = [s for s in at_t if s.findings]
        msg = (f"oracle mode: {verdict} decides; the detectors explain. " +
               (f"{len(flagged)} of {len(at_t)} answers with findings: {explain(flagged)}" if flagged
                else f"no findings on {len(at_t)} answers"))
        return [CheckResult("detectors", "coherence", Status.SKIP, msg, t,
                            {"offending": _offending([(s, f) for s in flagged for f in s.findings])}, ORACLE)]
    names = [*DETECTORS, "fluency"]
    if not at_t:
        return [_no_answers(n, "coherence", ctx, t, DETECTORS_MODE) for n in names]
    out: list[CheckResult] = []
    for det in DETECTORS:
        if det in cfg.thresholds.disabled:
            out.append(CheckResult(det, "coherence", Status.SKIP, "disabled by config", t, mode=DETECTORS_MODE))
            continue
        hits = [(s, f) for s in at_t for f in s.findings if f.check == det]
        excused = [(s, f) for s, f in hits if s.reference_own]
        hits = [h for h in hits if h not in excused]
        msg = "; ".join(f"{s.label}: {f.reason} — {f.excerpt or quote(s.text)}" for s, f in hits[:6])
        if excused:
            msg = "; ".join(filter(None, [msg, f"{len(excused)} loop(s) excused, {excused[0][0].reference_own}: "
                                          + "; ".join(f"{s.label}: {f.reason}" for s, f in excused[:3])]))
        out.append(CheckResult(det, "coherence", Status.FAIL if hits else Status.PASS,
                               msg or f"{len(at_t)} answers clean ({WEAKER})", t,
                               {"offending": _offending(hits), "reference_own": [
                                   {"sample": s.label, "reason": f.reason, "why": s.reference_own,
                                    "text": s.text[:2000]} for s, f in excused]}, DETECTORS_MODE))
    out.append(_fluency(ctx, at_t, t))
    return out


def _fluency(ctx: GateContext, at_t: list[Sample], t: float) -> CheckResult:
    cfg = ctx.cfg
    if not cfg.judge.enabled:
        return CheckResult("fluency", "coherence", Status.SKIP, "disabled by config (judge.enabled: false)", t,
                           mode=DETECTORS_MODE)
    hits = [(s, f) for s in at_t for f in s.findings if f.check == "fluency"]
    short = sum(1 for s in at_t if s.fluency and s.fluency.get("judged", 0) < cfg.judge.min_tokens)
    msg = "; ".join(f"{s.label}: {f.reason} — {f.excerpt!r}" for s, f in hits[:6])
    return CheckResult("fluency", "coherence", Status.FAIL if hits else Status.PASS,
                       msg or f"{len(at_t)} answers judged fluent"
                       + (f" ({short} too short to judge)" if short else ""),
                       t, {"offending": _offending(hits), "scores": {s.label: s.fluency for s in at_t}},
                       DETECTORS_MODE)


# ------------------------------------------------------------------------------------------- determinism, variation
def _determinism_off(ctx: GateContext) -> str | None:
    return None if ctx.cfg.determinism.enabled else "disabled by config (determinism.enabled: false)"


def _determinism(purpose: str, name: str) -> Runner:
    """The suite's T=0 answer and its repeats of each determinism prompt: identical, or differing only from a
    numerical near-tie of the engine's batch-variant numerics (validation/determinism.py)."""
    def run(ctx: GateContext, t: float | None) -> list[CheckResult]:
        from sglfleet.validation.determinism import Answer, judge_repeats
        from sglfleet.validation.lossless import decode_logprobs, near_tie_rule

        dc = ctx.cfg.determinism
        rows = [decode_logprobs(s.logprobs) for s in ctx.good if s.temperature == 0 and s.logprobs
                and s.prompt_id in dc.prompt_ids]
        # the lossless check's rule (a number of the engine's log-prob grid steps) unless configured in nats
        tol = near_tie_rule(ctx.cfg.lossless, rows).limit if dc.near_tie_nats is None else dc.near_tie_nats
        msgs, ok, per = [], True, {}
        for pid in dc.prompt_ids:
            mine = [s for s in ctx.good
                    if s.prompt_id == pid and s.temperature == 0 and s.purpose in ("suite", purpose)]
            mine.sort(key=lambda s: s.purpose != "suite")  # the suite's answer first: the reference
            answers = [Answer(("suite" if s.purpose == "suite" else f"{purpose.split('-')[1]} {i}"), s.text,
                              decode_logprobs(s.logprobs) if s.logprobs else None, s.finish_reason)
                       for i, s in enumerate(mine)]
            v = judge_repeats(answers, tol)
            per[pid] = v.as_dict()
            if v.verdict == "too_few":
                return [CheckResult(name, "determinism", Status.NOT_RUN, f"{pid}: {v.message}", evidence=per)]
            ok &= v.ok
            msgs.append(f"{pid}: {v.message}")
        return [CheckResult(name, "determinism", Status.PASS if ok else Status.FAIL, "; ".join(msgs), evidence=per)]
    return run


register("determinism_sequential", "determinism", applies=_determinism_off)(
    _determinism("determinism-seq", "determinism_sequential"))
register("determinism_concurrent", "determinism", applies=_determinism_off)(
    _determinism("determinism-conc", "determinism_concurrent"))


def _variation_off(ctx: GateContext) -> str | None:
    return None if ctx.cfg.variation.enabled else "disabled by config (variation.enabled: false)"


@register("variation_distinct", "variation", applies=_variation_off)
def _variation(ctx: GateContext, t: float | None) -> list[CheckResult]:
    v = ctx.cfg.variation
    msgs, ok, n = [], True, 0
    for pid in v.prompt_ids:
        texts = [s.text for s in ctx.good if s.purpose == "variation" and s.prompt_id == pid]
        n += len(texts)
        if len(set(texts)) < v.min_distinct:
            ok = False
            msgs.append(f"{pid}: only {len(set(texts))} distinct answers from seeds {v.seeds} at T={v.temperature}")
    if not n:
        return [CheckResult("variation_distinct", "variation", Status.NOT_RUN, "no variation answer succeeded")]
    return [CheckResult("variation_distinct", "variation", Status.PASS if ok else Status.FAIL,
                        "; ".join(msgs) or "seeds give different answers")]


def _reproduce_off(ctx: GateContext) -> str | None:
    v = ctx.cfg.variation
    if not v.enabled:
        return "disabled by config (variation.enabled: false)"
    if not v.check_seed_reproducible:
        return "disabled by config (variation.check_seed_reproducible: false)"
    return ctx.seeds_ignored


@register("seed_reproducible", "variation", applies=_reproduce_off)
def _reproducible(ctx: GateContext, t: float | None) -> list[CheckResult]:
    v = ctx.cfg.variation
    msgs, ok = [], True
    for pid in v.prompt_ids:
        first = [s.text for s in ctx.good if s.purpose == "variation" and s.prompt_id == pid and s.seed == v.seeds[0]]
        again = [s.text for s in ctx.good if s.purpose == "reproduce" and s.prompt_id == pid]
        if not first or not again:
            return [CheckResult("seed_reproducible", "variation", Status.NOT_RUN,
                                f"{pid}: the seed {v.seeds[0]} answer or its repeat failed")]
        if first[0] != again[0]:
            ok = False
            msgs.append(f"{pid}: same seed {v.seeds[0]} gave different answers: "
                        + " vs ".join(quote(x, 80) for x in first[:1] + again[:1]))
    return [CheckResult("seed_reproducible", "variation", Status.PASS if ok else Status.FAIL,
                        "; ".join(msgs) or "same seed, same answer")]


# ------------------------------------------------------------------------------------------- speculative, speed
@register("spec_accept_length", "speculative")
def _spec(ctx: GateContext, t: float | None) -> list[CheckResult]:
    cfg = ctx.cfg.spec
    good = ctx.good
    per_req = [s.spec_accept_length for s in good if s.spec_accept_length is not None]
    drafted = [(s.completion_tokens or 0, s.draft_accepted or 0) for s in good if s.draft_n]
    lengths = list(per_req)
    for toks, acc in drafted:
        steps = toks - acc
        if steps > 0:
            lengths.append(toks / steps)
    after, before = ctx.spec_after, ctx.spec_before
    server_len = after.accept_length if after else None
    reported = bool(lengths) or server_len is not None
    name = "spec_accept_length"
    if cfg.enabled == "off" or (cfg.enabled == "auto" and not reported):
        return [CheckResult(name, "speculative", Status.SKIP,
                            "server reports no speculative decoding" if not reported else "disabled")]
    if not reported:
        return [CheckResult(name, "speculative", Status.FAIL, "spec.enabled=on but the server reports no accept "
                            "length (responses, /server_info, /metrics)")]
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
    return [CheckResult(name, "speculative", Status.PASS if ok else Status.FAIL, msg,
                        evidence={"per_request": lengths, "distribution": dist,
                                  "server": after.as_dict() if after else None,
                                  "server_before": before.as_dict() if before else None})]


@register("throughput", "performance")
def _throughput(ctx: GateContext, t: float | None) -> list[CheckResult]:
    good = ctx.good
    if not good:
        return [CheckResult("throughput", "performance", Status.NOT_RUN, "no successful answer to time")]
    tps = [s.tokens_per_s for s in good if s.tokens_per_s]
    ttft = [s.ttft_s for s in good if s.ttft_s is not None]
    med = (lambda xs: f"{statistics.median(xs):.3g}" if xs else "n/a")  # noqa: E731
    return [CheckResult("throughput", "performance", Status.PASS,
                        f"median TTFT {med(ttft)} s, median decode {med(tps)} tok/s over {len(good)} requests "
                        "(recorded, not gated)", evidence={"ttft_s": ttft, "tokens_per_s": tps})]


@register("depth", "depth", verdicts=("quality_accuracy", "long_copy", "speed_vs_baseline"))
def _depth(ctx: GateContext, t: float | None) -> list[CheckResult]:
    return [_from_case(c, None, None) for c in ctx.depth]


def _from_case(c: Case, t: float | None, mode: str | None) -> CheckResult:
    """A result from a Case built by a measuring helper (lossless, depth): its name kept whole."""
    status = Status.SKIP if c.skipped else (Status.NOT_RUN if c.not_run else (Status.PASS if c.ok else Status.FAIL))
    return CheckResult(c.name, c.group, status, c.message, t, dict(c.details), mode, c.time_s)


__all__ = ["DETECTORS_MODE", "ORACLE", "REGISTRY", "WEAKER", "Check", "CheckResult", "GateContext", "LosslessData",
           "Status", "explain", "register", "run_checks"]
