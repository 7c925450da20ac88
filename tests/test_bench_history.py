"""bench/history.py: a raw result removed from the tree is still read by its path, from git history."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.history import raw_text, read_json, read_text, write_raw


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_a_removed_raw_file_is_read_from_the_commit_before_its_removal(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    raw = tmp_path / "docs" / "r.json"
    raw.parent.mkdir()
    raw.write_text('{"v": 1}')
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "one")
    raw.write_text('{"v": 2}')
    _git(tmp_path, "commit", "-qam", "two")
    assert read_json("docs/r.json", tmp_path) == {"v": 2}  # in the tree
    _git(tmp_path, "rm", "-q", "docs/r.json")
    assert read_json("docs/r.json", tmp_path) == {"v": 2}  # removed, not yet committed
    _git(tmp_path, "commit", "-qm", "gone")
    assert read_json("docs/r.json", tmp_path) == {"v": 2}  # removed in a commit: the one before it
    with pytest.raises(FileNotFoundError, match="never committed"):
        read_text("docs/other.json", tmp_path)


def test_a_raw_file_named_gz_is_written_compressed_and_read_back_the_same(tmp_path: Path) -> None:
    """write_raw compresses where the name ends in .gz (the same result, the same bytes), writes JSON text
    otherwise; raw_text reads either (a bench once wrote plain JSON under a .gz name, which no reader took)."""
    result = {"runs": [{"run": 40, "verdict": "PASS"}], "false_fails": {"runs": 1, "refused": 0}}
    gz, plain = tmp_path / "r.json.gz", tmp_path / "r.json"
    write_raw(gz, result)
    first = gz.read_bytes()
    write_raw(gz, result)
    write_raw(plain, result)
    assert first[:2] == b"\x1f\x8b" and gz.read_bytes() == first
    assert plain.read_text().startswith("{") and raw_text(gz) == raw_text(plain)


def test_a_raw_file_named_xz_is_written_xz_and_reads_back_the_same_result(tmp_path: Path) -> None:
    """write_raw writes .xz with the xz magic, the same bytes for the same result, and raw_text gives back the
    result the .json and .json.gz files hold (compact separators, so the text differs but the JSON does not)."""
    result = {"gates": [{"server": "chain", "passed": True, "likelihood": {"T0.6": {"per_token": {"n": 2808}}}}]}
    xz, gz = tmp_path / "r.json.xz", tmp_path / "r.json.gz"
    write_raw(xz, result)
    first = xz.read_bytes()
    write_raw(xz, result)
    write_raw(gz, result)
    assert first[:6] == b"\xfd7zXZ\x00" and xz.read_bytes() == first
    assert json.loads(raw_text(xz)) == json.loads(raw_text(gz)) == result
