"""Patch 0017: DFLASH's verify law honours min-p (CPU).

The law a DFLASH chain accepts drafts against and draws its bonus token from is built by
`build_speculative_verify_target_probs` (sglang/srt/speculative/dflash_utils.py). sglang 0.5.23 applies
the temperature, top-k and top-p there and never min-p, so a request with min_p > 0 got tokens the
target-only sampler excludes (refused by the gate on the H200, docs/production-gate.md). The functions
are taken from the series-applied source itself (its torch fallbacks: no flashinfer kernel on CPU) and
compared, row by row, with the target-only law as the gate's own scorer defines it (validation/tokenlaw.py:
the order of SGLang's sampler when a batch holds a min-p request: temperature, top-k, top-p on the
survivors, min-p).
"""

from __future__ import annotations

import typing
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from conftest import functions_from, series_tree  # noqa: E402

from sglfleet.validation.tokenlaw import ORDERS, SamplingParams, law_of, row_from_logits  # noqa: E402

WANTED = ("_dflash_npu_top_k_top_p_renorm_prob", "_dflash_top_k_renorm_prob", "_dflash_top_p_renorm_prob",
          "_dflash_min_p_renorm_prob", "build_speculative_verify_target_probs")


def _verify_law(root: Path) -> typing.Callable[..., typing.Any]:
    """build_speculative_verify_target_probs and the helpers it calls, compiled from the tree's own source."""
    ns: dict[str, typing.Any] = {"torch": torch, "F": F, "Optional": typing.Optional, "Any": typing.Any,
                                 "is_npu": lambda: False, "top_k_renorm_prob": None, "top_p_renorm_prob": None}
    srt = root / "sglang" / "srt"
    functions_from((srt / "layers" / "sampler.py").read_text(), ("top_p_normalize_probs_torch",), ns)
    functions_from((srt / "speculative" / "dflash_utils.py").read_text(), WANTED, ns)
    return typing.cast(typing.Callable[..., typing.Any], ns["build_speculative_verify_target_probs"])


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {"patched": series_tree(tmp_path_factory.mktemp("patched")),
            "unpatched": series_tree(tmp_path_factory.mktemp("unpatched"), upto="0017")}


# one batch, rows with mixed parameters, as production batches them (never top-k with top-p: module docstring
# of validation/tokenlaw.py); every row is verified at 3 draft positions
PARAMS = [SamplingParams(0.8, top_p=0.9, min_p=0.05), SamplingParams(1.0, top_k=20, min_p=0.02),
          SamplingParams(0.6, min_p=0.1), SamplingParams(1.0, top_p=0.95), SamplingParams(0.8, top_k=40),
          SamplingParams(1.0)]
DRAFT = 3


def _batch(seed: int, vocab: int = 400) -> tuple[typing.Any, typing.Any]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(PARAMS) * DRAFT, vocab, generator=g, dtype=torch.float64) * 3.0
    info = SimpleNamespace(
        temperatures=torch.tensor([[p.temperature] for p in PARAMS], dtype=torch.float64),
        top_ks=torch.tensor([p.top_k or vocab for p in PARAMS], dtype=torch.int32),
        top_ps=torch.tensor([p.top_p for p in PARAMS], dtype=torch.float64),
        min_ps=torch.tensor([p.min_p for p in PARAMS], dtype=torch.float64),
        need_top_k_sampling=True, need_top_p_sampling=True, need_min_p_sampling=True)
    return logits, info


def _target_only(logits_row: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The target-only law over the whole vocabulary (tokenlaw's order for a batch holding a min-p request)."""
    row = row_from_logits(logits_row, p.temperature, keep=logits_row.size)
    law = law_of(row, p, ORDERS["temperature_first"])
    out = np.zeros(logits_row.size)
    out[row.ids[:law.n]] = law.q / law.total
    return out


@pytest.mark.integration
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse-top-k", "dense"])
def test_the_patched_verify_law_is_the_target_only_law(trees: dict[str, Path], sparse: bool) -> None:
    build = _verify_law(trees["patched"])
    for seed in range(3):
        logits, info = _batch(seed)
        probs = build(next_token_logits=logits, sampling_info=info, draft_token_num=DRAFT, bs=len(PARAMS),
                      use_sparse_topk=sparse).reshape(len(PARAMS) * DRAFT, -1).numpy()
        for i, p in enumerate(PARAMS):
            for j in range(DRAFT):
                r = i * DRAFT + j
                want = _target_only(logits[r].numpy(), p)
                assert np.allclose(probs[r], want, atol=1e-9), (p, j, np.abs(probs[r] - want).max())
                assert set(np.flatnonzero(probs[r])) == set(np.flatnonzero(want)), p


@pytest.mark.integration
def test_without_the_patch_min_p_rows_get_tokens_outside_their_law(trees: dict[str, Path]) -> None:
    """The defect the patch mends, in the upstream source: every min-p row keeps mass the target-only law
    cuts; the other rows agree."""
    build = _verify_law(trees["unpatched"])
    logits, info = _batch(0)
    probs = build(next_token_logits=logits, sampling_info=info, draft_token_num=DRAFT,
                  bs=len(PARAMS)).reshape(len(PARAMS) * DRAFT, -1).numpy()
    for i, p in enumerate(PARAMS):
        r = i * DRAFT
        want = _target_only(logits[r].numpy(), p)
        outside = float(probs[r][want == 0].sum())
        if p.min_p > 0:
            assert outside > 1e-3, (p, outside)
        else:
            assert np.allclose(probs[r], want, atol=1e-9), p
