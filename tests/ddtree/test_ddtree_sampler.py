"""The DDTree worker's T > 0 sampler (patches/ddtree/sglang_ddtree/sampling.py, called by the worker's
_target_tokens) on CPU torch, against a numpy reference of the law written here: temperature, then the joint
top-k / top-p / min-p truncation of the temperature-scaled distribution, renormalised.

Batches mix parameters per request (temperatures 0.6 / 0.8 / 1.0, top-p < 1, top-k, min-p, greedy rows); each
node is drawn 30,000 times (vectorised: the batch tiled over many requests) and a chi-square goodness of fit
judges the counts. The correct sampler must pass at alpha 1e-4 (fixed torch seed: deterministic); every test fault
that changes a law (TEST_FAULTS) must fail with p < 1e-6 and fit the law its comment describes;
step_shared_random, whose marginals are exact, must show dependence between the nodes of one step (collision
rate of two nodes' tokens against the independent rate). Greedy rows stay exactly argmax under every fault."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

try:
    import torch
except ImportError:  # pragma: no cover - CI installs torch (pyproject.toml, the dev extra)
    pytest.skip("torch is not installed: the DDTree sampler tests run on CPU torch", allow_module_level=True)

from sglang_ddtree import sampling as S

ALPHA_PASS = 1e-4  # the correct sampler's nodes must all fit at this level
ALPHA_FAIL = 1e-6  # a fault's combined fit must be below this
TOP_K_ALL = 1 << 30  # sglang's "no top-k"
VOCAB = 32
WIDTH = 4  # nodes per request in one verify step
DRAWS = 30_000  # per node
TILE = 3_000  # copies of the batch per call (DRAWS / TILE calls)

# (temperature, top_k, top_p, min_p) per request: a batch that mixes every parameter and two kinds of greedy rows
BATCH = [
    (0.6, TOP_K_ALL, 0.9, 0.0),  # top-p at T 0.6
    (0.0, TOP_K_ALL, 1.0, 0.0),  # greedy: T = 0
    (0.8, 8, 1.0, 0.0),  # top-k at T 0.8
    (0.6, TOP_K_ALL, 1.0, 0.2),  # min-p at T 0.6
    (0.7, 1, 1.0, 0.0),  # greedy: top_k = 1 at T > 0
    (1.0, 20, 0.8, 0.05),  # top-k, top-p and min-p jointly at T 1
    (0.8, 12, 0.95, 0.1),  # all three at T 0.8
    (1.0, VOCAB + 5, 1.0, 0.0),  # plain T 1: top_k past the vocabulary, top_p 1, min_p 0
]
GREEDY_ROWS = [b for b, (t, k, _, _) in enumerate(BATCH) if t <= 1e-5 or k == 1]
# the batch holds min-p requests: sglang's sampler (and so the worker) truncates sequentially for all of it
SEQ = any(m > 0 for (_, _, _, m) in BATCH)
SAMPLING_ROWS = [b for b in range(len(BATCH)) if b not in GREEDY_ROWS]
# faults whose every draw keeps its law and whose draws are dependent instead
DEPENDENCE_FAULTS = ("step_shared_random", "step_replay_random")
LAW_FAULTS = [f for f in S.TEST_FAULTS if f not in DEPENDENCE_FAULTS]


# ---------------------------------------------------------------- the reference (numpy, float64)


def reference_law(logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float,
                  min_p_at_t1: bool = False, sequential: bool = False, one_short: bool = False) -> np.ndarray:
    """The distribution one node's token must follow. Greedy (T <= 1e-5 or top_k == 1): a point mass on the first
    maximal logit. Otherwise q = softmax(logits / T); walking the tokens from the most probable down, a token is
    kept when its rank is below top_k, the mass of the tokens before it is below top_p and its probability is at
    least min_p times the largest (the first token always); the kept q renormalised. ``min_p_at_t1`` describes
    the min_p_on_t1 fault: the min-p test on softmax(logits) instead. ``sequential``: the batch holds a min-p
    request, and sglang's sampler then measures top-p on the renormalised mass of the top-k survivors.
    ``one_short`` describes the support_one_short fault: where some tokens are cut and two or more kept, the
    least likely kept one is cut too."""
    x = np.asarray(logits, dtype=np.float64)
    if temperature <= 1e-5 or top_k == 1:
        out = np.zeros(len(x))
        out[int(np.argmax(x))] = 1.0
        return out
    q = np.exp((x - x.max()) / temperature)
    q /= q.sum()
    q1 = np.exp(x - x.max())
    q1 /= q1.sum()
    ranked = sorted(range(len(x)), key=lambda i: (-q[i], i))
    kept = np.zeros(len(x))
    before = 0.0
    mass_k = sum(q[i] for i in ranked[:max(1, top_k)]) if sequential else 1.0
    for rank, i in enumerate(ranked):
        lead = q1[ranked[0]] if min_p_at_t1 else q[ranked[0]]
        mine = q1[i] if min_p_at_t1 else q[i]
        if rank == 0 or (rank < top_k and before < top_p * mass_k and mine >= min_p * lead):
            kept[i] = q[i]
        before += q[i]
    n_kept = int(np.count_nonzero(kept))
    if one_short and 2 <= n_kept < len(x):
        kept[[i for i in ranked if kept[i] > 0][-1]] = 0.0
    return kept / kept.sum()


def boundary_margin(logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float,
                    sequential: bool = False) -> float:
    """How far the row's top-p and min-p decisions are from their thresholds (float32 against float64 must not
    decide a token differently): the smallest |mass before - top_p| and |q / q_max - min_p| over the tokens."""
    x = np.asarray(logits, dtype=np.float64)
    if temperature <= 1e-5 or top_k == 1:
        return math.inf
    q = np.sort(np.exp((x - x.max()) / temperature))[::-1]
    q /= q.sum()
    before = np.concatenate([[0.0], np.cumsum(q)[:-1]])
    margin = math.inf
    if top_p < 1.0:
        limits = [top_p, top_p * float(q[:max(1, top_k)].sum())] if sequential else [top_p]
        margin = min(margin, *(float(np.abs(before - lim).min()) for lim in limits))
    if min_p > 0.0:
        margin = min(margin, float(np.abs(q / q[0] - min_p).min()))
    return margin


def chi2_sf(x: float, dof: int) -> float:
    """P(chi-square with ``dof`` degrees of freedom >= x): the regularised upper incomplete gamma Q(dof/2, x/2)."""
    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(x / 2.0, dtype=torch.float64)))


def chi2_fit(counts: np.ndarray, law: np.ndarray) -> tuple[float, int]:
    """Pearson's chi-square of ``counts`` against ``law`` and its degrees of freedom; bins expected below 5 draws
    are pooled (smallest first). A draw outside the law's support gives an infinite statistic."""
    n = counts.sum()
    if counts[law <= 0].sum() > 0:
        return math.inf, 1
    expected = law[law > 0] * n
    observed = counts[law > 0].astype(np.float64)
    order = np.argsort(expected)
    expected, observed = expected[order], observed[order]
    cut = 0
    while cut < len(expected) - 1 and expected[:cut].sum() < 5.0 and expected[cut] < 5.0:
        cut += 1
    if cut > 1:  # pool bins [0, cut)
        expected = np.concatenate([[expected[:cut].sum()], expected[cut:]])
        observed = np.concatenate([[observed[:cut].sum()], observed[cut:]])
    stat = float(((observed - expected) ** 2 / expected).sum())
    return stat, len(expected) - 1


