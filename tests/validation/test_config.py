from __future__ import annotations

from pathlib import Path

import pytest

from sglfleet.pipeline.errors import UsageError
from sglfleet.validation.config import GateConfig, load_gate_config

PROFILES = sorted((Path(__file__).resolve().parents[2] / "src" / "sglfleet" / "validation" / "profiles").glob("*.yaml"))


def test_defaults() -> None:
    cfg = GateConfig()
    assert cfg.temperatures == [0.0, 0.6, 0.8, 1.0]
    assert cfg.thresholds.max_symbol_run == 5


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_shipped_profiles_load(path: Path) -> None:
    import yaml
    from pydantic import BaseModel

    cfg = load_gate_config(path)
    assert isinstance(cfg, GateConfig)
    # Every value the profile sets under `gate:` reached the config (nothing dropped or left at a default).
    def check(node: dict, obj: BaseModel, where: str) -> None:
        for key, value in node.items():
            got = getattr(obj, key)
            if isinstance(got, BaseModel) and isinstance(value, dict):
                check(value, got, f"{where}.{key}")
            else:
                dumped = [g.model_dump() if isinstance(g, BaseModel) else g for g in got] \
                    if isinstance(got, list) else got
                assert dumped == value or str(got) == str(value), f"{where}.{key}: {got!r} != {value!r}"

    section = yaml.safe_load(path.read_text())["gate"]
    assert section, f"{path.name} sets nothing under gate:"
    check(section, cfg, path.name)


def test_override_subset_keeps_other_defaults(tmp_path: Path) -> None:
    p = tmp_path / "d.yaml"
    p.write_text("gate:\n  thresholds: {loop_min_repeats: 9}\n  temperatures: [0, 1]\n")
    cfg = load_gate_config(p)
    assert cfg.thresholds.loop_min_repeats == 9
    assert cfg.thresholds.max_symbol_run == 5
    assert cfg.temperatures == [0, 1]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gate:\n  temperatures: [0, 9]\n", "temperatures"),
        ("gate:\n  thresholds: {max_char: 3}\n", "thresholds.max_char: unknown key"),
        ("gate:\n  thresholds: {max_symbol_run: -1}\n", "thresholds.max_symbol_run"),
        ("gate:\n  spec: {enabled: maybe}\n", "spec.enabled"),
        ("gate:\n  suite: /nope.yaml\n", "prompt suite not found"),
        ("gate:\n  determinism: {prompt_ids: []}\n  concurrency: 0\n", "concurrency"),
        ("gate: [1, 2\n", "not valid YAML"),
        ("- a\n- b\n", "top level must be a mapping"),
    ],
)
def test_bad_config_is_one_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(UsageError) as exc:
        load_gate_config(p)
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg


def test_missing_config_file() -> None:
    with pytest.raises(UsageError, match="config file not found"):
        load_gate_config("/no/such/file.yaml")


def test_every_mix_entry_gets_its_share_of_the_suites_pairs() -> None:
    """The mix's entries are dealt over the suite's (prompt, T>0) pairs in a hashed order, so none is left
    without a request (by the hash alone, 24 pairs left one of six entries empty on the H200)."""
    from collections import Counter

    from sglfleet.validation.suite import load_suite

    for path in [p for p in PROFILES if p.name in ("sglang-smollm2.yaml", "sglang-ddtree.yaml")]:
        cfg = load_gate_config(path)
        hot = sorted({t for t in cfg.temperatures if t > 0})
        pairs = [(p.id, t) for t in hot for p in load_suite(cfg.suite).prompts]
        got = Counter(repr(cfg.sampling_for(pid, t).as_dict()) for pid, t in pairs)
        assert len(got) == len(cfg.sampling.mix)
        assert max(got.values()) - min(got.values()) <= 1
        # the same pair always gets the same entry: the candidate's and the baseline's requests share a law
        assert all(cfg.sampling_for(pid, t) == cfg.sampling_for(pid, t) for pid, t in pairs)
        # every entry at every temperature (the suite has at least as many prompts as the mix has entries)
        assert cfg.sampling.by_temperature
        for t in hot:
            at_t = {repr(cfg.sampling_for(pid, t).as_dict()) for pid, tt in pairs if tt == t}
            assert len(at_t) == len(cfg.sampling.mix), (path.name, t, len(at_t))
