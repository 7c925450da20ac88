from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from sglfleet.pipeline.reports import Case, write_html, write_json, write_junit


def test_junit_counts_and_failure_text(tmp_path: Path) -> None:
    cases = [Case("a", "g", True, "fine"), Case("b", "g", False, "bad <x>", {"text": "!!!"}),
             Case("c", "g", True, "off", skipped=True)]
    p = write_junit(tmp_path / "j.xml", "suite", cases)
    ts = ET.parse(p).getroot().find("testsuite")
    assert ts is not None
    assert (ts.get("tests"), ts.get("failures"), ts.get("skipped")) == ("3", "1", "1")
    fail = ts.find("testcase[@name='b']/failure")
    assert fail is not None and fail.get("message") == "bad <x>" and "!!!" in (fail.text or "")


def test_json_redacts_secrets(tmp_path: Path) -> None:
    p = write_json(tmp_path / "r.json", {"hf_token": "hf_abc", "nested": {"registry_password": "pw", "port": 1},
                                         "api_key": "", "cases": [Case("a", "g", True)]})
    data = json.loads(p.read_text())
    assert data["hf_token"] == "***" and data["nested"]["registry_password"] == "***"
    assert data["nested"]["port"] == 1 and data["cases"][0]["name"] == "a"
    assert "hf_abc" not in p.read_text() and "pw" not in p.read_text()


def test_token_counts_are_not_redacted(tmp_path: Path) -> None:
    p = write_json(tmp_path / "r.json", {"completion_tokens": 12, "max_tokens": 64, "HF_TOKEN": "x",
                                         "Authorization": "Bearer y", "access_token": "z"})
    data = json.loads(p.read_text())
    assert data["completion_tokens"] == 12 and data["max_tokens"] == 64
    assert data["HF_TOKEN"] == data["Authorization"] == data["access_token"] == "***"


def test_html_escapes_quotes(tmp_path: Path) -> None:
    p = write_html(tmp_path / "r.html", "t", verdict="FAIL", cases=[Case("x", "g", False, "<script>!!!</script>")])
    body = p.read_text()
    assert "<script>!!!" not in body and "&lt;script&gt;!!!" in body and "FAIL" in body


def test_html_puts_the_verdict_and_failed_checks_first_and_nested_values_readable(tmp_path: Path) -> None:
    cases = [Case("ok_check", "g", True, "fine"), Case("bad_check", "g", False, "it broke"),
             Case("off", "g", True, "disabled", skipped=True)]
    p = write_html(tmp_path / "r.html", "gate", verdict="FAIL", cases=cases,
                   summary={"verdict_mode": {"T0": "oracle"}, "failed_checks": ["bad_check"], "hf_token": "s3cret"})
    body = p.read_text()
    failed_at, summary_at, every_at = body.index("Failed checks"), body.index("Summary"), body.index("Every check")
    assert failed_at < summary_at < every_at and body.index("it broke") < summary_at
    assert "3 checks: 1 passed, 1 failed, 1 skipped" in body
    assert "{'T0'" not in body and "<b>T0</b>: oracle" in body  # no raw Python dicts
    assert "s3cret" not in body
