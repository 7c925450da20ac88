"""Skipped checks are reported with their reason everywhere; speculative promotion needs a baseline or a waiver."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from sglfleet.pipeline.errors import UsageError
from sglfleet.pipeline.reports import Case
from sglfleet.validation.config import GateConfig, load_gate_config, lossless_requirement
from sglfleet.validation.gate import GateResult, lossless_missing_case, write_reports

WAIVER = "DDTree canary: baseline host not provisioned yet, ticket OPS-142"


def cfg(**kw: object) -> GateConfig:
    return load_gate_config(None, kw)  # type: ignore[arg-type]


def test_speculative_without_baseline_fails() -> None:
    c = cfg(spec={"enabled": "on"})
    assert lossless_requirement(c) is not None and "record-baseline" in (lossless_requirement(c) or "")
    case = lossless_missing_case(c, speculative=True)
    assert case.name == "lossless_t0" and not case.ok and not case.skipped
    assert "no lossless baseline" in case.message


def test_server_reported_speculation_counts_even_with_spec_auto() -> None:
    c = cfg()
    assert lossless_requirement(c) is None  # the config alone declares nothing
    assert not lossless_missing_case(c, speculative=True).ok  # the server reported speculative decoding


def test_disabling_lossless_on_a_speculative_deployment_is_not_a_waiver() -> None:
    c = cfg(spec={"enabled": "on"}, lossless={"enabled": False})
    assert "lossless.enabled is false" in (lossless_requirement(c) or "")
    assert not lossless_missing_case(c, speculative=True).ok


def test_explicit_waiver_is_visible() -> None:
    c = cfg(spec={"enabled": "on"}, lossless={"waiver": WAIVER})
    assert lossless_requirement(c) is None
    case = lossless_missing_case(c, speculative=True)
    assert case.skipped and WAIVER in case.message and case.details["waiver"]["reason"] == WAIVER


def test_waiver_needs_a_written_reason() -> None:
    with pytest.raises(UsageError, match="waiver"):
        cfg(lossless={"waiver": "ok"})


def test_baseline_satisfies_the_requirement(tmp_path: Path) -> None:
    assert lossless_requirement(cfg(spec={"enabled": "on"}, baseline_url="http://base:30000")) is None
    assert lossless_requirement(cfg(spec={"enabled": "on"}, lossless={"baseline": "b.json"})) is None


def test_non_speculative_without_baseline_is_skipped_with_reason() -> None:
    case = lossless_missing_case(cfg(), speculative=False)
    assert case.ok and case.skipped and "not speculative" in case.message


def test_skipped_checks_in_every_report(tmp_path: Path) -> None:
    c = cfg(spec={"enabled": "on"}, lossless={"waiver": WAIVER}, judge={"enabled": False})
    cases = [Case("char_run@T0", "coherence", True, "8 answers clean"),
             Case("fluency@T0", "coherence", True, "disabled by config (judge.enabled: false)", skipped=True),
             lossless_missing_case(c, speculative=True)]
    skipped = [{"name": x.name, "reason": x.message} for x in cases if x.skipped]
    summary = _summary(skipped_checks=skipped, waivers=[x.details["waiver"] for x in cases if x.details.get("waiver")])
    res = GateResult("http://t", "m", "llama.cpp", True, cases, [], summary)
    write_reports(res, tmp_path, c)
    report = json.loads((tmp_path / "report.json").read_text())
    names = {x["name"]: x for x in report["cases"]}
    assert names["fluency@T0"]["skipped"] and "judge.enabled: false" in names["fluency@T0"]["message"]
    assert report["summary"]["waivers"][0]["reason"] == WAIVER
    ts = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert ts is not None and ts.get("skipped") == "2"
    sk = ts.find("testcase[@name='lossless_t0']/skipped")
    assert sk is not None and WAIVER in (sk.get("message") or "")
    html = (tmp_path / "report.html").read_text()
    assert "WAIVED" in html and "judge.enabled: false" in html


def test_skipped_checks_in_the_console_table() -> None:
    from rich.console import Console

    from sglfleet.validation.gate import print_summary

    c = cfg(spec={"enabled": "on"}, lossless={"waiver": WAIVER})
    cases = [Case("fluency@T0", "coherence", True, "disabled by config (judge.enabled: false)", skipped=True),
             lossless_missing_case(c, speculative=True)]
    con = Console(record=True, width=200)
    print_summary(GateResult("http://t", "m", "llama.cpp", True, cases, [], _summary()), con)
    out = con.export_text()
    assert out.count("skip") >= 2 and "judge.enabled: false" in out and WAIVER in out


def _summary(**kw):
    from sglfleet.validation.gate import GateSummary

    base = dict(verdict="PASS", target="http://t", model="m", server_kind="llama.cpp", suite="s", temperatures=[0.0],
                verdict_mode={}, requests=0, request_errors=0, checks=0, failed_checks=[], not_run_checks=[],
                duration_s=0.0, median_ttft_s=None, median_tokens_per_s=None, spec=None, judge_s=None,
                skipped_checks=[], waivers=[])
    return GateSummary(**{**base, **kw})
