"""bench/drafter_recipe.py: the drafter recipes side by side on one corpus, the best held-out one exported as the
drafter (the H200's trainwarm step runs it at scale); here on the embedded SmolLM2 at a tiny scale, and its table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench import drafter_recipe


@pytest.mark.parametrize("args", [["--seeds", "x"], ["--variants", "uniform,bogus"], ["--steps", "0"],
                                  ["--decay", "0"], ["--seconds-per-variant", "0"], ["--target", "/nonexistent"]])
def test_bad_input_is_one_error_and_nothing_written(args, tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.json"
    assert drafter_recipe.main(["--out", str(out), *args]) == 2
    assert "error:" in capsys.readouterr().err and not out.exists()


def _tiny_run(out: Path, best: Path, variants: str) -> int:
    """The bench on the embedded SmolLM2 at the smallest scale: 6 sequences, 2 steps, one seed."""
    return drafter_recipe.main(["--out", str(out), "--seqs", "6", "--max-new", "16", "--gen-batch", "6", "--steps",
                                "2", "--anchors", "2", "--seqs-per-step", "2", "--seeds", "0", "--variants", variants,
                                "--export-best", str(best)])


@pytest.mark.slow
def test_every_variant_trains_on_one_corpus_and_the_best_held_out_one_is_exported(tmp_path: Path) -> None:
    out, best = tmp_path / "r.json", tmp_path / "best"
    rc = _tiny_run(out, best, "uniform,decay+init")
    assert rc == 0
    raw = json.loads(out.read_text())
    assert [r["variant"] for r in raw["rows"]] == ["uniform", "decay+init"]
    assert raw["corpus"]["seqs"] == 6 and raw["suite"]["answers"] >= 8
    for k in ("command", "date", "machine", "commit"):
        assert raw[k]
    held = {r["variant"]: r["held_out"]["accept_length"] for r in raw["rows"]}
    assert raw["exported"]["variant"] == max(held, key=lambda v: (held[v], v == "uniform"))
    report = json.loads((best / "train.json").read_text())
    assert report["variant"] == raw["exported"]["variant"] and "offline_suite" in report
    assert (best / "model.safetensors").is_file()
    text = drafter_recipe.render(raw, "r.json")
    assert "| uniform | 1 | 2 |" in text and "| decay+init | 1 | 2 |" in text and "Exported:" in text


@pytest.mark.slow
def test_a_failing_variant_keeps_the_others_and_the_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One variant failing on the device (out of memory: a RuntimeError from torch) must not lose the call's drafter:
    its row records the error and the best of the others is exported. The failure is injected into the decay
    variant's training here; the device's own failure cannot run on the CPU."""
    from testbed.models import dflash_train

    real_train = dflash_train.train

    def train(*args, **kw):
        if kw.get("position_decay"):
            raise RuntimeError("CUDA out of memory (injected)")
        return real_train(*args, **kw)

    monkeypatch.setattr(dflash_train, "train", train)
    out, best = tmp_path / "r.json", tmp_path / "best"
    rc = _tiny_run(out, best, "decay,uniform")
    assert rc == 0
    raw = json.loads(out.read_text())
    assert raw["rows"][0]["variant"] == "decay" and "out of memory" in raw["rows"][0]["error"]
    assert raw["exported"]["variant"] == "uniform" and (best / "model.safetensors").is_file()
    text = drafter_recipe.render(raw, "r.json")
    assert "| decay (seed 0) | failed: RuntimeError: CUDA out of memory (injected) |" in text
    assert "| uniform | 1 | 2 |" in text
