"""The gate in oracle mode against the real embedded model: the target itself judges, at T=0 and at T>0.

A baseline is recorded from the embedded llama.cpp server (`record-baseline`), then the same server is gated
against it: every temperature is judged by the target (lossless_t0, likelihood@T under the in-process
reference model, the same SmolLM2 weights) and the build passes. The same server asked to sample from a
broken distribution (no top-p/top-k cut at a temperature of 2 where the gate asks for 0.8) is the candidate
that must fail by the target's own verdict, with the detectors only explaining.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglfleet.pipeline.embedded import EmbeddedServer
from sglfleet.validation.__main__ import main as validation_main
from sglfleet.validation.config import load_gate_config
from sglfleet.validation.gate import run_gate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
PROFILE = Path(__file__).resolve().parents[2] / "src" / "sglfleet" / "validation" / "profiles" / "embedded.yaml"
SMALL = {"temperatures": [0.0, 0.8], "max_tokens": 32, "determinism": {"enabled": False},
         "variation": {"enabled": False}, "quality": {"enabled": False}, "long_copy": {"enabled": False},
         "likelihood": {"seeds": [1234, 2345], "baseline_seeds": [4321, 5432], "power_reps": 40}}


@pytest.fixture(scope="module")
def recorded(embedded_target: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("oracle")
    cfg = d / "small.yaml"
    cfg.write_text(json.dumps({"gate": {**json.loads(json.dumps(SMALL))}}))
    out = d / "baseline.json"
    rc = validation_main(["record-baseline", "--target", embedded_target.url, "--out", str(out),
                          "--config", str(cfg)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["answers"] and doc["samples"] and all(r["seed"] in (4321, 5432) for r in doc["samples"])
    return out


def _cfg(baseline: Path, **extra: object) -> object:
    over = {**SMALL, "lossless": {"baseline": str(baseline)}, **extra}
    if "sampling" in extra:  # a broken candidate: its verdict, not the power estimate, is what is tested
        over["likelihood"] = {**SMALL["likelihood"], "power_reps": 0}
    return load_gate_config(PROFILE, over)


def test_the_correct_engine_passes_with_the_target_deciding_every_temperature(
        embedded_target: EmbeddedServer, recorded: Path, tmp_path: Path) -> None:
    result = run_gate(embedded_target.url, _cfg(recorded), out_dir=tmp_path)
    assert result.passed, [(c.name, c.message) for c in result.failed_cases]
    modes = result.summary.verdict_mode
    assert modes["T0"].startswith("oracle") and modes["T0.8"].startswith("oracle"), modes
    cases = {c.name: c for c in result.cases}
    assert cases["lossless_t0"].ok and not cases["lossless_t0"].skipped
    lik = cases["likelihood@T0.8"]
    assert lik.ok and not lik.skipped and lik.details["n_candidate"] == 16 and lik.details["n_baseline"] == 16
    # llama.cpp names the sampled ids in its log-prob entries; the record keeps them; both sides are scored on them
    # (an answer holding a character drawn as several tokens has none and is scored on its text)
    assert lik.details["on_ids"]["candidate"] >= 8 and lik.details["on_ids"]["baseline"] >= 8, lik.details["on_ids"]
    assert "on the ids the servers sampled" in lik.message
    doc = json.loads(recorded.read_text())
    assert sum(1 for r in doc["samples"] if r.get("output_ids")) >= 8
    assert lik.details["power"]["estimated"], lik.details["power"]
    assert cases["detectors@T0.8"].skipped and "oracle mode" in cases["detectors@T0.8"].message
    assert "fluency@T0.8" not in cases  # the judge does not decide where the target does
    # the per-token statistics pooled over the T>0 temperatures: one verdict, run and passed on real answers
    pooled = cases["likelihood_pooled"]
    assert pooled.ok and not pooled.skipped and pooled.details["pooled"]["temperatures"] == 1, pooled.message
    # the outside count by truncation ran too, over the cuts the default mix turns on
    assert {"top_p", "top_k", "min_p"} & set(pooled.details["pooled"]["cuts"]), pooled.details["pooled"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["verdict_mode"] == modes
    # the interleaved suite ran with greedy companions beside it, counted in the summary
    assert report["summary"]["companion_requests"] == result.summary.companion_requests > 0
    # where the time went: every phase this gate ran, each within the whole (the rest is set-up)
    phases = report["summary"]["phase_s"]
    assert {"requests", "likelihood", "lossless", "checks"} <= set(phases), phases
    assert "baseline" not in phases, phases  # a baseline file: no live baseline's answers to fetch
    # the profile's judge is on, but the target decides every temperature: no judge started, no judge phase
    assert result.summary.judge_s is None and "judge" not in phases, phases
    assert all(v >= 0 for v in phases.values()) and phases["requests"] > 0 and phases["likelihood"] > 0
    assert sum(phases.values()) <= report["summary"]["duration_s"] + 0.05, (phases, report["summary"]["duration_s"])


@pytest.mark.parametrize("extra", [
    # the sampler draws at T=2 with no cut while the request says 0.8: not the target's distribution at 0.8
    {"temperature": 2.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0},
])
def test_a_distribution_that_is_not_the_targets_fails_by_the_targets_likelihood(
        embedded_target: EmbeddedServer, recorded: Path, tmp_path: Path, extra: dict) -> None:
    cfg = _cfg(recorded, sampling={"top_p": 0.95, "extra": extra})
    result = run_gate(embedded_target.url, cfg, out_dir=tmp_path)
    assert not result.passed
    failed = {c.name for c in result.failed_cases}
    assert "likelihood@T0.8" in failed, failed
    lik = next(c for c in result.cases if c.name == "likelihood@T0.8")
    assert lik.details["support"]["impossible"] or lik.details["p_value"] < lik.details["alpha"], lik.message
