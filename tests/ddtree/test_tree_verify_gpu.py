"""GPU proof: tree target-verify through the real sglang Triton and FlashInfer
backends vs fp32 (the FlashInfer tests skip unless `flashinfer` imports).

Run with `make gpu-test` (needs a CUDA GPU and DDTREE_SGLANG_PATH pointing at an
unpacked sglang 0.5.23, patched or not). DDTREE_MUTANT=seeds: the sources are the
patched series + tests/ddtree/mutants/seeds-block-size-indexing.patch (checked at
import); the Triton cells must then fail exactly where budget + 1 != the block size.
See docs/ddtree-gpu-proof.md.
"""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA CUDA GPU"),
    pytest.mark.skipif(not os.environ.get("DDTREE_SGLANG_PATH"),
                       reason="needs DDTREE_SGLANG_PATH=<unpacked sglang 0.5.23 sources> (make gpu-test)"),
]

BUDGETS = [1, 3, 7, 8, 12, 15, 16, 31, 32, 63]
TOPKS = [1, 2, 4, 8]
PREFIX_LENS = [1, 37, 300, 1100]  # several requests, different prefixes, one batch
CONTEXT_LEN = 2048


@pytest.fixture(scope="session")
def sg():
    import sglang_harness as H

    try:
        tb = H.import_sglang()
    except Exception as e:  # the code under test does not import (or the mutant check failed)
        pytest.fail(f"cannot import the sglang sources under test from DDTREE_SGLANG_PATH: {e!r}")
    return H, tb


@pytest.fixture(scope="session")
def sg_fi():
    import sglang_harness as H

    try:
        import flashinfer  # noqa: F401
    except Exception as e:
        pytest.skip(f"flashinfer is not importable (carry flashinfer-python 0.7.2): {e!r}")
    try:
        fb = H.import_flashinfer_backend()
    except Exception as e:  # flashinfer is there, so this is the code under test failing
        pytest.fail(f"cannot import sglang's flashinfer backend: {e!r}")
    return H, fb


def _record(row):
    path = os.environ.get("DDTREE_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _check_cell(H, tb, backend, mode, budget, topk):
    import tree_verify_case as C

    q = budget + 1
    row = dict(backend=backend, mode=mode, budget=budget, topk=topk, q=q, block=C.BLOCK,
               sglang=os.environ.get("DDTREE_SGLANG_LABEL", os.environ["DDTREE_SGLANG_PATH"]),
               mutant=os.environ.get("DDTREE_MUTANT") or None)
    try:
        env = C.Env(H, tb, verify_q=q, topk=topk, context_len=CONTEXT_LEN, max_bs=8, backend=backend)
        b = C.make_batch(env, PREFIX_LENS, budget, topk, seed=1000 * budget + topk)
        if mode == "eager":
            out = C.run_eager(env, b)
        else:
            g = C.Graph(env, bs=len(PREFIX_LENS))
            row.update(capture_width=g.cap_w, captured_with_mask=g.captured_with_mask)
            out = g.replay(b)
        torch.cuda.synchronize()
        err = C.max_err(out, b["ref"])
        row.update(max_err=err, passed=err <= C.TOL)
    except Exception as e:
        import traceback

        tb_tail = traceback.format_exc().strip().splitlines()[-6:]
        row.update(max_err=None, passed=False, error=f"{type(e).__name__}: {str(e)[:300]}",
                   where=" | ".join(x.strip() for x in tb_tail[:-1])[-600:])
        _record(row)
        raise
    _record(row)
    assert err <= C.TOL, f"max |out - ref| = {err} > {C.TOL} ({row})"


@pytest.mark.parametrize("topk", TOPKS)
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("mode", ["eager", "cuda_graph"])
def test_tree_verify_matches_reference(sg, mode, budget, topk):
    H, tb = sg
    _check_cell(H, tb, "triton", mode, budget, topk)


@pytest.mark.parametrize("topk", TOPKS)
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("mode", ["eager", "cuda_graph"])
def test_flashinfer_tree_verify_matches_reference(sg_fi, mode, budget, topk):
    H, fb = sg_fi
    _check_cell(H, fb, "flashinfer", mode, budget, topk)


def test_flashinfer_too_wide_verify_raises_clear_error(sg_fi):
    """Bad input, FlashInfer: graph captured for q=17, batch with q=33 must raise
    a clear error at setup (patched sources), before plan() or any launch."""
    import tree_verify_case as C

    H, fb = sg_fi
    row = dict(backend="flashinfer", mode="bad_input", q=33,
               sglang=os.environ.get("DDTREE_SGLANG_LABEL", os.environ["DDTREE_SGLANG_PATH"]))
    env = C.Env(H, fb, verify_q=17, topk=4, context_len=CONTEXT_LEN, max_bs=8, backend="flashinfer")
    g = C.Graph(env, bs=len(PREFIX_LENS))
    b = C.make_batch(env, PREFIX_LENS, 32, 4, seed=7)  # width 33 > 17
    row.update(capture_width=g.cap_w)
    try:
        g.replay(b)
        row.update(passed=False, error="no error raised")
    except Exception as e:
        row.update(passed=isinstance(e, ValueError) and "verify width 33" in str(e),
                   error=f"{type(e).__name__}: {str(e)[:300]}")
    _record(row)
    assert row["passed"], row["error"]


def test_too_wide_verify_raises_clear_error(sg):
    """Bad input: a verify width wider than the buffers/graphs were sized for
    must raise at setup (patched sources), never read/write out of bounds."""
    import tree_verify_case as C

    H, tb = sg
    env = C.Env(H, tb, verify_q=17, topk=4, context_len=CONTEXT_LEN, max_bs=8)
    g = C.Graph(env, bs=len(PREFIX_LENS))
    b = C.make_batch(env, PREFIX_LENS, 32, 4, seed=7)  # width 33 > 17
    with pytest.raises(ValueError, match="verify width 33"):
        g.replay(b)
