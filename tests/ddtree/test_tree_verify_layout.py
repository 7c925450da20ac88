"""CPU test (CI): the tree-verify index math of the patched sglang 0.5.23 sources.

Applies patches/sglang-0.5.23/series (patch -p1 --fuzz=0) to the files it touches,
taken from the sglang 0.5.23 wheel on PyPI (cached under .cache/), imports the
patched `sglang/srt/speculative/tree_verify.py` (torch only) and checks qo_indptr,
kv indptr, mask indptr and mask lengths for mixed batches against a per-request
enumeration of the q x (prefix + q) layout.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (CPU) is a dev dependency: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "patches" / "sglang-0.5.23"
CACHE = ROOT / ".cache" / "ddtree-ci"
VERSION = "0.5.23"


def _wheel() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob(f"sglang-{VERSION}-*.whl"))
    if not found:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={VERSION}",
                            "-d", str(CACHE)], capture_output=True, text=True, timeout=600)
        found = sorted(CACHE.glob(f"sglang-{VERSION}-*.whl"))
        if not found:
            pytest.skip(f"cannot download sglang=={VERSION} from PyPI: {r.stderr[-300:]}")
    return found[0]


def _series() -> list[Path]:
    names = [ln.strip() for ln in (PATCHES / "series").read_text().splitlines()]
    return [PATCHES / n for n in names if n and not n.startswith("#")]


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory) -> Path:
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed")
    dest = tmp_path_factory.mktemp("sglang-patched")
    series = _series()
    touched = set()
    for p in series:
        touched |= {m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", p.read_text(), re.M)}
    with zipfile.ZipFile(_wheel()) as z:
        names = set(z.namelist())
        for f in sorted(touched):
            if f in names:
                z.extract(f, dest)
    for p in series:
        r = subprocess.run(["patch", "-p1", "--fuzz=0", "--batch", "-i", str(p)], cwd=dest,
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{p.name} does not apply to sglang {VERSION}: {r.stdout}{r.stderr}"
    return dest


@pytest.fixture(scope="module")
def tv(patched_tree):
    path = patched_tree / "sglang/srt/speculative/tree_verify.py"
    spec = importlib.util.spec_from_file_location("ddtree_tree_verify", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _enumerate(prefix_lens, q):
    """Reference layout: cell offsets of every (request, row, col) in order."""
    qo, mask_ptr, kv_ptr, lens, off = [0], [0], [0], [], 0
    for p in prefix_lens:
        cells = [(r, c) for r in range(q) for c in range(p + q)]
        lens.append(len(cells))
        off += len(cells)
        mask_ptr.append(off)
        qo.append(qo[-1] + q)
        kv_ptr.append(kv_ptr[-1] + p)
    return qo, kv_ptr, mask_ptr, lens


MIXED = [[1], [0, 5], [37, 1, 300, 2], [7, 7, 7], [1100, 3, 64, 0, 511]]


@pytest.mark.parametrize("prefix_lens", MIXED)
@pytest.mark.parametrize("q", [2, 4, 8, 9, 13, 16, 17, 32, 33, 64])
def test_layout_matches_enumeration(tv, prefix_lens, q):
    seq = torch.tensor(prefix_lens, dtype=torch.int64)
    bs = len(prefix_lens)
    qo, kv, mask_ptr, lens = _enumerate(prefix_lens, q)
    assert tv.tree_verify_qo_indptr(bs, q).tolist() == qo
    buf = torch.full((16,), -1, dtype=torch.int64)
    assert tv.tree_verify_qo_indptr(bs, q, out=buf).tolist() == qo  # in-place (graph buffers)
    assert tv.tree_verify_kv_indptr(seq).tolist() == kv
    assert tv.tree_verify_mask_lens(seq, q).tolist() == lens
    assert tv.tree_verify_mask_indptr(seq, q).tolist() == mask_ptr
    mbuf = torch.full((16,), -1, dtype=torch.int64)
    assert tv.tree_verify_mask_indptr(seq, q, out=mbuf).tolist() == mask_ptr
    assert tv.tree_verify_mask_numel(sum(prefix_lens), bs, q) == mask_ptr[-1]


def test_verify_width_is_not_the_block_size(tv):
    class Spec:
        speculative_num_draft_tokens = 8
        speculative_verify_num_tokens = 17

    class Chain:
        speculative_num_draft_tokens = 8
        speculative_verify_num_tokens = None

    assert tv.resolve_verify_num_tokens(Spec) == 17 and tv.is_tree_verify(Spec)
    assert tv.resolve_verify_num_tokens(Chain) == 8 and not tv.is_tree_verify(Chain)
    # block-size indexing (the incident) puts request 1's mask at the wrong offset
    seq = torch.tensor([100, 50])
    assert tv.tree_verify_mask_indptr(seq, 17)[1] != tv.tree_verify_mask_indptr(seq, 8)[1]


def test_capacity_errors_are_clear(tv):
    with pytest.raises(ValueError, match=r"verify width 33 .* exceeds the width 17"):
        tv.check_verify_width(33, 17, where="x")
    tv.check_verify_width(17, 17, where="x")
    with pytest.raises(ValueError, match="needs 101 cells but the buffer holds 100"):
        tv.check_mask_capacity(101, 100, where="x")


def test_backends_use_the_verify_width(patched_tree):
    """The patched backends size and index target-verify by the verify width."""
    tri = (patched_tree / "sglang/srt/layers/attention/triton_backend.py").read_text()
    assert "self.verify_num_tokens = resolve_verify_num_tokens(get_spec())" in tri
    assert "check_verify_width(" in tri and "check_mask_capacity(" in tri
    fi = (patched_tree / "sglang/srt/layers/attention/flashinfer_backend.py").read_text()
    assert "self.max_context_len + self.verify_num_tokens" in fi
    assert "self.tree_verify" in fi
