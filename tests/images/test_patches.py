"""The patch series tooling against the real sglang 0.5.23 sources from PyPI, with real GNU patch.

Patches used here are generated in tmp dirs from the real upstream file contents (difflib), so
they are real unified diffs against real code; nothing is applied to the committed series.
"""

from __future__ import annotations

import difflib
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglfleet.patches import (
    DEFAULT_CACHE,
    PatchError,
    apply_series,
    fetch_sglang,
    load_series,
    series_dir_for,
)

pytestmark = pytest.mark.network  # downloads sglang from PyPI (cached after the first run)

REPO = Path(__file__).resolve().parents[2]
TARGET_FILE = "sglang/srt/utils/common.py"
TEST_REF = "tests/images/test_patches.py"


@pytest.fixture(scope="module")
def upstream() -> Path:
    """Directory containing the real, unpatched sglang/ package of the pinned version."""
    return fetch_sglang("0.5.23", DEFAULT_CACHE)


@pytest.fixture
def tree(upstream: Path, tmp_path: Path) -> Path:
    """A private copy of the files the tests patch (the real upstream contents)."""
    root = tmp_path / "site"
    for rel in (TARGET_FILE, "sglang/srt/layers/attention/triton_backend.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(upstream / rel, root / rel)
    return root


def make_diff(root: Path, rel: str, edit) -> str:
    old = (root / rel).read_text().splitlines(keepends=True)
    new = edit(list(old))
    return "".join(difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}"))


def replace_line(needle: str, repl: str):
    def edit(lines: list[str]) -> list[str]:
        idx = next(i for i, line in enumerate(lines) if needle in line)
        lines[idx] = lines[idx].replace(needle, repl)
        return lines
    return edit


def write_series(tmp_path: Path, patches: dict[str, str], manifest: str | None = None) -> Path:
    d = tmp_path / "series" / "sglang-0.5.23"
    d.mkdir(parents=True)
    for name, text in patches.items():
        (d / name).write_text(text)
    (d / "series").write_text("# test series\n" + "".join(f"{n}\n" for n in patches))
    if manifest is None:
        manifest = "".join(
            f"- file: {n}\n  purpose: test patch generated from upstream source\n"
            f"  upstream: none\n  test: {TEST_REF}\n" for n in patches)
    (d / "manifest.yaml").write_text(manifest)
    return d


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


SET_ARCH = 'os.environ["FLASHINFER_CUDA_ARCH_LIST"] = ('


def test_committed_series_is_valid_and_applies_to_pinned_sources(upstream: Path) -> None:
    series = load_series(series_dir_for("0.5.23"))
    assert series.version == "0.5.23"
    assert not series.unlisted, f"patch files missing from series: {series.unlisted}"
    rep = apply_series(series, upstream, dry_run=True)
    assert rep.ok, [(r.name, r.problem) for r in rep.results if not r.ok]
    assert len(rep.results) == len(series.patches)


def test_real_patch_applies_with_zero_fuzz(tree: Path, tmp_path: Path) -> None:
    diff = make_diff(tree, TARGET_FILE, replace_line(SET_ARCH, 'os.environ["FLASHINFER_CUDA_ARCH_LIST"] = str(('))
    series = load_series(write_series(tmp_path, {"0001-test-edit.patch": diff}))
    rep = apply_series(series, tree)
    assert rep.ok and rep.results[0].offsets == []
    assert 'os.environ["FLASHINFER_CUDA_ARCH_LIST"] = str((' in (tree / TARGET_FILE).read_text()


def test_patch_needing_fuzz_is_rejected_and_tree_untouched(tree: Path, tmp_path: Path) -> None:
    diff = make_diff(tree, TARGET_FILE, replace_line(SET_ARCH, 'os.environ["FLASHINFER_CUDA_ARCH_LIST"] = str(('))
    # Upstream drifted: the line right above the change differs now (context mismatch -> fuzz 1).
    text = (tree / TARGET_FILE).read_text()
    assert "        arch = f\"{capability[0]}.{capability[1]}\"\n" in text
    (tree / TARGET_FILE).write_text(text.replace("        arch = f\"{capability[0]}.{capability[1]}\"\n",
                                                 "        arch = f\"{capability[0]}.{capability[1]}\"  # drift\n"))
    before = digest(tree)
    series = load_series(write_series(tmp_path, {"0001-test-edit.patch": diff}))
    rep = apply_series(series, tree)
    assert not rep.ok
    assert "FAILED" in rep.results[0].problem or "fuzz" in rep.results[0].problem
    assert digest(tree) == before
    assert not list(tree.rglob("*.rej")) and not list(tree.rglob("*.orig"))


def test_already_applied_patch_fails(tree: Path, tmp_path: Path) -> None:
    diff = make_diff(tree, TARGET_FILE, replace_line(SET_ARCH, 'os.environ["FLASHINFER_CUDA_ARCH_LIST"] = str(('))
    series = load_series(write_series(tmp_path, {"0001-test-edit.patch": diff}))
    assert apply_series(series, tree).ok
    again = apply_series(series, tree)
    assert not again.ok and "already applied" in again.results[0].problem


def test_series_is_all_or_nothing(tree: Path, tmp_path: Path) -> None:
    good = make_diff(tree, TARGET_FILE, replace_line(SET_ARCH, 'os.environ["FLASHINFER_CUDA_ARCH_LIST"] = str(('))
    tb = "sglang/srt/layers/attention/triton_backend.py"
    bad = make_diff(tree, tb, replace_line("self.num_draft_tokens", "self.num_draft_tokens_x"))
    bad = bad.replace("self.num_draft_tokens", "self.num_draft_tokenz", 1)  # corrupt a context/removed line
    before = digest(tree)
    series = load_series(write_series(tmp_path, {"0001-good.patch": good, "0002-bad.patch": bad}))
    rep = apply_series(series, tree)
    assert [r.ok for r in rep.results] == [True, False]
    assert digest(tree) == before, "first patch leaked into the tree although the series failed"


def test_offsets_are_reported(tree: Path, tmp_path: Path) -> None:
    diff = make_diff(tree, TARGET_FILE, replace_line(SET_ARCH, 'os.environ["FLASHINFER_CUDA_ARCH_LIST"] = str(('))
    text = (tree / TARGET_FILE).read_text()
    (tree / TARGET_FILE).write_text("# one\n# two\n# three\n" + text)
    series = load_series(write_series(tmp_path, {"0001-test-edit.patch": diff}))
    rep = apply_series(series, tree)
    assert rep.ok
    assert rep.results[0].offsets == [f"{TARGET_FILE}: hunk #1 offset 3"]


def test_series_sha_changes_with_content(tree: Path, tmp_path: Path) -> None:
    diff = make_diff(tree, TARGET_FILE, replace_line(SET_ARCH, 'os.environ["FLASHINFER_CUDA_ARCH_LIST"] = str(('))
    d = write_series(tmp_path, {"0001-test-edit.patch": diff})
    sha1 = load_series(d).sha256
    assert load_series(d).sha256 == sha1
    (d / "0001-test-edit.patch").write_text(diff.replace("str((", "str(( "))
    assert load_series(d).sha256 != sha1


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: (d / "0001-test-edit.patch").unlink(), "does not exist"),
        (lambda d: (d / "manifest.yaml").write_text("- file: [unclosed\n"), "not valid YAML"),
        (lambda d: (d / "manifest.yaml").write_text("[]\n"), "no manifest entry for 0001-test-edit.patch"),
        (lambda d: (d / "series").write_text("1-bad-name.diff\n"), "is not a NNNN-short-name.patch"),
        (lambda d: (d / "manifest.yaml").write_text(
            "- file: 0001-test-edit.patch\n  purpose: short\n  upstream: none\n  test: x\n"), "invalid manifest"),
        (lambda d: (d / "0001-test-edit.patch").write_text(
            (d / "0001-test-edit.patch").read_text().replace("--- a/", "--- ")), "lacks the a/ prefix"),
        (lambda d: (d / "manifest.yaml").unlink(), "missing"),
    ],
    ids=["missing-patch", "bad-yaml", "no-entry", "bad-name", "short-fields", "no-prefix", "no-manifest"],
)
def test_bad_series_input_is_one_clear_error(tree: Path, tmp_path: Path, mutate, message: str) -> None:
    diff = make_diff(tree, TARGET_FILE, replace_line(SET_ARCH, 'os.environ["FLASHINFER_CUDA_ARCH_LIST"] = str(('))
    d = write_series(tmp_path, {"0001-test-edit.patch": diff})
    mutate(d)
    with pytest.raises(PatchError, match=message):
        load_series(d)
    before = digest(tree)
    proc = subprocess.run([sys.executable, "-m", "sglfleet.patches", "apply", "--root", str(tree), "--series-dir",
                           str(d)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error: ")
    assert digest(tree) == before


def test_cli_apply_failure_exit_code_and_record(tree: Path, tmp_path: Path) -> None:
    diff = make_diff(tree, TARGET_FILE, replace_line(SET_ARCH, 'os.environ["FLASHINFER_CUDA_ARCH_LIST"] = str(('))
    d = write_series(tmp_path, {"0001-test-edit.patch": diff})
    rec = tmp_path / "rec.json"
    cmd = [sys.executable, "-m", "sglfleet.patches", "apply", "--root", str(tree), "--series-dir", str(d), "--record",
           str(rec)]
    ok = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    assert ok.returncode == 0, ok.stderr
    assert load_series(d).sha256 in rec.read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    assert again.returncode == 1
    assert "does not apply with zero fuzz" in again.stderr


def test_check_reports_drift_against_an_older_release(tmp_path: Path) -> None:
    """`check --against` on a real other release: the series is tried there and touched files compared."""
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, "-m", "sglfleet.patches", "check", "--against", "0.5.22", "--json",
                           str(out)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "drift against sglang 0.5.22" in proc.stdout
    import json
    data = json.loads(out.read_text())
    assert data["ok"] is True and data["drift"]["newest"] == "0.5.22"
    old_root = fetch_sglang("0.5.22", DEFAULT_CACHE)
    new_root = fetch_sglang("0.5.23", DEFAULT_CACHE)
    series = load_series(series_dir_for("0.5.23"))
    really_changed = [f for f in series.touched if (old_root / f).is_file() != (new_root / f).is_file()
                      or ((old_root / f).is_file() and (old_root / f).read_bytes() != (new_root / f).read_bytes())]
    assert data["drift"]["changed_files"] == really_changed
