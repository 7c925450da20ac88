"""Product, test bed and lab apart: the product (src/sglfleet) imports nothing from tests/ or bench/, only the
demo imports the test bed (inside the function, with a clear error outside a checkout), the product wheel's
package list is sglfleet alone (bench/, testbed/ and tests/ left out), and what the controller runs (the CLI,
deploy and its plan, the gate, render, the load test) imports no torch, triton or transformers."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "sglfleet"
PRODUCT = ("patches", "images", "rollout", "flow", "validation", "textscore", "loadtests", "pipeline")
# the one place the product reaches into the test bed: `make demo` deploys to it
TESTBED_ALLOWED = {"src/sglfleet/flow/demo.py"}
# what a controller imports for `sglfleet deploy --check`, `validate`, `render`, `loadtest` (the lab's are extras)
CONTROLLER_MODULES = ("sglfleet.cli", "sglfleet.flow.__main__", "sglfleet.flow.promote", "sglfleet.flow.plan",
                      "sglfleet.flow.staged", "sglfleet.validation.__main__", "sglfleet.validation.gate",
                      "sglfleet.flow.sweep", "sglfleet.rollout.__main__", "sglfleet.rollout.deploy",
                      "sglfleet.loadtests.__main__", "sglfleet.loadtests.runner", "sglfleet.loadtests.capacity",
                      "sglfleet.images.__main__", "sglfleet.patches.__main__")
LAB_ONLY = ("torch", "triton", "transformers", "accelerate", "safetensors")


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
    return [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]


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
    from setuptools import find_namespace_packages, find_packages

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert cfg["where"] == ["src"]
    find = find_namespace_packages if cfg.get("namespaces", True) else find_packages
    found = find(str(ROOT / cfg["where"][0]), include=cfg["include"], exclude=cfg.get("exclude", []))
    assert {p.split(".")[0] for p in found} == {"sglfleet"}
    # ansible/ is package data: with namespace discovery its folders are found as (namespace) packages too
    assert {p.split(".")[1] for p in found if p.count(".")} == set(PRODUCT) | {"ansible"}


def test_the_controller_path_imports_no_torch(tmp_path: Path) -> None:
    """A fresh interpreter imports what the controller runs and names every lab-only module that came with it."""
    probe = tmp_path / "probe.py"
    probe.write_text("import importlib, sys\n"
                     f"for m in {CONTROLLER_MODULES!r}:\n    importlib.import_module(m)\n"
                     f"print(sorted(m for m in sys.modules if m.split('.')[0] in {LAB_ONLY!r}))\n")
    r = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", f"the controller path imports lab-only modules: {r.stdout.strip()}"


@pytest.mark.skipif(os.geteuid() != 0, reason="make demo checks for root first")
def test_demo_outside_a_checkout_is_one_error_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "sglfleet.flow", "demo", "--out", str(tmp_path / "run")], cwd=tmp_path,
                       env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    if "testbed" not in r.stderr:  # an editable install that maps the whole checkout: nothing to show
        pytest.skip(f"testbed importable outside the checkout here: {r.stderr.strip()[:200]}")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: make demo runs from a checkout of this repository (testbed/ is not installed): "
        "No module named 'testbed'"]
    assert not (tmp_path / "run").exists()