# ---------------------------------------------------------------- the draws


def make_logits(seed: int, bs: int, width: int = WIDTH, vocab: int = VOCAB) -> np.ndarray:
    """[bs, width, vocab] float32 logits: per request a base row, per node a perturbation of it (the nodes of one
    request are related contexts, as in a tree)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0.0, 2.0, size=(bs, 1, vocab))
    return (base + 0.7 * rng.normal(size=(bs, width, vocab))).astype(np.float32)


def params(batch: list[tuple[float, int, float, float]], tile: int = 1):
    """sglang's SamplingBatchInfo layout, the batch repeated ``tile`` times: temperatures [bs, 1] float,
    top_ks [bs] int32, top_ps [bs] float, min_ps [bs] float."""
    rows = batch * tile
    return (torch.tensor([[r[0]] for r in rows], dtype=torch.float32),
            torch.tensor([r[1] for r in rows], dtype=torch.int32),
            torch.tensor([r[2] for r in rows], dtype=torch.float32),
            torch.tensor([r[3] for r in rows], dtype=torch.float32))


def draw_counts(logits: np.ndarray, batch, fault: str | None, draws: int = DRAWS, tile: int = TILE,
                seed: int = 1234, seeded: bool = False, device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Token counts per node [bs, width, vocab] over ``draws`` draws of every node, and the raw draws
    [draws, bs, width]. The batch is tiled ``tile`` times per call (the tiles are more requests of the same
    batch: a cyclic row shift maps tile to tile exactly as within one batch)."""
    bs, width, vocab = logits.shape
    torch.manual_seed(seed)
    flat = torch.from_numpy(logits).unsqueeze(0).expand(tile, bs, width, vocab).reshape(-1, vocab).to(device)
    temps, ks, ps, ms = (t.to(device) for t in params(batch, tile))
    out = []
    for call in range(draws // tile):
        kw = {}
        if seeded:
            req = torch.arange(tile * bs, dtype=torch.int64)
            kw["seeds"] = (req * 7919 + call * 1_000_003 + seed).to(device)
            prefix = 100 + (req * 13 + call) % 997
            kw["positions"] = (prefix.unsqueeze(1) + torch.arange(width)).reshape(-1).to(device)
            kw["seeded_draw"] = hashed_gumbel_draw
        tok = S.node_draws(flat, temps, ks, ps, ms, width, fault=fault, **kw)
        out.append(tok.view(tile, bs, width).cpu().numpy())
    raw = np.concatenate(out, axis=0)
    counts = np.zeros((bs, width, vocab), dtype=np.int64)
    for b in range(bs):
        for j in range(width):
            counts[b, j] = np.bincount(raw[:, b, j], minlength=vocab)
    return counts, raw


def hashed_gumbel_draw(logprobs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A seeded draw in the manner of sglang's multinomial_with_seed (written here, not sglang's hash): Gumbel
    noise from a 64-bit mix of (seed, position, vocabulary id), argmax of log-probs plus noise; [n, 1]."""
    n, v = logprobs.shape
    s = seeds.cpu().numpy().astype(np.uint64)[:, None]
    p = positions.cpu().numpy().astype(np.uint64)[:, None]
    c = np.arange(v, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        h = (s * np.uint64(0x9E3779B97F4A7C15)) ^ ((p + np.uint64(1)) * np.uint64(0xC2B2AE3D27D4EB4F))
        h = h ^ ((c + np.uint64(7)) * np.uint64(0x165667B19E3779F9))
        for mul in (0xBF58476D1CE4E5B9, 0x94D049BB133111EB):
            h = (h ^ (h >> np.uint64(30))) * np.uint64(mul)
        h = h ^ (h >> np.uint64(31))
    u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    noisy = logprobs.double().cpu().numpy() + (-np.log(-np.log(u)))
    return torch.from_numpy(np.argmax(noisy, axis=1)).view(n, 1).to(logprobs.device)


def described_batch(fault: str | None, batch=BATCH) -> tuple[list, dict[str, bool]]:
    """The parameters each request's draws follow under ``fault``, as its comment in TEST_FAULTS says, and
    reference_law's options for it (min-p judged at T = 1; the support one token short)."""
    rows = list(batch)
    if fault == "verify_temperature_one":
        rows = [r if b in GREEDY_ROWS else (1.0, *r[1:]) for b, r in enumerate(rows)]
    elif fault == "verify_no_top_p":
        rows = [(t, k, 1.0, m) for (t, k, _, m) in rows]
    elif fault == "greedy_if_any" and GREEDY_ROWS:
        rows = [r if b in GREEDY_ROWS else (0.0, *r[1:]) for b, r in enumerate(rows)]
    elif fault == "row_shift":
        sampling = [b for b, (t, k, _, _) in enumerate(batch) if not (t <= 1e-5 or k == 1)]
        for i, b in enumerate(sampling):
            rows[b] = batch[sampling[(i + 1) % len(sampling)]]
    opts = {"min_p_at_t1": fault == "min_p_on_t1", "one_short": fault == "support_one_short"}
    return rows, {k: v for k, v in opts.items() if v}


def fits(counts: np.ndarray, logits: np.ndarray, rows, only=SAMPLING_ROWS, **opts: bool
         ) -> tuple[dict[tuple[int, int], float], float]:
    """Per node p-values of the fit, and the p-value of the summed chi-square over the nodes of ``only``
    (``opts``: reference_law's options for a fault's described law)."""
    per, total, dof = {}, 0.0, 0
    for b in only:
        for j in range(logits.shape[1]):
            stat, d = chi2_fit(counts[b, j], reference_law(logits[b, j], *rows[b], sequential=SEQ, **opts))
            per[(b, j)] = chi2_sf(stat, d) if math.isfinite(stat) else 0.0
            total, dof = total + stat, dof + d
    return per, (chi2_sf(total, dof) if math.isfinite(total) else 0.0)


@pytest.fixture(scope="module")
def logits() -> np.ndarray:
    x = make_logits(2028, len(BATCH))
    for b in SAMPLING_ROWS:  # no top-p / min-p decision within 1e-4 of its threshold (float32 vs float64)
        for fault in (None, *LAW_FAULTS):
            rows, opts = described_batch(fault)
            t, k, p, m = rows[b]
            if opts.get("min_p_at_t1"):  # min-p on T = 1 is min-p ** (1 / T) on the scaled distribution
                m = m ** (1.0 / t)
            for j in range(WIDTH):
                assert boundary_margin(x[b, j], t, k, p, m, SEQ) > 1e-4, \
                    "pick another logits seed: a boundary is too close"
    return x


@pytest.fixture(scope="module")
def correct(logits):
    return draw_counts(logits, BATCH, None)


# ---------------------------------------------------------------- the correct sampler


def test_reference_law_edge_cases() -> None:
    x = np.array([2.0, 1.0, 0.5, -1.0, 0.0])
    soft = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    assert np.allclose(reference_law(x, 1.0, TOP_K_ALL, 1.0, 0.0), soft)
    assert np.allclose(reference_law(x, 1.0, 99, 1.0, 0.0), soft)  # top_k past the vocabulary
    assert reference_law(x, 0.0, TOP_K_ALL, 1.0, 0.0)[0] == 1.0
    assert reference_law(x, 0.9, 1, 1.0, 0.0)[0] == 1.0
    assert np.count_nonzero(reference_law(x, 1.0, 2, 1.0, 0.0)) == 2
    assert np.count_nonzero(reference_law(x, 1.0, TOP_K_ALL, 1e-9, 0.0)) == 1  # the first token is always kept
    assert np.count_nonzero(reference_law(x, 1.0, TOP_K_ALL, 1.0, 1.0)) == 1


def test_correct_sampler_fits_the_law(logits, correct) -> None:
    counts, _ = correct
    per, total = fits(counts, logits, BATCH)
    worst = min(per, key=per.get)
    assert per[worst] > ALPHA_PASS, f"node {worst} p={per[worst]:.2e}: the sampler does not draw the target's law"
    assert total > ALPHA_PASS, f"combined p={total:.2e}"


def test_greedy_rows_are_argmax(logits, correct) -> None:
    _, raw = correct
    for b in GREEDY_ROWS:
        assert (raw[:, b, :] == logits[b].argmax(axis=-1)[None, :]).all()


def test_correct_sampler_nodes_of_a_step_are_independent(logits, correct) -> None:
    _, raw = correct
    z = collision_z(raw, logits, BATCH)
    assert abs(z) < 3.9, f"collision z={z:+.2f}: the nodes of one step are dependent"  # two-sided p ~ 1e-4


def test_same_draws_as_torch_multinomial_on_renormalised_probs(logits) -> None:
    """Without a fault the sampler consumes torch's generator exactly as torch.multinomial over the renormalised
    probabilities of every node (the worker's behaviour before the sampler left it)."""
    flat = torch.from_numpy(logits).reshape(-1, VOCAB)
    temps, ks, ps, ms = params(BATCH)
    torch.manual_seed(7)
    got = S.node_draws(flat, temps, ks, ps, ms, WIDTH)
    rep = torch.repeat_interleave
    probs = torch.softmax(flat.float() / rep(temps.view(-1), WIDTH).view(-1, 1).clamp_min(1e-6), dim=-1)
    probs = S.renorm(probs, rep(ks, WIDTH), rep(ps, WIDTH), rep(ms, WIDTH))
    torch.manual_seed(7)
    want = torch.multinomial(probs, 1).view(-1)
    greedy = torch.tensor([b in GREEDY_ROWS for b in range(len(BATCH))]).repeat_interleave(WIDTH)
    want = torch.where(greedy, flat.argmax(dim=-1), want)
    assert torch.equal(got, want)


def test_seeded_path_fits_the_law_and_is_deterministic(logits) -> None:
    counts, raw = draw_counts(logits, BATCH, None, draws=12_000, seeded=True)
    per, total = fits(counts, logits, BATCH)
    assert min(per.values()) > ALPHA_PASS and total > ALPHA_PASS, (min(per.values()), total)
    again = draw_counts(logits, BATCH, None, draws=3_000, seed=1234, seeded=True)[1]
    assert np.array_equal(again, raw[:3_000]), "seeded draws depend on more than (seed, position, logits)"
    z = collision_z(raw, logits, BATCH)
    assert abs(z) < 3.9, f"seeded collision z={z:+.2f}"


def test_ties() -> None:
    """Exact ties in the logits: top-k, top-p and min-p boundaries on the edge of a tie class keep the whole class
    (uniform over it); a top-k that splits a class keeps the class-level law; greedy takes the first maximum."""
    x = np.array([3.0, 3.0, 1.0, 1.0, 1.0, 0.0, -0.5, 0.2, -1.0, 0.4, -2.0, 0.1], dtype=np.float32)
    q = np.exp((x - x.max()) / 0.8)
    q /= q.sum()
    batch = [
        (0.8, 2, 1.0, 0.0),  # top-k at the edge of the first class
        (0.8, TOP_K_ALL, 1.0, 1.0),  # min-p 1: the tied maxima
        (0.8, TOP_K_ALL, float(1.5 * q[0]), 0.0),  # top-p inside the second token: the first class
        (0.8, 5, 1.0, 0.0),  # top-k at the edge of the second class
        (0.0, TOP_K_ALL, 1.0, 0.0),  # greedy: the first of the tied maxima
        (0.8, 3, 1.0, 0.0),  # top-k splitting the second class: one of its three tokens
    ]
    lg = np.broadcast_to(x, (len(batch), 2, len(x))).copy()
    counts, raw = draw_counts(lg, batch, None, draws=20_000, tile=2_000)
    for b in range(4):
        law = reference_law(x, *batch[b])
        assert np.count_nonzero(law) == (2 if b < 3 else 5)
        for j in range(2):
            stat, d = chi2_fit(counts[b, j], law)
            assert chi2_sf(stat, d) > ALPHA_PASS, (b, j, stat, d)
    assert (raw[:, 4, :] == 0).all()
    split = counts[5].sum(axis=0)
    assert split[5:].sum() == 0 and np.count_nonzero(split[2:5]) >= 1
    top = split[:2].sum()
    n = split.sum()
    law_top = 2 * q[0] / (2 * q[0] + q[2])
    z = (top - n * law_top) / math.sqrt(n * law_top * (1 - law_top))
    assert abs(z) < 3.9, f"the split class's share is off: z={z:+.2f}"
    assert abs(split[0] - split[1]) < 4 * math.sqrt(top), "the tied maxima are not equally likely"


def test_renorm_boundaries_at_exact_equality() -> None:
    """Exact float equalities at the thresholds, decided as the reference decides them: a token whose preceding
    mass equals top_p is dropped (kept only while the mass before it is below top_p), a token at exactly
    min_p * p_max is kept, top_k counts ranks from 1."""
    probs = torch.full((1, 4), 0.25)
    one = torch.ones(1)

    def kept(k, p, m):
        out = S.renorm(probs, torch.tensor([k]), torch.tensor([p]), torch.tensor([m]))
        law = reference_law(np.zeros(4), 1.0, k, p, m)
        assert np.allclose(sorted(out[0].tolist()), sorted(law.tolist()), rtol=0, atol=1e-6)
        return int((out > 0).sum())

    assert kept(TOP_K_ALL, 0.5, 0.0) == 2  # mass before the third token is exactly 0.5
    assert kept(TOP_K_ALL, 0.75, 0.0) == 3
    assert kept(TOP_K_ALL, 1.0, 0.0) == 4
    assert kept(TOP_K_ALL, 1.0, 1.0) == 4  # all at exactly min_p * p_max
    assert kept(3, 1.0, 0.0) == 3
    assert kept(0, 1.0, 0.0) == 1  # top_k < 1 keeps the first token
    assert torch.equal(S.renorm(probs, torch.tensor([4]), one, torch.zeros(1)), probs)


# ---------------------------------------------------------------- the test faults


def test_faults_are_known_and_off_by_default(monkeypatch) -> None:
    monkeypatch.delenv("SGLANG_DDTREE_TEST_FAULT", raising=False)
    assert S.read_test_fault() is None
    monkeypatch.setenv("SGLANG_DDTREE_TEST_FAULT", "")
    assert S.read_test_fault() is None
    for name in S.TEST_FAULTS:
        monkeypatch.setenv("SGLANG_DDTREE_TEST_FAULT", name)
        assert S.read_test_fault() == name
    monkeypatch.setenv("SGLANG_DDTREE_TEST_FAULT", "verify_temperature_two")
    with pytest.raises(ValueError, match="known test faults"):
        S.read_test_fault()
    assert set(S.TEST_FAULTS) == {"step_shared_random", "step_replay_random", "verify_temperature_one",
                                  "verify_no_top_p", "row_shift", "min_p_on_t1", "greedy_if_any",
                                  "support_one_short"}
    with pytest.raises(ValueError):
        S.node_draws(torch.zeros(2, 3), torch.ones(1, 1), torch.ones(1, dtype=torch.int32) * 3, torch.ones(1),
                     torch.zeros(1), 2, fault="nope")


@pytest.fixture(scope="module")
def fault_draws(logits):
    return {f: draw_counts(logits, BATCH, f) for f in S.TEST_FAULTS}


@pytest.mark.parametrize("fault", LAW_FAULTS)
def test_fault_fails_the_law(fault, logits, fault_draws) -> None:
    counts, _ = fault_draws[fault]
    _, total = fits(counts, logits, BATCH)
    assert total < ALPHA_FAIL, f"{fault}: combined p={total:.2e}, the fit does not refuse it"


@pytest.mark.parametrize("fault", LAW_FAULTS)
def test_fault_draws_the_law_its_comment_describes(fault, logits, fault_draws) -> None:
    counts, _ = fault_draws[fault]
    rows, opts = described_batch(fault)
    per, total = fits(counts, logits, rows, **opts)
    assert min(per.values()) > ALPHA_PASS and total > ALPHA_PASS, (fault, min(per.values()), total)
    unchanged = [b for b in SAMPLING_ROWS  # rows whose described law is the correct one
                 if all(np.allclose(reference_law(logits[b, j], *rows[b], sequential=SEQ, **opts),
                                    reference_law(logits[b, j], *BATCH[b], sequential=SEQ)) for j in range(WIDTH))]
    if unchanged:  # the rows the fault leaves alone still fit the correct law
        _, p_unchanged = fits(counts, logits, BATCH, only=unchanged)
        assert p_unchanged > ALPHA_PASS, (fault, unchanged, p_unchanged)


@pytest.mark.parametrize("fault,row", [("verify_temperature_one", 2), ("row_shift", 7)])
def test_fit_refuses_a_changed_law_on_the_same_support(fault, row, logits, fault_draws) -> None:
    """Not only support: row 2 (top-k 8) keeps its 8 tokens at T = 1, row 7 (plain T = 1) under row 0's T 0.6 /
    top-p 0.9 draws inside its own support; the chi-square refuses both on the shape of the law alone."""
    counts, _ = fault_draws[fault]
    for j in range(WIDTH):
        assert counts[row, j][reference_law(logits[row, j], *BATCH[row], sequential=SEQ) <= 0].sum() == 0
    _, p = fits(counts, logits, BATCH, only=[row])
    assert p < ALPHA_FAIL, (fault, row, p)


@pytest.mark.parametrize("fault", S.TEST_FAULTS)
def test_greedy_rows_stay_argmax_under_every_fault(fault, logits, fault_draws) -> None:
    _, raw = fault_draws[fault]
    for b in GREEDY_ROWS:
        assert (raw[:, b, :] == logits[b].argmax(axis=-1)[None, :]).all(), (fault, b)
    seeded = draw_counts(logits, BATCH, fault, draws=600, tile=300, seeded=True)[1]
    for b in GREEDY_ROWS:
        assert (seeded[:, b, :] == logits[b].argmax(axis=-1)[None, :]).all(), (fault, b, "seeded")


def collision_z(raw: np.ndarray, logits: np.ndarray, rows) -> float:
    """Dependence of the nodes of one step: over the sampling requests and the disjoint node pairs (0, 1),
    (2, 3), the number of steps where both nodes drew the same token against its expectation under independent
    draws of the correct laws (sum of p_a * p_b), as a z-score."""
    hits, mean, var = 0.0, 0.0, 0.0
    for b in SAMPLING_ROWS:
        for a in range(0, raw.shape[2] - 1, 2):
            q = float(reference_law(logits[b, a], *rows[b], sequential=SEQ)
                      @ reference_law(logits[b, a + 1], *rows[b], sequential=SEQ))
            n = raw.shape[0]
            hits += float((raw[:, b, a] == raw[:, b, a + 1]).sum())
            mean += n * q
            var += n * q * (1 - q)
    return (hits - mean) / math.sqrt(var)


def test_step_shared_random_keeps_marginals_and_is_dependent(logits, fault_draws) -> None:
    counts, raw = fault_draws["step_shared_random"]
    per, total = fits(counts, logits, BATCH)
    assert min(per.values()) > ALPHA_PASS and total > ALPHA_PASS, "its marginals are exact by design"
    z = collision_z(raw, logits, BATCH)
    assert z > 4.9, f"step_shared_random: collision z={z:+.2f}, not refused"  # one-sided p < 5e-7


def test_step_shared_random_seeded_is_dependent(logits) -> None:
    counts, raw = draw_counts(logits, BATCH, "step_shared_random", draws=12_000, seeded=True)
    per, total = fits(counts, logits, BATCH)
    assert min(per.values()) > ALPHA_PASS and total > ALPHA_PASS
    z = collision_z(raw, logits, BATCH)
    assert z > 4.9, f"seeded step_shared_random: collision z={z:+.2f}"


def replay_draws(logits: np.ndarray, fault: str | None, seeded: bool, steps: int = 3, tile: int = 2000,
                 device: str = "cpu") -> np.ndarray:
    """The draws of `steps` consecutive verify steps of one batch (the batch tiled `tile` times): [steps, tile, bs,
    width]. Seeded requests keep their seeds and move their positions on by the width at every step."""
    bs, width, vocab = logits.shape
    torch.manual_seed(77)
    flat = torch.from_numpy(logits).unsqueeze(0).expand(tile, bs, width, vocab).reshape(-1, vocab).to(device)
    temps, ks, ps, ms = (t.to(device) for t in params(BATCH, tile))
    req = torch.arange(tile * bs, dtype=torch.int64)
    out = []
    for step in range(steps):
        kw = {}
        if seeded:
            kw["seeds"] = (req * 7919 + 11).to(device)
            kw["positions"] = ((100 + step * width + req % 7).unsqueeze(1) + torch.arange(width)).reshape(-1).to(device)
            kw["seeded_draw"] = hashed_gumbel_draw
        out.append(S.node_draws(flat, temps, ks, ps, ms, width, fault=fault, **kw).view(tile, bs, width).cpu().numpy())
    return np.stack(out)


@pytest.mark.parametrize("seeded", [False, True])
def test_step_replay_random_keeps_each_steps_law_and_repeats_it(logits, seeded) -> None:
    """Within one step the faulted draws fit the law (2,000 tiled requests); the next step, with the same logits,
    repeats every sampling node's draw, which the correct sampler does about as often as chance; greedy rows stay
    argmax."""
    bad = replay_draws(logits, "step_replay_random", seeded)
    ok = replay_draws(logits, None, seeded)
    counts = np.zeros(logits.shape, dtype=np.int64)
    for b in range(logits.shape[0]):
        for j in range(logits.shape[1]):
            counts[b, j] = np.bincount(bad[0, :, b, j], minlength=logits.shape[2])
    per, total = fits(counts, logits, BATCH)
    assert min(per.values()) > ALPHA_PASS and total > ALPHA_PASS, "one step's draws keep their law"
    rows = list(SAMPLING_ROWS)
    assert (bad[1][:, rows] == bad[0][:, rows]).all() and (bad[2][:, rows] == bad[0][:, rows]).all()
    assert (ok[1][:, rows] == ok[0][:, rows]).mean() < 0.6
    for b in GREEDY_ROWS:
        assert (bad[:, :, b, :] == logits[b].argmax(axis=-1)[None, None, :]).all()


@pytest.mark.parametrize("fault,batch", [
    ("row_shift", [(0.6, 8, 0.9, 0.1), (0.0, TOP_K_ALL, 1.0, 0.0), (0.9, 1, 1.0, 0.0)]),  # one sampling request
    ("row_shift", [(0.8, 12, 0.9, 0.05)] * 3),  # sampling requests sharing their parameters
    ("verify_temperature_one", [(1.0, 8, 0.9, 0.1), (0.0, TOP_K_ALL, 1.0, 0.0)]),  # T = 1 already
    ("verify_no_top_p", [(0.7, 8, 1.0, 0.1), (1.0, TOP_K_ALL, 1.0, 0.0)]),  # top_p = 1 already
    ("min_p_on_t1", [(0.7, 8, 0.9, 0.0), (1.0, TOP_K_ALL, 0.95, 0.2)]),  # min_p = 0 or T = 1
    ("greedy_if_any", [(0.7, 8, 0.9, 0.0), (1.0, TOP_K_ALL, 0.95, 0.2)]),  # no greedy request in the batch
    ("support_one_short", [(0.8, TOP_K_ALL, 1.0, 0.0), (1.0, VOCAB + 5, 1.0, 0.0), (0.0, 8, 0.9, 0.0)]),  # no cut
])
def test_fault_is_invisible_where_its_comment_says(fault, batch) -> None:
    """Same generator state, same draws as the correct sampler, bit for bit."""
    x = make_logits(5, len(batch))
    a = draw_counts(x, batch, None, draws=400, tile=200, seed=3)[1]
    b = draw_counts(x, batch, fault, draws=400, tile=200, seed=3)[1]
    assert np.array_equal(a, b), fault


def test_row_shift_takes_the_next_sampling_row() -> None:
    sampling = torch.tensor([True, False, True, True, False, True])
    assert S.next_sampling_row(sampling).tolist() == [2, 1, 3, 5, 4, 0]
    assert S.next_sampling_row(torch.tensor([False, True, False])).tolist() == [0, 1, 2]
    assert S.next_sampling_row(torch.tensor([False, False])).tolist() == [0, 1]


def test_worker_draws_through_the_sampler() -> None:
    """The worker (which needs sglang to import) keeps its names and hands its fault to node_draws."""
    path = Path(__file__).resolve().parents[2] / "src/sglfleet/patches/ddtree/sglang_ddtree/worker.py"
    tree = ast.parse(path.read_text())
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "sampling"
                for a in n.names}
    assert {"TEST_FAULTS", "read_test_fault", "_renorm", "node_draws"} <= imported
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "node_draws"]
    assert len(calls) == 1
    kw = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
    assert kw.get("fault") == "self._test_fault" and kw.get("positions") == "positions"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the worker's draws run there)")
