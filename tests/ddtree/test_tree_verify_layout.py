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

pytestmark = pytest.mark.network  # downloads the sglang wheel from PyPI

torch = pytest.importorskip("torch", reason="torch (CPU) is a dev dependency: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "src" / "sglfleet" / "patches" / "sglang-0.5.23"
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


# --- The mutant: the seeds' bug put back into the patched Triton backend -------------
#
# tests/ddtree/mutants/seeds-block-size-indexing.patch (applied on top of the series)
# makes the target-verify metadata compute qo_indptr, seq_mask_len / mask_indptr and
# max_extend_len from the DFlash block size (self.num_draft_tokens) instead of the
# verify width. The backend's own target-verify code (eager branch of
# init_forward_metadata, the graph-replay _update_target_verify_buffers, the capture
# branch of _build_cuda_graph_forward_metadata) is cut out of triton_backend.py with
# `ast` and run on CPU with stub state; its index math must match the enumeration on
# the patched sources and, on the mutant, fail exactly when budget + 1 != block.

import ast  # noqa: E402
import types  # noqa: E402

MUTANT = ROOT / "tests" / "ddtree" / "mutants" / "seeds-block-size-indexing.patch"
TRITON = "sglang/srt/layers/attention/triton_backend.py"
BLOCK = 8  # --speculative-num-draft-tokens, as in the GPU proof
BUDGETS = [1, 3, 7, 8, 12, 15, 16, 31, 32, 63]


@pytest.fixture(scope="module")
def mutant_tree(patched_tree, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("sglang-mutant")
    shutil.copytree(patched_tree / "sglang", dest / "sglang")
    r = subprocess.run(["patch", "-p1", "--fuzz=0", "--batch", "-i", str(MUTANT)], cwd=dest,
                       capture_output=True, text=True)
    assert r.returncode == 0, f"mutant does not apply on the patched series: {r.stdout}{r.stderr}"
    return dest


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    for n in cls.body:
        if isinstance(n, ast.FunctionDef) and n.name == name:
            return n
    raise AssertionError(f"TritonAttnBackend.{name} not found")


def _branch(func: ast.FunctionDef, test: str) -> list[ast.stmt]:
    for n in ast.walk(func):
        if isinstance(n, ast.If) and ast.unparse(n.test) == test:
            return n.body
    raise AssertionError(f"no `if {test}:` in {func.name}")


def _compile(body: list[ast.stmt], args: list[str], ret: str | None, ns: dict):
    """def _f(*args): body [; return ret] compiled in namespace ns."""
    src = f"def _f({', '.join(args)}):\n    pass\n" + (f"    return {ret}\n" if ret else "")
    mod = ast.parse(src)
    fn = mod.body[0]
    fn.body = list(body) + fn.body[1:]
    ast.fix_missing_locations(mod)
    exec(compile(mod, TRITON, "exec"), ns)
    return ns["_f"]


class _Backend:
    """The fields the three target-verify code paths read from TritonAttnBackend."""

    def __init__(self, q: int, max_bs: int = 8, context_len: int = 2048):
        self.device = "cpu"
        self.num_draft_tokens = BLOCK
        self.target_verify_num_tokens_per_req = q  # the capture width (patched: q)
        self.tree_verify = True
        self.max_context_len = context_len
        self.sliding_window_size = None
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32)
        self.mask_indptr = torch.zeros(max_bs + 1, dtype=torch.int64)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32)
        self.window_kv_indptr = None
        self.cuda_graph_kv_indices = None
        w = max(BLOCK, q)
        self._verify_mask = types.SimpleNamespace(
            buffer=torch.zeros(max_bs * w * (context_len + w), dtype=torch.uint8))

    def _fill_kv_indptr_and_indices(self, plan, bs, seq_lens, req_pool_indices, kv_indices):
        self.kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens[:bs], dim=0)
        return self.kv_indptr[: bs + 1]


