"""Baseline-relative coherence at T>0 (validation/coherence.py): config, Fisher's exact test, the default
zero-tolerance mode unchanged, and the relative judging on the real SGLang gate samples of 2026-12-01."""

from __future__ import annotations

import json
import tarfile
from fractions import Fraction
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.errors import UsageError
from validation.__main__ import _hot_case
from validation.coherence import (
    BaselineSample,
    baseline_from_report,
    baseline_samples_record,
    fisher_exact_greater,
    load_baseline_samples,
    relative_coherence_cases,
    rescored_sample,
    suite_seeds,
)
from validation.config import GateConfig, load_gate_config
from validation.detectors import score_text
from validation.gate import Gate, Sample

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
TGZ = RESULTS / "incident-gates-samples-2026-12-01.tgz"
BASE_REPORT = RESULTS / "incident-gate-base-2026-12-01.json"
PROFILE = REPO / "validation" / "profiles" / "sglang-smollm2.yaml"
LOOP = "The sea is blue. " * 30  # ngram_loop (and near_repeat) on any thresholds
CLEAN = "The ocean is wide and deep, and its waves roll slowly onto the quiet sandy shore."


def relative(**coh: object) -> GateConfig:
    return GateConfig(coherence={"reference": "baseline", **coh}, judge={"enabled": False})


# ---------------------------------------------------------------- config
def test_default_is_zero_tolerance_and_only_the_135m_profile_opts_in() -> None:
    c = GateConfig().coherence
    assert c.reference == "none" and c.seeds == [1234, 2345, 3456] and c.alpha == 0.01 and c.max_rate == 0.34
    assert suite_seeds(GateConfig(), 0.8) == [1234]
    assert load_gate_config(PROFILE).coherence.reference == "baseline"
    for other in ("embedded.yaml", "embedded-sweep.yaml", "sglang-ddtree.yaml"):
        assert load_gate_config(REPO / "validation" / "profiles" / other).coherence.reference == "none"


@pytest.mark.parametrize(("coh", "needle"), [
    ({"seeds": []}, "must not be empty"),
    ({"seeds": [1, 2, 1]}, "must be distinct"),
    ({"alpha": 0}, "alpha"),
    ({"alpha": 1}, "alpha"),
    ({"max_rate": 0}, "max_rate"),
    ({"reference": "sometimes"}, "reference"),
])
def test_config_rejects(coh: dict, needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        GateConfig(coherence={"reference": "baseline", **coh})


def test_seeds_only_matter_in_baseline_mode() -> None:
    assert GateConfig(coherence={"seeds": []}).coherence.seeds == []  # reference none: unused, not an error
    cfg = relative(seeds=[5, 6])
    assert suite_seeds(cfg, 0.0) == [cfg.seed] and suite_seeds(cfg, 0.6) == [5, 6]


def test_profile_without_baseline_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="record-baseline --config PROFILE"):
        Gate("http://127.0.0.1:9", relative())
    Gate("http://127.0.0.1:9", relative(), recording_baseline=True)  # the baseline itself needs none


# ---------------------------------------------------------------- Fisher's exact test
@pytest.mark.parametrize(("counts", "exact"), [
    ((3, 4, 1, 4), Fraction(17, 70)),  # Fisher's tea-tasting lady: 3 of 4 right, one-sided p = 17/70
    ((6, 8, 1, 5), Fraction(111, 1287)),  # [[6, 2], [1, 4]]: scipy's fisher_exact(alternative="greater") 0.0862
    ((7, 8, 0, 8), Fraction(8, 11440)),  # C(8,7) / C(16,7): the mutant at T=0.6
    ((2, 8, 0, 8), Fraction(3003, 12870)),  # C(14,6) / C(16,8) = 7/30
    ((8, 8, 0, 8), Fraction(1, 12870)),
    ((0, 8, 3, 8), Fraction(1)),
    ((1, 8, 1, 8), Fraction(1) - Fraction(7, 30)),  # 1 - P(X=0) = 1 - C(14,8)/C(16,8)
])
def test_fisher_exact_against_hand_computed(counts: tuple[int, int, int, int], exact: Fraction) -> None:
    assert fisher_exact_greater(*counts) == pytest.approx(float(exact), rel=1e-12)