def test_cuda_draws_fit_the_law_and_faults_fail(logits) -> None:
    """The same judgement on CUDA tensors, where the worker draws: the correct sampler (unseeded and seeded)
    fits, every law fault fails and fits its described law, step_shared_random is dependent, greedy stays
    argmax."""
    for seeded in (False, True):
        counts, raw = draw_counts(logits, BATCH, None, seeded=seeded, device="cuda")
        per, total = fits(counts, logits, BATCH)
        assert min(per.values()) > ALPHA_PASS and total > ALPHA_PASS, (seeded, min(per.values()), total)
        assert abs(collision_z(raw, logits, BATCH)) < 3.9
        for fault in S.TEST_FAULTS:
            counts, raw = draw_counts(logits, BATCH, fault, seeded=seeded, device="cuda")
            for b in GREEDY_ROWS:
                assert (raw[:, b, :] == logits[b].argmax(axis=-1)[None, :]).all(), (fault, b)
            if fault == "step_shared_random":
                assert collision_z(raw, logits, BATCH) > 4.9, (fault, seeded)
                continue
            if fault == "step_replay_random":
                steps = replay_draws(logits, fault, seeded, device="cuda")
                assert (steps[1][:, list(SAMPLING_ROWS)] == steps[0][:, list(SAMPLING_ROWS)]).all(), seeded
                continue
            assert fits(counts, logits, BATCH)[1] < ALPHA_FAIL, (fault, seeded)
            rows, opts = described_batch(fault)
            per, total = fits(counts, logits, rows, **opts)
            assert min(per.values()) > ALPHA_PASS and total > ALPHA_PASS, (fault, seeded, min(per.values()), total)


