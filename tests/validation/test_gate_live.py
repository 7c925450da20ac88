"""The gate against the real embedded model: passes its real output, rejects forced-degenerate output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglfleet.pipeline.embedded import EmbeddedServer
from sglfleet.validation.config import load_gate_config
from sglfleet.validation.gate import run_gate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
PROFILE = Path(__file__).resolve().parents[2] / "src" / "sglfleet" / "validation" / "profiles" / "embedded.yaml"


def test_gate_passes_embedded_model_at_every_temperature(embedded_target: EmbeddedServer, tmp_path: Path) -> None:
    cfg = load_gate_config(PROFILE)
    assert cfg.temperatures == [0.0, 0.6, 0.8, 1.0]
    result = run_gate(embedded_target.url, cfg, out_dir=tmp_path)
    assert result.passed, [(c.name, c.message) for c in result.failed_cases]
    names = {c.name for c in result.cases}
    for t in ("0", "0.6", "0.8", "1"):
        assert {f"char_run@T{t}", f"token_soup@T{t}", f"ngram_loop@T{t}"} <= names
    assert {"determinism_sequential", "determinism_concurrent", "variation_distinct", "finish_usage"} <= names
    for t in ("0", "0.6", "0.8", "1"):
        assert {f"fluency@T{t}", f"near_repeat@T{t}", f"mojibake@T{t}"} <= names
    skipped = {c.name: c.message for c in result.cases if c.skipped}
    assert "no baseline" in skipped["lossless_t0"] and "speed_vs_baseline" in skipped
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["verdict"] == "PASS" and report["summary"]["model"] == "smollm2-135m-instruct"
    assert (tmp_path / "junit.xml").is_file() and (tmp_path / "report.html").is_file()
    assert report["summary"]["judge_s"] > 0
    # the judge is a timed phase like the others: its wall time holds the judge's own busy time
    assert report["summary"]["phase_s"]["judge"] >= report["summary"]["judge_s"] - 0.01
    assert {x["name"] for x in report["summary"]["skipped_checks"]} >= {"lossless_t0", "speed_vs_baseline"}


def _degenerate_cfg(extra: dict) -> object:
    return load_gate_config(PROFILE, {"temperatures": [1.0], "determinism": {"enabled": False},
                                      "variation": {"enabled": False}, "max_tokens": 48,
                                      "sampling": {"top_p": 1.0, "top_k": 0, "extra": extra}})


def test_gate_rejects_huge_temperature_soup(embedded_target: EmbeddedServer, tmp_path: Path) -> None:
    # No top-p / top-k / min-p cut and a temperature of 8: the real engine emits token soup.
    cfg = _degenerate_cfg({"temperature": 8.0, "min_p": 0.0})
    result = run_gate(embedded_target.url, cfg, out_dir=tmp_path)
    assert not result.passed
    failed = {c.name for c in result.failed_cases}
    assert "token_soup@T1" in failed, failed
    soup = next(c for c in result.cases if c.name == "token_soup@T1")
    assert "not words of" in soup.message or "glued" in soup.message


def test_gate_rejects_forced_single_token(embedded_target: EmbeddedServer, tmp_path: Path) -> None:
    # Logit bias forces token 17 ("!") every step, the seeds' "The.r!!!!!!!!" failure.
    cfg = _degenerate_cfg({"logit_bias": {"17": 100}})
    result = run_gate(embedded_target.url, cfg, out_dir=tmp_path)
    assert not result.passed
    failed = {c.name for c in result.failed_cases}
    assert "char_run@T1" in failed, failed
    msg = next(c for c in result.cases if c.name == "char_run@T1").message
    assert "'!'" in msg and "!!!!" in msg


def test_a_target_that_dies_mid_gate_fails_with_named_checks_not_an_exception(tmp_path: Path) -> None:
    """The mutant's server died under sampling on the H200 (docs/incident.md run 3). A real llama.cpp target
    killed (SIGKILL) right after its first answer: the gate still writes its reports, fails, and names the
    dead target in request_errors instead of raising."""
    import io
    import signal

    from rich.console import Console

    from sglfleet.pipeline.embedded import EmbeddedConfig
    from sglfleet.pipeline.procs import free_port

    srv = EmbeddedServer(EmbeddedConfig(port=free_port()), tmp_path / "srv").start()

    class KillOnFirstAnswer(io.StringIO):
        def write(self, s: str) -> int:
            if "[suite] 1/" in s and srv.proc is not None and srv.proc.poll() is None:
                srv.proc.send_signal(signal.SIGKILL)
                srv.proc.wait(timeout=30)
            return super().write(s)

    cfg = load_gate_config(PROFILE, {"judge": {"enabled": False}, "max_tokens": 32})
    try:
        result = run_gate(srv.url, cfg, out_dir=tmp_path / "gate",
                          console=Console(file=KillOnFirstAnswer(), force_terminal=False))
    finally:
        srv.stop()
    assert not result.passed
    errors = next(c for c in result.cases if c.name == "request_errors")
    assert not errors.ok and ("cannot reach" in errors.message or "Connect" in errors.message), errors.message
    assert "request_errors" in result.summary.failed_checks
    assert (tmp_path / "gate" / "report.json").is_file() and (tmp_path / "gate" / "junit.xml").is_file()
