"""The Makefile's surface: `make help` groups every documented target by stage, one name per knob
(GATE_CONFIG, LOADTEST_CONFIG; CONFIG= still works with one warning line), and the production sequence's
targets pass what they are given. `make -n` prints the recipes without running them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKEFILES = [ROOT / "Makefile", *sorted((ROOT / "mk").glob("*.mk"))]


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=False, timeout=60)


def _documented() -> dict[str, str]:
    out = {}
    for f in MAKEFILES:
        for line in f.read_text().splitlines():
            m = re.match(r"^([a-zA-Z0-9_.-]+):.*?## (.*)$", line)
            if m:
                out[m.group(1)] = m.group(2)
    return out


def test_every_documented_target_has_a_known_group() -> None:
    groups = re.search(r"^HELP_GROUPS := (.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert groups
    known = groups.group(1).split()
    bad = {t: d for t, d in _documented().items()
           if not (m := re.match(r"\[([a-z]+)\] ", d)) or m.group(1) not in known}
    assert not bad, f"targets without a group of HELP_GROUPS ({' '.join(known)}): {bad}"


def test_help_lists_every_documented_target_once_under_its_group() -> None:
    r = _make("-s", "help")
    assert r.returncode == 0, r.stderr
    heading, seen = None, {}
    for line in r.stdout.splitlines():
        if not line.startswith(" "):
            heading = line.rstrip(":")
            continue
        seen.setdefault(line.split()[0], []).append(heading)
    documented = _documented()
    assert set(seen) == set(documented)
    assert all(len(v) == 1 for v in seen.values()), {k: v for k, v in seen.items() if len(v) > 1}
    assert seen["deploy"] == ["deploy / rollout"] and seen["validate"] == ["validation"]
    assert seen["bench-loadtest"][0].startswith("lab") and seen["lint"] == ["CI"]


@pytest.mark.parametrize("target,extra,flag", [
    ("validate", ["TARGET=http://h:1"], "--config g.yaml"),
    ("record-baseline", ["TARGET=http://h:1", "OUT=b.json"], "--config g.yaml"),
    ("check-text", ["FILE=t.jsonl"], "--config g.yaml"),
])
def test_gate_config_is_the_gate_knob_and_config_its_deprecated_alias(target: str, extra: list[str],
                                                                      flag: str) -> None:
    new = _make("-n", target, *extra, "GATE_CONFIG=g.yaml")
    assert new.returncode == 0 and flag in new.stdout and "deprecated" not in new.stderr, new.stderr
    old = _make("-n", target, *extra, "CONFIG=g.yaml")
    assert old.returncode == 0 and flag in old.stdout
    warnings = [ln for ln in old.stderr.splitlines() if "deprecated" in ln]
    assert len(warnings) == 1 and "GATE_CONFIG" in warnings[0]


def test_the_endpoint_is_target_for_every_stage_and_host_as_a_url_still_works_with_one_warning() -> None:
    old = _make("-n", "loadtest", "HOST=http://h:1")
    assert old.returncode == 0 and '--host "http://h:1"' in old.stdout
    assert sum("use TARGET=http://h:1" in ln for ln in old.stderr.splitlines()) == 1


def test_loadtest_config_is_the_loadtest_knob() -> None:
    new = _make("-n", "loadtest", "TARGET=http://h:1", "LOADTEST_CONFIG=l.yaml")
    assert new.returncode == 0 and "--config l.yaml" in new.stdout and "deprecated" not in new.stderr
    assert '--host "http://h:1"' in new.stdout
    old = _make("-n", "capacity", "TARGET=http://h:1", "CONFIG=l.yaml")
    assert "--config l.yaml" in old.stdout and sum("deprecated" in ln for ln in old.stderr.splitlines()) == 1


def test_the_production_sequence_targets_pass_their_arguments() -> None:
    spec = _make("-n", "deploy", "HOST=pcie", "IMAGE=r.example/x:1", "GATE_CONFIG=g.yaml", "BASELINE=b.json",
                 "LOADTEST_CONFIG=slo.yaml")
    assert spec.returncode == 0, spec.stderr
    assert re.search(r'-m sglfleet.flow deploy --hosts "pcie" .*--image "r.example/x:1" --gate-config "g.yaml" '
                     r'--baseline "b.json" --loadtest-config "slo.yaml"', spec.stdout), spec.stdout
    only = _make("-n", "deploy-target-only", "HOST=pcie-01", "IMAGE=r.example/x:1")
    assert only.returncode == 0 and '--image "r.example/x:1" --target-only' in only.stdout
    image = _make("-n", "image", "TARGET=pcie", "PUSH=r.example/fleet", "RC=7")
    assert image.returncode == 0
    flat = image.stdout.replace("\\\n", " ")
    assert re.search(r'-m sglfleet.images build --target "pcie" .*--push "r.example/fleet"\s+--rc 7',
                     flat), image.stdout
    gate = _make("-n", "validate", "TARGET=http://h:1", "GATE_CONFIG=g.yaml", "BASELINE=b.json")
    assert gate.returncode == 0 and re.search(r"--config g.yaml .*--baseline b.json", gate.stdout.replace("\\\n", " "))


@pytest.mark.parametrize("args,message", [
    (["deploy", "IMAGE=r.example/x:1"], "error: set HOST="),
    (["deploy-target-only", "HOST=pcie-01"], "error: set IMAGE="),
])
def test_missing_host_or_image_is_one_error_line_and_exit_2(args: list[str], message: str) -> None:
    r = _make(*args)
    assert r.returncode == 2
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == [ln for ln in r.stderr.splitlines()
                                                                              if message in ln]