def test_a_min_p_request_in_the_batch_makes_top_p_sequential_as_sglang_does() -> None:
    """sglang 0.5.23's flashinfer sampler: when any request of a batch has min-p it renormalises after top-k and
    measures top-p on the survivors (top_k_renorm_prob, top_p_renorm_prob, min_p_sampling_from_probs); otherwise
    it cuts top-k and top-p jointly. A request with top-k 3 and top-p 0.75 over q = (0.4, 0.3, 0.2, 0.1): jointly
    the third token's mass before it, 0.7, is under 0.75 and it is kept (3 tokens); sequentially that mass is 0.7 of
    the survivors' 0.9 (0.78), past 0.75, and it is dropped (2 tokens)."""
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    for with_min_p, want in ((False, 3), (True, 2)):
        ms = torch.tensor([0.0, 0.01 if with_min_p else 0.0])
        lg = logits.expand(2, 4).contiguous()
        probs = torch.softmax(lg, dim=-1)
        out = S.renorm(probs, torch.tensor([3, TOP_K_ALL]), torch.tensor([0.75, 1.0]), ms,
                       sequential=(ms > 0).any())
        assert int((out[0] > 0).sum()) == want, (with_min_p, out[0])
        law = reference_law(lg[0].numpy().astype(np.float64), 1.0, 3, 0.75, 0.0, sequential=with_min_p)
        assert np.allclose(out[0].numpy(), law, atol=1e-6)
