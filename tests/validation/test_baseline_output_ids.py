"""A recorded baseline keeps the token ids SGLang sampled for its T>0 answers, so the likelihood test can score
both sides on what was drawn (validation/likelihood.py: a text re-tokenized need not be the drawn sequence);
older records and servers without ids read as before, and malformed ids are one clear error."""

from __future__ import annotations

import pytest

from sglfleet.pipeline.errors import UsageError
from sglfleet.validation.baseline import SEED_STREAMS, from_report, samples_of, samples_record
from sglfleet.validation.config import GateConfig
from sglfleet.validation.samples import Sample
from sglfleet.validation.suite import load_suite


def _doc(cfg: GateConfig, ids: object, sampling: bool = True) -> dict:
    rows = []
    for t in sorted({t for t in cfg.temperatures if t > 0}):
        for seed in cfg.likelihood.baseline_seeds:
            for p in load_suite(cfg.suite).prompts:
                s = Sample(p.id, t, seed, "suite", 8, text="hi", finish_reason="stop",
                           output_ids=ids if isinstance(ids, list) else None,
                           sampling=cfg.sampling_for(p.id, t).as_dict() if sampling else None)
                rows.extend(samples_record([s]))
                if not isinstance(ids, list) and ids is not None:
                    rows[-1]["output_ids"] = ids
    return {"samples": rows, "seed_streams": SEED_STREAMS}


def test_sampled_ids_survive_the_record() -> None:
    cfg = GateConfig()
    got = samples_of(_doc(cfg, [12, 7, 2]), "b.json", cfg)
    assert got and all(s.output_ids == (12, 7, 2) for s in got)
    assert all(s.output_ids is None for s in samples_of(_doc(cfg, None), "b.json", cfg))
    assert from_report({"samples": [{"prompt_id": "p", "temperature": 0.8, "purpose": "suite", "text": "x",
                                     "output_ids": [3, 4]}]})[0].output_ids == (3, 4)


@pytest.mark.parametrize("bad", ["12 7", [1, "x"], [-1], [True]])
def test_malformed_ids_are_one_clear_error(bad: object) -> None:
    cfg = GateConfig()
    with pytest.raises(UsageError, match="cannot read baseline samples"):
        samples_of(_doc(cfg, bad), "b.json", cfg)


def test_sampling_parameters_survive_the_record_and_must_be_the_profiles() -> None:
    """Each recorded T>0 answer keeps the top_p / top_k / min_p it was sampled with (the per-token test's law);
    a file without them, or with another profile's, is refused: the two sides of a prompt would not share a law."""
    cfg = GateConfig()
    got = samples_of(_doc(cfg, None), "b.json", cfg)
    assert all(s.params() == cfg.sampling_for(s.prompt_id, s.temperature) for s in got)
    assert len({(s.sampling or {}).get("top_k") for s in got}) > 1  # the default mix varies them
    with pytest.raises(UsageError, match="recorded before they were kept"):
        samples_of(_doc(cfg, None, sampling=False), "b.json", cfg)
    other = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"mix": []})})
    with pytest.raises(UsageError, match="would not share a law"):
        samples_of(_doc(cfg, None), "b.json", other)
