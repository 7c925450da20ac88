"""bench/history.py: a raw result removed from the tree is still read by its path, from git history."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.history import read_json, read_text


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
