"""Product, test bed and lab apart: the product packages import nothing from tests/ or bench/, only the
demo imports the test bed (inside the function, with a clear error outside a checkout), and the product
wheel's package list leaves bench/, testbed/ and tests/ out."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("patches", "images", "rollout", "flow", "validation", "loadtests", "models", "pipeline")
# the one place the product reaches into the test bed: `make demo` deploys to it
TESTBED_ALLOWED = {"flow/demo.py"}


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(module, line, at module level) of every import in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.module, node.lineno, id(node) in top))
    return out


def _product_files() -> list[Path]:
    return [p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts]


def test_product_packages_import_nothing_from_tests_or_the_lab() -> None:
    bad = []
    for p in _product_files():
        rel = str(p.relative_to(ROOT))
        for mod, line, top in _imports(p):
            root = mod.split(".")[0]
            if root in ("tests", "bench") or (root == "testbed" and (rel not in TESTBED_ALLOWED or top)):
                bad.append(f"{rel}:{line}: import {mod}")
    assert not bad, "\n".join(bad)


def test_the_scan_finds_such_an_import(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("import os\nfrom tests.support import testbed\n\ndef f():\n    import bench.claims\n")
    assert [(m, top) for m, _, top in _imports(f)] == [("os", True), ("tests.support", True), ("bench.claims", False)]


def test_the_wheel_leaves_the_lab_and_the_test_bed_out() -> None:
    from setuptools import find_namespace_packages

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = find_namespace_packages(str(ROOT), include=cfg["include"], exclude=cfg.get("exclude", []))
    assert {p.split(".")[0] for p in found} == set(PRODUCT)


@pytest.mark.skipif(os.geteuid() != 0, reason="make demo checks for root first")
def test_demo_outside_a_checkout_is_one_error_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "flow", "demo", "--out", str(tmp_path / "run")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    if "testbed" not in r.stderr:  # an editable install that maps the whole checkout: nothing to show
        pytest.skip(f"testbed importable outside the checkout here: {r.stderr.strip()[:200]}")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: make demo runs from a checkout of this repository (testbed/ is not installed): "
        "No module named 'testbed'"]
    assert not (tmp_path / "run").exists()
