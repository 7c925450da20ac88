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


@pytest.mark.parametrize(("suffix", "magic"), [(".json.gz", b"\x1f\x8b"), (".json.xz", b"\xfd7zXZ\x00")])
def test_a_raw_file_named_gz_or_xz_is_written_compressed_and_read_back_the_same(tmp_path: Path, suffix: str,
                                                                                 magic: bytes) -> None:
    """write_raw compresses where the name ends in .gz or .xz (the same result, the same bytes), writes JSON text
    otherwise; raw_text reads each back to the same result (a bench once wrote plain JSON under a .gz name, which
    no reader took; .xz keeps compact separators, so its text differs but its JSON does not)."""
    result = {"runs": [{"run": 40, "verdict": "PASS"}], "gates": [{"server": "chain", "passed": True}]}
    packed, plain = tmp_path / f"r{suffix}", tmp_path / "r.json"
    write_raw(packed, result)
    first = packed.read_bytes()
    write_raw(packed, result)
    write_raw(plain, result)
    assert first[:len(magic)] == magic and packed.read_bytes() == first
    assert plain.read_text().startswith("{") and json.loads(raw_text(packed)) == json.loads(raw_text(plain)) == result
    assert suffix != ".json.gz" or raw_text(packed) == raw_text(plain)  # gzip keeps the plain file's very text
