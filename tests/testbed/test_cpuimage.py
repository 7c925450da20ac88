"""The CPU image carries the pipeline files its entry point imports (the 2026-12-03 CI failure: a new
`from sglfleet.pipeline.procs import ...` in embedded.py and an image that did not carry procs.py)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from testbed import cpuimage


def _import_alone(files: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """Import the entry module with only `files` of the pipeline package on the path, laid out as in the image
    (sglfleet/__init__.py + sglfleet/pipeline/; -S: no .pth, so the editable install of the repo cannot fill the
    gaps), third-party packages from site-packages."""
    root = cpuimage.PIPELINE_DIR
    (tmp_path / "sglfleet").mkdir()
    (tmp_path / "sglfleet" / "__init__.py").write_bytes((root.parent / "__init__.py").read_bytes())
    for f in files:
        dst = tmp_path / "sglfleet" / "pipeline" / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes((root / f).read_bytes())
    path = f"{tmp_path}:{sysconfig.get_paths()['purelib']}:{sysconfig.get_paths()['platlib']}"
    return subprocess.run([sys.executable, "-S", "-c", f"import {cpuimage.ENTRY_MODULE}"], cwd=tmp_path,
                          env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)


def test_the_image_files_are_the_entry_points_import_closure(tmp_path):
    files = cpuimage.pipeline_files()
    assert {"__init__.py", "embedded.py", "procs.py", "errors.py", "config.py"} <= set(files)
    r = _import_alone(files, tmp_path)
    assert r.returncode == 0, r.stderr


def test_a_missing_module_is_seen_by_the_same_check(tmp_path):
    # The check above can fail: drop one module of the closure and the entry point no longer imports.
    files = [f for f in cpuimage.pipeline_files() if f != "procs.py"]
    r = _import_alone(files, tmp_path)
    assert r.returncode != 0 and "sglfleet.pipeline.procs" in r.stderr


def test_an_import_of_a_missing_pipeline_module_is_one_clear_error(tmp_path, monkeypatch):
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "entry.py").write_text("from sglfleet.pipeline.gone import x\n")
    monkeypatch.setattr(cpuimage, "PIPELINE_DIR", tmp_path / "pipeline")
    with pytest.raises(cpuimage.UsageError, match=r"pipeline\.gone"):
        cpuimage.pipeline_files("sglfleet.pipeline.entry")
