"""The Ansible collections the playbooks use (ansible/requirements.yml): install and check.

    python -m sglfleet.rollout.collections install    # idempotent; what `make setup` runs
    python -m sglfleet.rollout.collections check      # exit 2 with one line naming what is missing

Galaxy is unreachable from the build machines; the pinned versions ship inside the `ansible` wheel on PyPI,
from which only the listed collections are extracted into .cache/ansible-collections.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

from sglfleet.pipeline.errors import EXIT_OK, UsageError, cli_main
from sglfleet.rollout import ANSIBLE_DIR, WORK_ROOT

COLLECTIONS_DIR = WORK_ROOT / ".cache" / "ansible-collections"


def collections_dir() -> Path:
    """Where Ansible looks: the first entry of ANSIBLE_COLLECTIONS_PATH when set (make sets it), else .cache."""
    env = os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(os.pathsep)[0]
    return Path(env) if env else COLLECTIONS_DIR
ANSIBLE_WHEEL = "ansible==12.3.0"


def required() -> dict[str, str]:
    doc = yaml.safe_load((ANSIBLE_DIR / "requirements.yml").read_text())
    return {c["name"]: str(c["version"]) for c in doc.get("collections", [])}


def installed_version(name: str, root: Path | None = None) -> str | None:
    root = root or collections_dir()
    ns, coll = name.split(".", 1)
    man = root / "ansible_collections" / ns / coll / "MANIFEST.json"
    if not man.is_file():
        return None
    return json.loads(man.read_text())["collection_info"]["version"]


def missing(root: Path | None = None) -> list[str]:
    root = root or collections_dir()
    return [f"{n} {v} (found {installed_version(n, root) or 'none'})" for n, v in required().items()
            if installed_version(n, root) != v]


def check(root: Path | None = None) -> None:
    """One clear error when a collection the playbooks use is missing or at another version."""
    root = root or collections_dir()
    gone = missing(root)
    if gone:
        raise UsageError(f"Ansible collections missing from {root}: {', '.join(gone)}; run `make setup` "
                         "(it installs them from the ansible wheel)")


def install(root: Path | None = None) -> list[str]:
    root = root or collections_dir()
    if not missing(root):
        return []
    want = required()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, ANSIBLE_WHEEL],
                       check=True)
        wheel = next(Path(tmp).glob("ansible-*.whl"))
        keep = tuple(f"ansible_collections/{n.replace('.', '/')}/" for n in want)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root, [m for m in z.namelist() if m.startswith(keep)])
    gone = missing(root)
    if gone:
        raise UsageError(f"{ANSIBLE_WHEEL} does not carry {', '.join(gone)} (ansible/requirements.yml pins)")
    return list(want)


@cli_main
def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args[:1] == ["install"]:
        done = install()
        print(f"collections: {'installed ' + ', '.join(done) if done else 'already present'} in {collections_dir()}")
        return EXIT_OK
    if args[:1] == ["check"]:
        check()
        print(f"collections: all present in {collections_dir()}")
        return EXIT_OK
    raise UsageError("usage: python -m sglfleet.rollout.collections install|check")


if __name__ == "__main__":
    sys.exit(main())
