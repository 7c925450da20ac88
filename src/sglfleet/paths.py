"""Where the product's files are, in a checkout and in an installed wheel: the one place that knows.

Package data (ansible/, the patch series, the validation profiles) always lies inside the package, so it is
found the same way in both. The work directory (runs/, .cache/) is the checkout's root when the package runs from
a checkout (src/sglfleet under a directory with pyproject.toml), else the current directory.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
ANSIBLE_DIR = PACKAGE_DIR / "ansible"
PATCHES_DIR = PACKAGE_DIR / "patches"


def _checkout_root() -> Path | None:
    src = PACKAGE_DIR.parent
    root = src.parent
    if src.name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


CHECKOUT_ROOT: Path | None = _checkout_root()
"""The repository's root when running from a checkout; None from an installed wheel."""

WORK_ROOT: Path = CHECKOUT_ROOT or Path.cwd()
"""Where runs/ and .cache/ go: the checkout's root, or the directory the command was started in."""


def resolve(p: str | Path) -> Path:
    """A path from a config or the command line: absolute as is; relative to the current directory if it is
    there; a path into the package's data (ansible/..., validation/..., patches/...) from the package; else
    relative to the work root (runs/, .cache/: created there)."""
    path = Path(p).expanduser()
    if path.is_absolute():
        return path
    if path.exists():
        return path.resolve()
    if path.parts and (PACKAGE_DIR / path.parts[0]).is_dir() and (PACKAGE_DIR / path).exists():
        return PACKAGE_DIR / path
    return WORK_ROOT / path


def require_checkout(what: str) -> Path:
    """The checkout's root, for what only a checkout has (testbed/, scripts/, git history)."""
    if CHECKOUT_ROOT is None:
        from sglfleet.pipeline.errors import UsageError

        raise UsageError(f"{what} runs from a checkout of this repository (not from an installed wheel)")
    return CHECKOUT_ROOT