@pytest.fixture(scope="module")
def verify_paths(tv, patched_tree, mutant_tree):
    """{variant: (eager, replay, capture)} callables cut from each triton_backend.py."""
    out = {}
    for variant, root in (("patched", patched_tree), ("mutant", mutant_tree)):
        tree = ast.parse((root / TRITON).read_text())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TritonAttnBackend")
        ns = dict(torch=torch, Optional=__import__("typing").Optional, SpecInput=object,
                  check_verify_width=tv.check_verify_width, check_mask_capacity=tv.check_mask_capacity,
                  tree_verify_mask_numel=tv.tree_verify_mask_numel, ForwardMetadata=dict,
                  KVLocPlan=object)
        width = _compile(_method(cls, "_target_verify_num_tokens_per_req").body,
                         ["self", "spec_info"], None, dict(ns))
        replay_fn = _method(cls, "_update_target_verify_buffers")
        replay = _compile(replay_fn.body, ["self", "plan", "bs", "seq_lens", "spec_info", "req_pool_indices"],
                          None, dict(ns))
        eager = _compile(_branch(_method(cls, "init_forward_metadata"),
                                 "forward_batch.forward_mode.is_target_verify()"),
                         ["self", "forward_batch", "spec_info"],
                         "dict(qo_indptr=qo_indptr, mask_indptr=mask_indptr, max_extend_len=max_extend_len)",
                         dict(ns))
        capture = _compile(_branch(_method(cls, "_build_cuda_graph_forward_metadata"),
                                   "forward_mode.is_target_verify()"),
                           ["self", "bs", "spec_info", "swa", "swa_out_cache_loc"], None, dict(ns))
        out[variant] = (width, eager, replay, capture)
    return out


def _run_paths(paths, prefix_lens, q):
    """Index math of the three paths for one batch: {path: {field: value}}."""
    width, eager, replay, capture = paths
    bs = len(prefix_lens)
    seq = torch.tensor(prefix_lens, dtype=torch.int64)
    mask = torch.ones(sum(q * (p + q) for p in prefix_lens), dtype=torch.uint8)
    spec = types.SimpleNamespace(num_tokens_per_req=q, custom_mask=mask, draft_token_num=q)
    be = _Backend(q)
    be._target_verify_num_tokens_per_req = types.MethodType(width, be)
    fb = types.SimpleNamespace(req_pool_indices=torch.arange(bs), seq_lens=seq, seq_lens_sum=int(seq.sum()),
                               kv_loc_plan=None)
    res = {}
    e = eager(be, fb, spec)
    res["eager"] = dict(qo=e["qo_indptr"].tolist(), mask=e["mask_indptr"].tolist(), max_ext=e["max_extend_len"])
    be = _Backend(q)
    be._target_verify_num_tokens_per_req = types.MethodType(width, be)
    c = capture(be, bs, types.SimpleNamespace(num_tokens_per_req=q, custom_mask=mask), False, None)
    r = replay(be, None, bs, seq, spec, torch.arange(bs))
    res["cuda_graph"] = dict(qo=r[0].tolist(), mask=r[3].tolist(), max_ext=c["max_extend_len"])
    return res


@pytest.mark.parametrize("variant", ["patched", "mutant"])
@pytest.mark.parametrize("budget", BUDGETS)
def test_backend_verify_index_math_catches_block_size_indexing(verify_paths, variant, budget):
    """Patched: every path matches the q x (prefix + q) enumeration. Mutant (the
    seeds' bug): qo_indptr, mask_indptr and max_extend_len are all wrong, in eager and
    graph, exactly when budget + 1 != block size, and all right when it is equal."""
    q = budget + 1
    for prefix_lens in MIXED:
        qo, _, mask_ptr, _ = _enumerate(prefix_lens, q)
        want = dict(qo=qo, mask=mask_ptr, max_ext=q)
        got = _run_paths(verify_paths[variant], prefix_lens, q)
        for path, fields in got.items():
            for name, value in fields.items():
                ok = value == want[name]
                expect_ok = variant == "patched" or q == BLOCK
                assert ok == expect_ok, (
                    f"{variant} {path} {name} budget={budget} (q={q}, block={BLOCK}) prefixes={prefix_lens}: "
                    f"got {value}, layout {want[name]} -> {'match' if ok else 'MISMATCH'}, "
                    f"expected {'match' if expect_ok else 'mismatch'}")
