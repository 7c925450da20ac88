"""Sweep and speculative checks against real llama.cpp speculative decoding on the embedded model."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(2400)]
REPO = Path(__file__).resolve().parents[2]
MINI = str(Path(__file__).with_name("fixtures") / "suite-mini.yaml")


def _free_port_block(n: int) -> int:
    """A base port whose next n ports are free now (the sweep serves the baseline + one per cell)."""
    for base in range(18700, 19900, 10):
        free = True
        for port in range(base, base + n):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    free = False
                    break
        if free:
            return base
    raise RuntimeError("no free port block")


def test_sweep_gates_cells_and_reports_bad_cell_as_failed(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"sweep": {
        "kind": "embedded", "base": {"spec_type": "draft", "n_parallel": 2},
        # draft_max 0 is invalid: that cell must be reported failed while the matrix goes on
        "axes": {"draft_max": [4, 0]}, "port_base": _free_port_block(3),
        "gate_config": str(REPO / "src" / "sglfleet" / "validation" / "profiles" / "embedded-sweep.yaml"),
        "gate": {"suite": MINI, "temperatures": [0.0, 0.8], "variation": {"enabled": False},
                 "quality": {"enabled": False}, "max_tokens": None},
    }}))
    out = tmp_path / "sweep"
    p = subprocess.run([sys.executable, "-m", "sglfleet.validation", "sweep", "--grid", str(grid), "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "sweep.json").read_text())
    rows = {r["cell"]: r for r in summary["rows"]}
    good, bad = rows["draft_max=4"], rows["draft_max=0"]
    assert good["status"] == "passed", good
    assert good["accept_length"] and good["accept_length"] > 1.0  # real drafts were accepted
    assert good["lossless"] is True and good["speedup"] is not None
    assert bad["status"] == "error" and "invalid cell settings" in bad["error"]
    assert summary["recommendation"]["cell"] == "draft_max=4"
    assert (out / "accept_length.png").stat().st_size > 1000 and (out / "tok_s.png").is_file()
    assert "draft_max=0" in (out / "sweep.html").read_text()


def test_lossless_against_live_and_recorded_baselines(tmp_path: Path) -> None:
    """Spec (ngram) vs plain engine: identical at T=0 live; a recorded baseline that differs fails;
    a baseline serving another model is a clear usage error."""
    from sglfleet.pipeline.errors import UsageError
    from sglfleet.validation.config import load_gate_config
    from sglfleet.validation.gate import load_baseline_logprobs, run_gate

    cfg = load_gate_config(REPO / "src" / "sglfleet" / "validation" / "profiles" / "embedded-sweep.yaml", {
        "suite": MINI, "max_tokens": None, "temperatures": [0.0], "variation": {"enabled": False},
        "quality": {"enabled": False},
        "long_copy": {"enabled": False}, "spec": {"enabled": "auto"}, "speed": {"rounds": 1}})
    with EmbeddedServer(EmbeddedConfig(port=18790, n_parallel=2, spec_type="ngram"), tmp_path / "a") as cand, \
         EmbeddedServer(EmbeddedConfig(port=18791, n_parallel=2), tmp_path / "b") as base:
        live = run_gate(cand.url, cfg.model_copy(update={"baseline_url": base.url}), out_dir=tmp_path / "live")
        case = next(c for c in live.cases if c.name == "lossless_t0")
        assert case.ok, case.message
        assert any(c.name == "speed_vs_baseline@c1" for c in live.cases)

        rec = tmp_path / "baseline.json"
        cfg_file = tmp_path / "gate.yaml"
        # the profile the speculative deployment is gated with (spec on): recording the baseline from
        # the plain server with it must still work (no spec floor, no lossless check on the baseline)
        spec_on = cfg.model_dump(mode="json")
        spec_on["spec"]["enabled"] = "on"
        cfg_file.write_text(yaml.safe_dump({"gate": spec_on}))
        p = subprocess.run([sys.executable, "-m", "sglfleet.validation", "record-baseline", "--target", base.url,
                            "--out",
                            str(rec), "--config", str(cfg_file)],
                           cwd=REPO, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-2000:]
        data = json.loads(rec.read_text())
        # the real server's token log-probs spell each recorded answer (the near-tie check's input)
        lps = load_baseline_logprobs(str(rec), cfg)
        assert set(lps) == set(data["answers"])
        for pid, text in data["answers"].items():
            assert b"".join(t for t, _, _ in lps[pid]).decode() == text
        original = json.loads(json.dumps(data))
        data["answers"]["poem"] = data["answers"]["poem"][:10] + " tampered"
        rec.write_text(json.dumps(data))
        recorded = cfg.model_copy(update={"lossless": cfg.lossless.model_copy(update={"baseline": str(rec)}),
                                          "speed": cfg.speed})
        res = run_gate(cand.url, recorded, out_dir=tmp_path / "rec")
        case = next(c for c in res.cases if c.name == "lossless_t0")
        assert not case.ok and "poem: diverges at char" in case.message

        # a baseline that chose another token at a near-tie: the candidate's real answer differs from
        # there on and passes; the same difference where the baseline was sure fails
        def swapped(gap: float) -> dict:
            d = json.loads(json.dumps(original))
            rows = d["logprobs"]["poem"]
            k = next(i for i, r in enumerate(rows) if i > 0 and len(bytes.fromhex(r[0]).strip()) > 2)
            tok_hex, lp = rows[k][0], rows[k][1]
            alt = b" zebra".hex()
            rows[k] = [alt, lp, [[alt, lp], [tok_hex, lp - gap]]]
            d["logprobs"]["poem"] = rows[:k + 1]
            d["answers"]["poem"] = b"".join(bytes.fromhex(r[0]) for r in rows[:k + 1]).decode()
            return d

        for gap, ok in ((0.1, True), (2.0, False)):
            rec.write_text(json.dumps(swapped(gap)))
            res = run_gate(cand.url, recorded, out_dir=tmp_path / f"tie-{gap}")
            case = next(c for c in res.cases if c.name == "lossless_t0")
            assert case.ok is ok, case.message
            assert case.details["per_prompt"]["poem"]["verdict"] == ("near_tie" if ok else "diverged")

    with EmbeddedServer(EmbeddedConfig(port=18792, alias="other-model"), tmp_path / "c") as other, \
         EmbeddedServer(EmbeddedConfig(port=18793), tmp_path / "d") as cand2, \
         pytest.raises(UsageError, match="must serve the same model"):
        run_gate(cand2.url, cfg.model_copy(update={"baseline_url": other.url}), out_dir=tmp_path / "other")