def test_fisher_exact_bad_counts() -> None:
    with pytest.raises(ValueError, match="bad counts"):
        fisher_exact_greater(3, 2, 0, 4)


# ---------------------------------------------------------------- judging
def sample(pid: str, t: float, seed: int, text: str, purpose: str = "suite") -> Sample:
    return Sample(pid, t, seed, purpose, 64, text=text, finish_reason="stop", prompt_tokens=5,
                  completion_tokens=20, findings=score_text(text))


def judge(cfg: GateConfig, samples: list[Sample], baseline: list[BaselineSample] | None = None) -> dict:
    cfg = cfg.model_copy(update={"determinism": cfg.determinism.model_copy(update={"enabled": False}),
                                 "variation": cfg.variation.model_copy(update={"enabled": False}),
                                 "judge": cfg.judge.model_copy(update={"enabled": False}),
                                 "baseline_url": "http://127.0.0.1:9", "temperatures": [0.0, 0.8]})
    gate = Gate("http://127.0.0.1:9", cfg)
    gate.baseline_samples = baseline
    return {c.name: c for c in gate._judge(samples, None, None)}


def test_default_mode_single_hit_still_fails() -> None:
    samples = [sample("poem", 0.0, 1234, CLEAN), sample("poem", 0.8, 1234, LOOP), sample("code", 0.8, 1234, CLEAN)]
    cases = judge(GateConfig(), samples)
    assert not cases["ngram_loop@T0.8"].ok and "poem@T0.8/seed1234" in cases["ngram_loop@T0.8"].message
    assert cases["ngram_loop@T0"].ok and "coherence_vs_baseline@T0.8" not in cases


def test_relative_mode_counts_and_verdict_in_the_gate() -> None:
    seeds = [1, 2, 3]
    cand = [sample("poem", 0.0, 1234, CLEAN)] + [sample(p, 0.8, s, CLEAN) for p in ("poem", "code") for s in seeds]
    cand[1] = sample("poem", 0.8, 1, LOOP)
    base = [BaselineSample(p, 0.8, s, LOOP if (p, s) == ("code", 2) else CLEAN) for p in ("poem", "code")
            for s in seeds]
    cases = judge(relative(seeds=seeds), cand, base)
    det = cases["ngram_loop@T0.8"]
    assert det.ok and det.message.startswith("1 of 6 answers; baseline 1 of 6") and "poem@T0.8/seed1" in det.message
    verdict = cases["coherence_vs_baseline@T0.8"]
    assert verdict.ok and verdict.details["p_value"] == pytest.approx(1 - 5 / 22)  # 1 - P(X=0) = 1 - C(10,6)/C(12,6)
    # T=0 keeps zero tolerance: one hit there fails even in relative mode
    cand[0] = sample("poem", 0.0, 1234, LOOP)
    assert not judge(relative(seeds=seeds), cand, base)["ngram_loop@T0"].ok


def test_relative_verdict_fails_significant_or_over_cap_and_quotes() -> None:
    cfg = relative(seeds=list(range(10)))
    base = [BaselineSample("poem", t, s, CLEAN) for t in (0.6, 0.8, 1.0) for s in range(10)]
    bad = [sample("poem", 0.8, s, LOOP if s < 8 else CLEAN) for s in range(10)]
    v = {c.name: c for c in relative_coherence_cases(bad, base, cfg)}["coherence_vs_baseline@T0.8"]
    assert not v.ok and v.details["significant"] and v.details["over_max_rate"]
    assert "significantly worse" in v.message and "8 of 10 answers flagged" in v.message
    assert "poem@T0.8/seed0: ngram_loop" in v.message and "the sea is blue" in v.message
    # 4 of 10 vs 0 of 10: p = C(10,4)/C(20,4) = 0.0433 is no evidence after Bonferroni, but 40 % > max_rate
    capped = [sample("poem", 0.8, s, LOOP if s < 4 else CLEAN) for s in range(10)]
    v = {c.name: c for c in relative_coherence_cases(capped, base, cfg)}["coherence_vs_baseline@T0.8"]
    assert not v.ok and not v.details["significant"] and "over max_rate 0.34" in v.message
    # no candidate answer at a configured temperature is a failure, never a pass
    v = {c.name: c for c in relative_coherence_cases(bad, base, cfg)}["coherence_vs_baseline@T0.6"]
    assert not v.ok and "no suite answers" in v.message


