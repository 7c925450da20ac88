"""bench/detector_diff.py: the detectors of a revision against the working tree, on stored items."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "bench" / "detector_diff.py"), *args], capture_output=True,
                          text=True, cwd=REPO)


def test_same_revision_flips_nothing_and_bad_input_is_exit_2(tmp_path: Path) -> None:
    items = [{"id": "a", "label": "ok", "class": "ok/x", "text": "The cat sat on the mat and looked at the rain."},
             {"id": "b", "label": "bad", "class": "bad/x", "text": "The cat sat " + "0" * 90}]
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"items": items}))
    out = tmp_path / "o.json"
    p = _run("--base", "HEAD", str(f), "--out", str(out))
    assert p.returncode == 0, p.stderr
    got = json.loads(out.read_text())
    assert got["items"] == 2 and got["flips"] == [] and got["coherent_now_flagged"] == 0
    (tmp_path / "bad.json").write_text("{}")
    p = _run("--base", "HEAD", str(tmp_path / "bad.json"))
    assert p.returncode == 2 and "not a gate_families result" in p.stderr
    p = _run("--base", "no-such-revision-xyz", str(f))
    assert p.returncode != 0 and "no textscore/detectors.py at" in p.stderr
