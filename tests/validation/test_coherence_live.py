"""record-baseline and the gate in baseline-relative coherence mode against the real embedded model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.embedded import EmbeddedServer
from validation.config import load_gate_config
from validation.gate import run_gate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]
MINI = str(Path(__file__).with_name("fixtures") / "suite-mini.yaml")


def _profile(tmp_path: Path, reference: str) -> Path:
    f = tmp_path / f"gate-{reference}.yaml"
    f.write_text(yaml.safe_dump({"gate": {
        "suite": MINI, "temperatures": [0.0, 0.8], "concurrency": 2,
        "coherence": {"reference": reference, "seeds": [1, 2]},
        "judge": {"enabled": False}, "quality": {"enabled": False}, "long_copy": {"enabled": False},
        "determinism": {"enabled": False}, "variation": {"enabled": False}}}))
    return f


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "validation", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


def test_record_baseline_and_relative_gate(embedded_target: EmbeddedServer, tmp_path: Path) -> None:
    prof = _profile(tmp_path, "baseline")
    rec = tmp_path / "baseline.json"
    p = _cli("record-baseline", "--target", embedded_target.url, "--out", str(rec), "--config", str(prof))
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(rec.read_text())
    assert set(doc["answers"]) == {"poem", "factual", "code"}  # T=0 answers, as before
    assert sorted((s["prompt_id"], s["temperature"], s["seed"]) for s in doc["samples"]) == sorted(
        (pid, 0.8, seed) for pid in ("poem", "factual", "code") for seed in (1, 2))
    assert all(set(s) == {"prompt_id", "temperature", "seed", "text"} and s["text"] for s in doc["samples"])
    assert json.loads(p.stdout.strip().splitlines()[-1])["samples"] == 6

    cfg = load_gate_config(prof, {"lossless": {"baseline": str(rec)}})
    res = run_gate(embedded_target.url, cfg, out_dir=tmp_path / "gate")
    cases = {c.name: c for c in res.cases}
    v = cases["coherence_vs_baseline@T0.8"]
    assert v.details["candidate_n"] == 6 and v.details["baseline_n"] == 6, v.message
    assert cases["ngram_loop@T0.8"].ok and "baseline" in cases["ngram_loop@T0.8"].message
    assert "coherence_vs_baseline@T0" not in cases and cases["lossless_t0"].ok, cases["lossless_t0"].message
    same_texts = sorted(s.text for s in res.samples if s.temperature > 0) == sorted(s["text"] for s in doc["samples"])
    if same_texts:  # the same engine with the same seeds: the same answers, so no evidence of being worse
        assert v.details["candidate_flagged"] == v.details["baseline_flagged"], v.message
        # equal counts of equal n: P(X >= k) is at least one half (the hypergeometric is symmetric here)
        assert v.details["p_value"] >= 0.5 and v.ok == (v.details["rate"] <= cfg.coherence.max_rate), v.message
    report = json.loads((tmp_path / "gate" / "report.json").read_text())
    assert "coherence_vs_baseline@T0.8" in {c["name"] for c in report["cases"]}

    # a T=0-only baseline file is one clear usage error, before any request
    rec.write_text(json.dumps({k: v for k, v in doc.items() if k != "samples"}))
    p = _cli("run", "--target", embedded_target.url, "--config", str(prof), "--baseline", str(rec),
             "--out", str(tmp_path / "g2"))
    assert p.returncode == 2 and "re-record the baseline with this profile" in p.stderr, p.stderr[-2000:]

    # the default mode records T=0 only, exactly as before
    p = _cli("record-baseline", "--target", embedded_target.url, "--out", str(rec), "--config",
             str(_profile(tmp_path, "none")))
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(rec.read_text())
    assert set(doc["answers"]) == {"poem", "factual", "code"} and "samples" not in doc


def test_relative_gate_samples_a_live_baseline(embedded_target: EmbeddedServer, tmp_path: Path) -> None:
    """No baseline file but `baseline_url`: the baseline's T>0 answers are sampled live with the same seeds
    (the sweep gates its cells this way). The same engine on both sides gives the same answers."""
    cfg = load_gate_config(_profile(tmp_path, "baseline"), {
        "baseline_url": embedded_target.url, "speed": {"rounds": 1, "concurrency": [1], "max_tokens": 16}})
    res = run_gate(embedded_target.url, cfg, out_dir=tmp_path / "gate")
    v = next(c for c in res.cases if c.name == "coherence_vs_baseline@T0.8")
    assert v.details["candidate_n"] == 6 and v.details["baseline_n"] == 6, v.message
    assert v.details["candidate_flagged"] == v.details["baseline_flagged"], v.message
    assert v.ok == (v.details["rate"] <= cfg.coherence.max_rate), v.message