def test_baseline_samples_record_and_loader(tmp_path: Path) -> None:
    cfg = relative(seeds=[1, 2]).model_copy(update={"temperatures": [0.0, 0.8]})
    from validation.suite import load_suite

    prompts = [p.id for p in load_suite(cfg.suite).prompts]
    got = [sample(p, 0.0, 1234, CLEAN) for p in prompts] + [sample(p, 0.8, s, CLEAN) for p in prompts for s in (1, 2)]
    rows = baseline_samples_record(got)
    assert len(rows) == 2 * len(prompts) and set(rows[0]) == {"prompt_id", "temperature", "seed", "text"}
    doc = {"model": "m", "suite": "suite-v1.yaml", "max_tokens": None, "answers": {}, "samples": rows}
    f = tmp_path / "b.json"
    f.write_text(json.dumps(doc))
    assert len(load_baseline_samples(str(f), "m", cfg)) == len(rows)
    with pytest.raises(UsageError, match=r"lacks 8 of the 24 T>0 samples.*re-record the baseline with this profile"):
        load_baseline_samples(str(f), "m", cfg.model_copy(update={"coherence": cfg.coherence.model_copy(
            update={"seeds": [1, 2, 3]})}))
    f.write_text(json.dumps({k: v for k, v in doc.items() if k != "samples"}))  # a T=0-only baseline
    with pytest.raises(UsageError, match=r"no T>0 samples.*re-record the baseline with this profile"):
        load_baseline_samples(str(f), "m", cfg)
    f.write_text(json.dumps({**doc, "model": "other"}))
    with pytest.raises(UsageError, match="recorded for model 'other'"):
        load_baseline_samples(str(f), "m", cfg)


def test_record_baseline_refuses_only_t0_and_other_failures() -> None:
    assert _hot_case("ngram_loop@T0.8") and _hot_case("coherence_vs_baseline@T1")
    assert not _hot_case("ngram_loop@T0") and not _hot_case("finish_usage") and not _hot_case("speed_vs_baseline@c1")


# ---------------------------------------------------------------- the real SGLang gate samples (2026-12-01)
@pytest.fixture(scope="module")
def real_gates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    out = tmp_path_factory.mktemp("gates")
    with tarfile.open(TGZ) as tf:
        tf.extractall(out, filter="data")
    return {d.name: [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines() if x.strip()]
            for d in sorted((out / "gates").iterdir())}


def test_real_builds_relative_to_the_target_only_server(real_gates: dict[str, list[dict]]) -> None:
    cfg = load_gate_config(PROFILE)
    base = baseline_from_report(json.loads(BASE_REPORT.read_text()))
    assert len(base) == 24 and {b.seed for b in base} == {1234}
    verdicts = {}
    for server, rows in real_gates.items():
        cand = [rescored_sample(r, cfg) for r in rows if r["purpose"] == "suite"]
        assert sum(1 for s in cand if s.temperature > 0) == 24  # one seed: 8 answers per temperature
        cases = [c for c in relative_coherence_cases(cand, base, cfg) if c.name.startswith("coherence_vs_baseline")]
        assert [c.name for c in cases] == ["coherence_vs_baseline@T0.6", "coherence_vs_baseline@T0.8",
                                           "coherence_vs_baseline@T1"]
        verdicts[server] = all(c.ok for c in cases)
    correct = [s for s in verdicts if s == "chain" or s.startswith("patched-")]
    assert len(correct) == 11  # chain + 10 patched DDTree servers
    assert all(verdicts[s] for s in correct), {s: verdicts[s] for s in correct}
    assert verdicts["mutant-b16-k4"] is False


def test_real_zero_tolerance_fails_correct_builds(real_gates: dict[str, list[dict]]) -> None:
    """Why the mode exists: with zero tolerance every correct build of that run fails some T>0 case."""
    cfg = load_gate_config(PROFILE)
    for server, rows in real_gates.items():
        if server == "chain" or server.startswith("patched-"):
            hot = [rescored_sample(r, cfg) for r in rows if r["purpose"] == "suite" and r["temperature"] > 0]
            assert 1 <= sum(1 for s in hot if s.findings) <= 4, server  # of 24
