"""Each sampled token against the target's own law: the per-token T>0 test.

A correct speculative sampler draws every token from exactly the law a target-only engine would: the target's
distribution at the request's temperature, truncated by the request's top-k / top-p / min-p in the order the
engine applies them, renormalised. Given that law q at a position (candidates in descending probability) and
the token drawn there at rank r, the randomized probability integral transform

    u = (q_0 + ... + q_{r-1} + V * q_r) / (sum of q),  V ~ Uniform(0, 1) independent of everything

is exactly Uniform(0, 1) whatever q is, and the u of different tokens are independent. So every T>0 token of
a gate is one independent draw from U(0, 1) under a correct build, and a sampler that draws from another law
(a wrong temperature, a dropped top-p, another row's parameters, reused random numbers) moves them away from
uniform. Descending-probability order puts the shift where such faults put it: a sharper law piles u near 0,
a flatter one spreads it to 1. A token outside the law's support (cut by top-p, top-k or min-p) has no u: it
is counted apart (`outside`), a thing a correct sampler never emits.

The law of one position is built from a `Row`: the most likely candidates' log p_1 (T=1, normalised over the
whole vocabulary), their ids, and the mass the row does not list (the tail). The in-process reference scorer
lists enough candidates that the tail is tiny and knows its exact size at every T; a server scorer (SGLang's
input log-probs) lists its top-k, and the tail's share at T < 1 is then bounded, not known (`Row.exact`).
Where the law reaches into the tail, the tail is one category (coarsening keeps u exactly uniform, and loses
only the tail's resolution).

Engines apply the truncations in different orders (`ORDERS`): SGLang scales by the temperature first and cuts
all three jointly on p_T; llama.cpp cuts top-k, then top-p on the renormalised survivors of p_1, then min-p,
and applies the temperature last (its /props `samplers`). SGLang 0.5.23's flashinfer sampler switches a whole
batch to top-k first and top-p on the survivors' mass when any of its requests has min-p: only a request with
both top-k and top-p feels it, so the SGLang profiles' mixes never combine the two.

The test per temperature (`token_test`): the one-sample Kolmogorov-Smirnov distance of the candidate's u from
uniform (omnibus) and the mean of its u (location: a sharper law lowers it, a flatter one raises it; most
faults of this class move it, and the mean sees that with more power than KS), each less the scorer's own
deviation measured on the baseline's answers scored the same way (0 when those are uniform), against their null
laws; and the candidate's share of tokens outside the law against the baseline's (a conditional binomial test); and the
dispersion of the answers' mean u (`dispersion`): within one answer the u are independent uniforms too, so
sum over answers of 12 n (mean u - 1/2)^2 has mean = the number of answers and (each term lighter-tailed than
chi-square with 1 degree of freedom) a chi-square tail at most. A sampler whose draws within an answer share or
replay their random numbers, or whose law is wrong for a whole request in a direction that differs between
requests (another row's temperature, a per-request random effect), moves every u of an answer together: the
pooled KS and mean can stay uniform while each answer's mean strays.
And the draws at the law's cut (`edge_p`): where the request's top-k / top-p / min-p cuts the law inside the
scorer's row, its least likely kept token is drawn with a probability the law states; a sampler whose support
ends short of the cut (a truncation placed a token or more too far in, or computed on another law) never draws
it, while its u move only within the top few hundredths of (0, 1), where KS and the mean see little (a top-p cut
one token short, written blind to the gate, passed them at the test bed's size, 2026-12-05). The candidate's count
against its expectation is compared with the baseline's, so the scorer's own misplacement of the cut cancels.
And consecutive tokens (`serial`, `serial_p`): the products of their centred vocabulary-order mid-PITs have mean 0
under a correct sampler; one uniform shared by a step's nodes makes them positive.
`token_power` states what that refuses: the smallest fraction of tokens drawn from a wrong law (greedy,
untruncated, the kept set at T=1, flat, the law cut one token short) refused with the target probability at
the gate's own token count, by
Monte Carlo from the baseline's rows.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# the truncation steps of each engine, in its order ("joint": SGLang's top-k, top-p and min-p on p_T at once)
ORDERS: dict[str, tuple[str, ...]] = {
    "sglang": ("temperature", "joint"),
    "llamacpp": ("top_k", "top_p", "min_p", "temperature"),
    "temperature_first": ("temperature", "top_k", "top_p", "min_p"),
}
STEP_NAMES = frozenset({"temperature", "joint", "top_k", "top_p", "min_p"})
# the wrong laws the power statement mixes into a correct sampler's tokens: its law (greedy, untruncated, kept at
# T=1, flat over the kept tokens, a support one token short) and its parameters (one truncation of the request lost)
FAMILIES = ("greedy", "untruncated", "kept_at_t1", "flat", "cut_short", "no_top_k", "no_top_p", "no_min_p")


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters (temperature > 0). top_k 0: off; top_p 1: off; min_p 0: off.

    stop: the request's stop strings. They end an answer and never change a token's law: every token up to the
    one that completes a stop string is a draw from the law above; the text the server returns ends before the
    stop string (the gate's `stop_strings` check)."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"sampling parameters need a temperature > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1 or self.top_k < 0 or not 0 <= self.min_p < 1:
            raise ValueError(f"bad sampling parameters {self}")
        stop = tuple(self.stop)  # a list from a JSON record is kept as a tuple (the params stay hashable)
        if not all(isinstance(x, str) and x for x in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)

    def request_fields(self, kind: str) -> dict[str, Any]:
        """What a request must send so the engine applies exactly this law: every field explicit (servers have
        defaults of their own: llama.cpp top_k 40 and min_p 0.05, SGLang the model's generation config); top-k
        off is -1 for SGLang (it refuses 0), 0 for llama.cpp."""
        off = -1 if kind == "sglang" else 0
        return {"top_p": self.top_p, "top_k": self.top_k or off, "min_p": self.min_p, "stop": list(self.stop)}

    def as_dict(self) -> dict[str, Any]:
        """The record a sample and a baseline file keep (stop only where the request had stop strings)."""
        return {"top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                **({"stop": list(self.stop)} if self.stop else {})}

    @property
    def label(self) -> str:
        parts = [f"T{self.temperature:g}"]
        if self.top_p < 1:
            parts.append(f"top_p {self.top_p:g}")
        if self.top_k:
            parts.append(f"top_k {self.top_k}")
        if self.min_p:
            parts.append(f"min_p {self.min_p:g}")
        if self.stop:
            parts.append("stop " + " ".join(repr(x) for x in self.stop))
        return ", ".join(parts)


def order_of(engine: str | Sequence[str]) -> tuple[str, ...]:
    """The truncation order of an engine name (ORDERS) or an explicit list of steps (llama.cpp's /props
    `samplers`, filtered to the four that shape the law)."""
    if isinstance(engine, str):
        if engine not in ORDERS:
            raise ValueError(f"unknown sampler order {engine!r}; known: {', '.join(ORDERS)}")
        return ORDERS[engine]
    names = {"top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "temperature": "temperature", "temp": "temperature"}
    steps = tuple(names[s] for s in engine if s in names)
    if "temperature" not in steps:
        raise ValueError(f"sampler chain {list(engine)} has no temperature step")
    return steps


@dataclass(frozen=True)
class Row:
    """One position's distribution as a scorer knows it: candidates in descending probability (ties by id)."""

    lp: np.ndarray          # log p_1 of the listed candidates, descending (normalised over the whole vocabulary)
    ids: np.ndarray         # their token ids
    log_z: float            # log sum over the whole vocabulary of p_1^(1/T) at the request's T (0 at T=1)
    exact: bool = True      # log_z exact (full logits) or estimated from the listed candidates

    @property
    def tail(self) -> float:
        """p_1 mass of the tokens not listed."""
        return max(0.0, 1.0 - float(np.exp(self.lp).sum()))


def row_from_logits(logits: np.ndarray, temperature: float, keep: int = 2048) -> Row:
    """A full logits row (one position) as a Row: the `keep` most likely candidates and the exact tail."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    lse = m + math.log(float(np.exp(x - m).sum()))
    lp_all = x - lse
    k = min(keep, lp_all.size)
    top = np.argpartition(-lp_all, k - 1)[:k] if k < lp_all.size else np.arange(lp_all.size)
    order = np.lexsort((top, -lp_all[top]))  # descending probability, ties by id
    ids = top[order]
    s = lp_all / temperature
    sm = s.max()
    log_z = float(sm + math.log(float(np.exp(s - sm).sum())))
    return Row(lp_all[ids], ids.astype(np.int64), log_z, True)


def row_from_topk(own_lp: float, own_id: int, top: Iterable[tuple[float, int]], temperature: float) -> Row:
    """A server's top-k alternatives (log p_1, id) and the sampled token's own log p_1 as a Row. The tail's
    contribution to sum p_1^(1/T) is estimated at half its upper bound (each unlisted token is at most the
    least listed one): exact at T=1, within a factor 2 of the tail's share below it."""
    vals: dict[int, float] = {int(i): float(v) for v, i in top}
    vals[int(own_id)] = float(own_lp)
    ids = np.fromiter(vals.keys(), dtype=np.int64, count=len(vals))
    lp = np.fromiter(vals.values(), dtype=np.float64, count=len(vals))
    order = np.lexsort((ids, -lp))
    ids, lp = ids[order], lp[order]
    tail = max(0.0, 1.0 - float(np.exp(lp).sum()))
    a = 1.0 / temperature
    known = float(np.exp(lp * a).sum())
    tail_t = tail if temperature == 1.0 else 0.5 * tail * math.exp(float(lp[-1]) * (a - 1.0))
    return Row(lp, ids, math.log(known + tail_t), temperature == 1.0)


@dataclass(frozen=True)
class Law:
    """The truncated law at one position: q of the first `n` listed candidates (not normalised: divide by
    `total`) and `lump`, the kept share of the unlisted tail (0: the tail is cut)."""

    q: np.ndarray
    lump: float
    total: float
    # where the truncation could not be placed exactly (it reached into the unlisted tail of a server's row)
    approximate: bool = False

    @property
    def n(self) -> int:
        return int(self.q.size)


def law_of(row: Row, p: SamplingParams, order: Sequence[str]) -> Law:
    """The engine's law at this position for these parameters (module docstring)."""
    lp = row.lp
    k_all = lp.size
    tail1 = row.tail
    a = 1.0 / p.temperature
    tail_t = max(0.0, math.exp(row.log_z) - float(np.exp(lp * a).sum())) if p.temperature != 1.0 else tail1
    n, tail_frac, scale, approx = k_all, 1.0, 1.0, False

    def masses(s: float) -> tuple[np.ndarray, float]:
        w = np.exp(lp[:n] * s)
        t = (tail1 if s == 1.0 else tail_t) * tail_frac
        return w, t

    for step in order:
        if step == "temperature":
            scale = a
        elif step == "top_k":
            if 0 < p.top_k < n:
                n, tail_frac = p.top_k, 0.0
            elif p.top_k and tail_frac > 0:
                approx = True  # the cut falls among the unlisted tokens: the tail kept whole
        elif step == "top_p":
            if p.top_p < 1:
                w, t = masses(scale)
                tot = float(w.sum()) + t
                before = np.concatenate([[0.0], np.cumsum(w)[:-1]]) / tot
                inside = int(np.searchsorted(before, p.top_p, side="left"))  # count with cum_before < top_p
                if inside < n:
                    n, tail_frac = max(1, inside), 0.0
                elif tail_frac > 0 and t > 0:
                    need = (p.top_p - float(w.sum()) / tot) * tot
                    tail_frac = tail_frac * min(1.0, max(0.0, need / t) + 1e-12)
                    approx = approx or tail_frac < 1.0
        elif step == "min_p":
            if p.min_p > 0:
                keep = int(np.sum(lp[:n] * scale >= lp[0] * scale + math.log(p.min_p)))
                if keep < n:
                    n, tail_frac = max(1, keep), 0.0
                elif tail_frac > 0:
                    approx = True
        elif step == "joint":
            w, t = masses(scale)
            tot = float(w.sum()) + t
            cap = n
            if 0 < p.top_k < cap:
                cap = p.top_k
            if p.top_p < 1:
                before = np.concatenate([[0.0], np.cumsum(w)[:-1]]) / tot
                cap = min(cap, max(1, int(np.searchsorted(before, p.top_p, side="left"))))
            if p.min_p > 0:
                cap = min(cap, max(1, int(np.sum(w >= w[0] * p.min_p))))
            if cap < n:
                n, tail_frac = cap, 0.0
            elif tail_frac > 0 and p.top_p < 1:
                need = (p.top_p - float(w.sum()) / tot) * tot
                tail_frac *= min(1.0, max(0.0, need / t) + 1e-12) if t > 0 else 1.0
                approx = True
        else:
            raise ValueError(f"unknown truncation step {step!r}")
    q = np.exp(lp[:n] * a)
    lump = tail_t * tail_frac
    return Law(q, lump, float(q.sum()) + lump, approx or not row.exact)


def pit(law: Law, rank: int | None, v: float) -> float | None:
    """The randomized PIT of the token at `rank` among the listed candidates (None: an unlisted token), or
    None when the law does not hold it (outside the support)."""
    if rank is None:
        if law.lump <= 0:
            return None
        return (float(law.q.sum()) + v * law.lump) / law.total
    if rank >= law.n:
        return None
    return (float(law.q[:rank].sum()) + v * float(law.q[rank])) / law.total


def outside_excess(row: Row, law: Law, rank: int | None, temperature: float) -> float:
    """How far outside the law a token lies: the p_T mass of the listed candidates strictly between the law's last
    kept one and it (0: the first token past the cut, which scorer noise can flip; a token far in the tail has
    much more). An unlisted token is past every listed one."""
    a = 1.0 / temperature
    end = row.lp.size if rank is None else rank
    if end <= law.n:
        return 0.0
    return float(np.exp(row.lp[law.n:end] * a - row.log_z).sum())


def edge_of(row: Row, law: Law) -> float | None:
    """The probability, under the law, of its least likely kept candidate (the token at its cut), where the law is
    cut inside the listed candidates (no tail kept, at least one listed candidate cut away, two or more kept);
    None elsewhere (an untruncated law has no cut; a cut among the unlisted tokens is not placed exactly)."""
    if law.lump > 0 or law.n < 2 or law.n >= row.lp.size:
        return None
    return float(law.q[-1]) / law.total


MIN_MARGIN = 0.01  # p_T mass: the least margin past the cut a token must lie to count as clearly outside

# the request's truncations, each of which can put a token outside the law (`cut_by`, `cuts_of`)
CUTS = ("top_k", "top_p", "min_p")


def cuts_of(p: SamplingParams) -> tuple[bool, bool, bool]:
    """Which of CUTS the request turns on."""
    return p.top_k > 0, p.top_p < 1, p.min_p > 0


# logits: a token counts against a threshold cut (top-k, min-p) in the counts by cut (`cut_by`, pooled_test) only
# when it lies past that cut by more than this. A correct sampler's tokens fall outside a cut only through the
# scorer's numeric flips, which lie within twice the scorer's error of the cut (0.105 at most for the baseline of
# the H100 series scored by the float32 reference, docs/results/cut-reach-s32-2026-12-06.json.gz); a cut computed on
# the wrong law spreads its tokens over the whole region it wrongly keeps. The same rule on both sides keeps the
# test exact whatever the value; it only decides how much of the flips' noise the count carries.
CUT_REACH = 0.1


def cut_reaches(row: Row, p: SamplingParams, order: Sequence[str], rank: int | None
                ) -> tuple[float | None, float | None]:
    """How far a token lies past the request's top-k cut and past its min-p cut, each alone, in log p_1 units
    (logits): the least raise of its own log-probability that brings it inside that cut; None where the cut is
    off or holds it. Min-p compares with the most likely token at the scale the engine applies it (temperature
    before min-p in `order`: log p_T = log p_1 / T); a chain without a min-p step (llama.cpp's /props) applies
    none. An unlisted token's reach is a lower bound (its log-probability is at most the last listed one's)."""
    lp = row.lp
    lp_x = float(lp[-1] if rank is None else lp[rank])
    top_k = None
    if 0 < p.top_k <= lp.size and (rank is None or rank >= p.top_k):
        top_k = float(lp[p.top_k - 1]) - lp_x
    min_p = None
    steps = list(order)
    at = next((i for i, s in enumerate(steps) if s in ("joint", "min_p")), None)
    if p.min_p > 0 and at is not None:
        scale = p.temperature if "temperature" in steps[:at] else 1.0
        d = float(lp[0]) - lp_x + scale * math.log(p.min_p)
        if d > 0:
            min_p = d
    return top_k, min_p


def cut_by(row: Row, p: SamplingParams, order: Sequence[str], rank: int | None, far: float = 0.0
           ) -> tuple[bool, bool, bool]:
    """Which of the request's truncations (CUTS) put a token outside its law: each one's law alone (the others
    off) is asked whether it holds the token. A numeric flip at the cut and a fault of one truncation (its
    threshold on the wrong distribution, a parameter lost) leave their tokens outside different cuts: counted by
    cut, a fault's tokens are not diluted by the others' noise (`pooled_test`). The same attribution is applied
    to both sides, so the test stays exact whatever it attributes where the cuts interact (llama.cpp's order).
    `far` > 0: a threshold cut (top-k, min-p) counts only a token past it by more than `far` logits
    (cut_reaches; CUT_REACH), which leaves the flips a scorer's numerics make at the cut out of both sides."""
    on = cuts_of(p)
    reach = dict(zip(("top_k", "min_p"), cut_reaches(row, p, order, rank), strict=True)) if far > 0 else {}
    out = []
    for name, active in zip(CUTS, on, strict=True):
        if not active:
            out.append(False)
            continue
        alone = SamplingParams(p.temperature, top_k=p.top_k if name == "top_k" else 0,
                               top_p=p.top_p if name == "top_p" else 1.0, min_p=p.min_p if name == "min_p" else 0.0)
        law = law_of(row, alone, order)
        left = law.lump <= 0 if rank is None else rank >= law.n
        if left and name in reach:
            r = reach[name]
            left = r is not None and r > far
        out.append(left)
    return out[0], out[1], out[2]


def threshold_reach(row: Row, p: SamplingParams, order: Sequence[str], rank: int | None) -> float | None:
    """How far a token lies outside the request's threshold cuts (top-k, min-p), in log p_1 units (logits): the
    least raise of its own log-probability that brings it inside every threshold cut that leaves it out
    (cut_reaches: each cut alone); None where none does (inside, or outside top-p only: that cut is a sum of
    masses, not a threshold). A scorer whose log-probabilities differ from the sampler's by at most eps per token
    moves a token across such a cut only when its reach is at most 2 eps, so a correct sampler's tokens past a cut
    by more than the scorer's numeric reach do not occur."""
    return farthest(cut_reaches(row, p, order, rank))


def farthest(reaches: tuple[float | None, float | None]) -> float | None:
    """The larger of a token's reaches past its top-k and min-p cuts (cut_reaches); None where neither leaves it
    out: its threshold_reach."""
    got = [r for r in reaches if r is not None]
    return max(got) if got else None


def uniform_of(key: str) -> float:
    """The V of one token's randomized PIT: a fixed function of the token's place (answer, position), independent
    of what was sampled there, so a report can be re-scored to the same numbers."""
    h = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return (int.from_bytes(h, "big") + 0.5) / 2.0**64


def wrong_draws(row: Row, law: Law, p: SamplingParams, order: Sequence[str], rng: np.random.Generator
                ) -> tuple[float, ...]:
    """One row of the power statement's draws (DRAW_COLUMNS wide): for each wrong law of FAMILIES, one token's PIT
    under the correct law when the token comes from that law instead (NaN: outside the support); then each wrong
    law's total-variation distance from the correct one at this position (the power statement reports its
    deviation in those units); then for each, the cuts (CUTS, bit i for CUTS[i]) that leave its token outside
    (cut_by; 0 inside); then the cuts the request turns on (same bits); last, the probability of the token at the
    law's cut (edge_of; NaN: no cut inside the row). The families: greedy (the most likely token), untruncated
    (p_T with no top-k/top-p/min-p), kept_at_t1 (the kept candidates at T=1), flat (uniform over the kept
    candidates), cut_short (the law without the token at its cut: a support that ends one token short; the law
    itself where it has no cut inside the row), no_top_k / no_top_p / no_min_p (the request's law with that
    truncation lost, the others kept; the law itself where the request does not turn it on)."""
    e = edge_of(row, law)
    pits, masks, alts = _wrong_pits(row, law, p, order, rng, e)
    return (*pits, *wrong_tv(row, law, p, alts), *masks, float(_bits(cuts_of(p))), math.nan if e is None else e)


# the width of a wrong_draws row and where its parts lie
N_FAMILIES = len(FAMILIES)
DRAW_COLUMNS = 3 * N_FAMILIES + 2
CUT_MASK_COL, CUTS_ON_COL, EDGE_COL = 2 * N_FAMILIES, 3 * N_FAMILIES, 3 * N_FAMILIES + 1


def _bits(flags: Sequence[bool]) -> int:
    return sum(1 << i for i, f in enumerate(flags) if f)


def _without(p: SamplingParams, name: str) -> SamplingParams:
    """The request's parameters with one truncation of CUTS turned off."""
    return SamplingParams(p.temperature, top_p=1.0 if name == "top_p" else p.top_p,
                          top_k=0 if name == "top_k" else p.top_k, min_p=0.0 if name == "min_p" else p.min_p)


def _law_tv(a: Law, b: Law) -> float:
    """The total-variation distance of two laws of one row at one temperature (each a prefix of the same ranked
    candidates, plus a share of the same unlisted tail)."""
    n = max(a.n, b.n)
    qa = np.zeros(n)
    qb = np.zeros(n)
    qa[:a.n] = a.q / a.total
    qb[:b.n] = b.q / b.total
    return 0.5 * (float(np.abs(qa - qb).sum()) + abs(a.lump / a.total - b.lump / b.total))


def wrong_tv(row: Row, law: Law, p: SamplingParams, alts: Sequence[Law | None]) -> tuple[float, ...]:
    """The total-variation distance of each wrong law of FAMILIES from the correct law at one position (`alts`:
    the no_top_k / no_top_p / no_min_p laws, None where the request does not turn that cut on)."""
    q = law.q / law.total
    lump = law.lump / law.total
    greedy = 1.0 - float(q[0]) if law.n else 1.0
    a = 1.0 / p.temperature
    w = np.exp(row.lp * a)
    tail_t = max(0.0, math.exp(row.log_z) - float(w.sum())) if p.temperature != 1.0 else row.tail
    full = np.append(w, tail_t) / (float(w.sum()) + tail_t)
    kept = np.append(q, np.zeros(row.lp.size - law.n))
    kept = np.append(kept, lump)
    untruncated = 0.5 * float(np.abs(full - kept).sum())
    if law.n:
        k1 = np.exp(row.lp[:law.n])
        t1 = 0.5 * (float(np.abs(k1 / k1.sum() - q).sum()) + lump)
        flat = 0.5 * (float(np.abs(1.0 / law.n - q).sum()) + lump)
    else:
        t1 = flat = 1.0
    lost = [0.0 if alt is None else _law_tv(alt, law) for alt in alts]
    return (greedy, untruncated, t1, flat, edge_of(row, law) or 0.0, *lost)


def _lost_cut_law(row: Row, p: SamplingParams, name: str, order: Sequence[str]) -> Law | None:
    on = dict(zip(CUTS, cuts_of(p), strict=True))
    return law_of(row, _without(p, name), order) if on[name] else None


def _wrong_pits(row: Row, law: Law, p: SamplingParams, order: Sequence[str], rng: np.random.Generator,
                edge: float | None) -> tuple[list[float], list[float], list[Law | None]]:
    """(each family's PIT, the cuts that leave its token outside as bits, the lost-cut laws)."""
    v = float(rng.random())
    out = []
    masks = [0.0] * N_FAMILIES
    # greedy
    out.append(v * float(law.q[0]) / law.total if law.n else math.nan)
    # untruncated p_T: a listed candidate or the tail lump
    a = 1.0 / p.temperature
    w = np.exp(row.lp * a)
    tail_t = max(0.0, math.exp(row.log_z) - float(w.sum())) if p.temperature != 1.0 else row.tail
    probs = np.append(w, tail_t)
    r = int(rng.choice(probs.size, p=probs / probs.sum()))
    got = pit(law, None if r == row.lp.size else r, v)
    out.append(math.nan if got is None else got)
    if got is None:
        masks[1] = float(_bits(cut_by(row, p, order, None if r == row.lp.size else r, CUT_REACH)))
    # the kept candidates at T=1
    if law.n:
        k1 = np.exp(row.lp[:law.n])
        r = int(rng.choice(law.n, p=k1 / k1.sum()))
        out.append(float(pit(law, r, v) or 0.0))
        r = int(rng.integers(law.n))
        out.append(float(pit(law, r, v) or 0.0))
    else:
        out += [math.nan, math.nan]
    # cut_short: the kept candidates but the last; where the law has no cut inside the row, a draw of the law itself
    if edge is None:
        out.append(v)
    else:
        r = int(rng.choice(law.n - 1, p=law.q[:-1] / float(law.q[:-1].sum())))
        out.append(float(pit(law, r, v) or 0.0))
    # one truncation lost: a draw of that law (the law itself, v, where the request does not turn the cut on)
    alts = [_lost_cut_law(row, p, name, order) for name in CUTS]
    for alt in alts:
        if alt is None:
            out.append(v)
            continue
        w = np.append(alt.q, alt.lump)
        r = int(rng.choice(w.size, p=w / w.sum()))
        rank = None if r == alt.n else r
        got = pit(law, rank, v)
        out.append(math.nan if got is None else got)
        if got is None:
            masks[len(out) - 1] = float(_bits(cut_by(row, p, order, rank, CUT_REACH)))
    return out, masks, alts


# ---------------------------------------------------------------------------- statistics


def kolmogorov_sf(lam: float) -> float:
    """P(K > lam) for the Kolmogorov distribution (the limit of sqrt(n) D_n)."""
    if lam <= 0:
        return 1.0
    if lam < 0.2:
        return 1.0
    s = 0.0
    for k in range(1, 101):
        term = (-1) ** (k - 1) * math.exp(-2.0 * k * k * lam * lam)
        s += term
        if abs(term) < 1e-16:
            break
    return min(1.0, max(0.0, 2.0 * s))


def ks_uniform(u: np.ndarray) -> float:
    """The one-sample KS distance of u from Uniform(0, 1)."""
    x = np.sort(np.asarray(u, dtype=np.float64))
    n = x.size
    if n == 0:
        return 0.0
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - x), np.max(x - (i - 1) / n)))


def ks_p(d: float, n: int) -> float:
    """The p-value of a KS distance d over n points (Stephens' finite-n correction of the limit law)."""
    if n == 0:
        return 1.0
    rn = math.sqrt(n)
    return kolmogorov_sf((rn + 0.12 + 0.11 / rn) * d)


def ks_critical(n: int, alpha: float) -> float:
    """The smallest d whose ks_p is below alpha (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if ks_p(mid, n) < alpha:
            hi = mid
        else:
            lo = mid
    return hi


def binomial_upper(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * lp + (n - j) * lq
             for j in range(k, n + 1)]
    m = max(terms)
    return min(1.0, math.exp(m) * sum(math.exp(t - m) for t in terms))


def binomial_lower(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    return 1.0 if k >= n else 1.0 - binomial_upper(k + 1, n, p)


@dataclass(frozen=True)
class EdgeCount:
    """How often the law's cut token was drawn (`drawn`) at the positions whose law is cut inside the listed
    candidates (`positions`), and how often the law says it should be (`expected`: the sum of its probability
    there, edge_of)."""

    drawn: int = 0
    expected: float = 0.0
    positions: int = 0

    def __add__(self, other: EdgeCount) -> EdgeCount:
        return EdgeCount(self.drawn + other.drawn, self.expected + other.expected, self.positions + other.positions)


def edge_p(cand: EdgeCount, base: EdgeCount) -> float:
    """The edge test's p: the candidate draws the token at the law's cut less often than the baseline, relative to
    what the law expects on each side. A sampler whose support is cut too far in (top-p, top-k or min-p placed one
    token or more short, a cut computed on a sharper law) never draws it, where the other statistics see only a
    small shift of u near 1. Conditional on the total drawn, the candidate's count is Binomial with the share of
    the expectation that is the candidate's (two Poisson rates compared): the scorer's own misplacement of the cut,
    alike on both sides, cancels. One-sided: too many draws at the cut is a flatter law, which the KS and mean
    tests see."""
    m = cand.drawn + base.drawn
    tot = cand.expected + base.expected
    if cand.positions == 0 or base.positions == 0 or tot <= 0:
        return 1.0
    if m == 0:  # neither side drew it: the scorer does not place the engine's cut; nothing to compare
        return 1.0
    return binomial_lower(cand.drawn, m, cand.expected / tot)


def serial(groups: Sequence[Sequence[float]]) -> tuple[float, float, int]:
    """(mean, mean square, count) of the products (m_t - 1/2)(m_{t+1} - 1/2) of consecutive tokens' mid-PITs in
    vocabulary order (AnswerScore.pit) within each answer. A mid-PIT has mean exactly 1/2 under the law the token
    was drawn from whatever came before, so under a correct sampler the products have mean 0 (martingale
    differences); draws that share one uniform within a verify step (an inverse-CDF draw in vocabulary order at
    each node of the step) give nearly equal mid-PITs to consecutive tokens and a positive mean."""
    prods = [(a - 0.5) * (b - 0.5) for g in groups for a, b in itertools.pairwise(g)]
    if not prods:
        return 0.0, 0.0, 0
    x = np.asarray(prods, dtype=np.float64)
    return float(x.mean()), float((x * x).mean()), int(x.size)


def serial_p(cand: tuple[float, float, int], base: tuple[float, float, int]) -> tuple[float, float]:
    """(z, two-sided p) of the candidate's mean product against the baseline's (serial): the scorer's own
    departure from the engine's law (a server's top-k row renormalised) moves both sides alike and cancels."""
    (rc, vc, nc), (rb, vb, nb) = cand, base
    if nc < 2 or nb < 2:
        return 0.0, 1.0
    se = math.sqrt(vc / nc + vb / nb)
    if se <= 0:
        return 0.0, 1.0
    z = (rc - rb) / se
    return z, math.erfc(abs(z) / math.sqrt(2.0))


def binomial_sum_tail(k: int, strata: Sequence[tuple[int, float]], upper: bool = True) -> float:
    """P(X >= k) (upper) or P(X <= k) for X the sum of independent Binomial(m, s) over `strata` of (m, s): the
    exact law by convolution of the strata's pmfs (the counts here are tens to hundreds)."""
    pmf = np.ones(1)
    for m, s in strata:
        if m <= 0 or s <= 0:  # X = 0
            continue
        if s >= 1:  # X = m
            pmf = np.concatenate([np.zeros(m), pmf])
            continue
        j = np.arange(m + 1)
        lg = np.asarray([math.lgamma(m + 1) - math.lgamma(i + 1) - math.lgamma(m - i + 1) for i in range(m + 1)])
        pmf = np.convolve(pmf, np.exp(lg + j * math.log(s) + (m - j) * math.log1p(-s)))
    if upper:
        return float(min(1.0, pmf[max(0, k):].sum())) if k < pmf.size else 0.0
    return float(min(1.0, pmf[:max(0, k + 1)].sum()))


@dataclass(frozen=True)
class PooledAlphas:
    """The pooled tests' alphas (`pooled_test`), each over the whole gate (not per temperature)."""

    outside: float
    edge: float
    serial: float
    cut: float = 0.0  # each truncation's outside count (CUTS; 0: not tested)


def cut_counts_p(tests: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """The outside count of each truncation (CUTS) pooled over temperatures: per cut, the candidate's tokens left
    outside by it, the baseline's, the candidate's expected count and its p. Each temperature is a stratum
    conditional on its total of both sides' tokens outside that cut, Binomial with the candidate's share of the
    tokens whose requests turn the cut on (`cut_candidate` / `cut_baseline`: name -> [tokens, outside]); one-sided
    (more). A cut no request of a side turned on is left out."""
    out: dict[str, dict[str, float]] = {}
    for name in CUTS:
        counts = [(int(rc), int(c), int(rb), int(b)) for tv in tests
                  for (rc, c), (rb, b) in [((tv.get("cut_candidate") or {}).get(name, (0, 0)),
                                            (tv.get("cut_baseline") or {}).get(name, (0, 0)))] if rc > 0 and rb > 0]
        if counts:
            p, expected, _, _ = pooled_counts_p(counts, [])  # the all-cuts count's test, on this cut's strata
            out[name] = {"candidate": sum(x[1] for x in counts), "baseline": sum(x[3] for x in counts),
                         "expected": round(expected, 3), "p": p}
    return out


def pooled_counts_p(outside: Sequence[tuple[int, int, int, int]], edges: Sequence[tuple[EdgeCount, EdgeCount]]
                    ) -> tuple[float, float, float, float]:
    """The pooled outside and cut tests over temperatures: (the outside count's p, the candidate's expected outside
    count, the cut count's p, its expected cut count). `outside`: per temperature (candidate tokens, candidate
    outside, baseline tokens, baseline outside), tokens counted with their outside ones; `edges`: per temperature
    (the candidate's, the baseline's) draws at the law's cut. Each temperature conditional on its own total:
    Binomial with the candidate's share (of the tokens; of the expectation at the cut), the sum's law exact
    (binomial_sum_tail); outside one-sided more, the cut one-sided fewer."""
    out_strata = [(oc + ob, n_c / max(1, n_c + n_b)) for n_c, oc, n_b, ob in outside]
    oc = sum(o[1] for o in outside)
    p_out = binomial_sum_tail(oc, out_strata) if sum(m for m, _ in out_strata) else 1.0
    used = [(c, b) for c, b in edges if c.expected > 0 and b.expected > 0]
    e_strata = [(c.drawn + b.drawn, c.expected / (c.expected + b.expected)) for c, b in used]
    ec = sum(c.drawn for c, _ in used)
    p_edge = binomial_sum_tail(ec, e_strata, upper=False) if sum(m for m, _ in e_strata) else 1.0
    return p_out, sum(m * sh for m, sh in out_strata), p_edge, sum(m * sh for m, sh in e_strata)


@dataclass
class PooledVerdict:
    """The per-token statistics whose meaning does not depend on the temperature, pooled over every T>0
    temperature of the gate (`pooled_test`)."""

    ok: bool
    temperatures: int
    outside_candidate: int
    outside_baseline: int
    outside_expected: float   # the candidate's expected share of all outside tokens, summed over the temperatures
    outside_p: float
    edge_candidate: int
    edge_baseline: int
    edge_expected: float
    edge_p: float
    serial_z: float
    serial_p: float
    alphas: PooledAlphas
    reason: str = ""
    # each truncation's outside count (cut_counts_p): name -> candidate, baseline, expected, p
    cuts: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["alphas"] = dict(self.alphas.__dict__)
        return d


def _past(cut: str) -> str:
    """The counts by cut's reach rule in words (a threshold cut counts only tokens past CUT_REACH)."""
    return f" (past it by more than {CUT_REACH:g} logits)" if cut != "top_p" else ""


def pooled_test(tests: Sequence[Mapping[str, Any]], alphas: PooledAlphas) -> PooledVerdict:
    """Three of the per-token statistics pooled over the gate's T>0 temperatures (`tests`: each temperature's
    TokenVerdict as a dict). A fault of the sampler's support or randomness is rarely a fault of one temperature,
    and each temperature's test spends a third of the alpha on a third of the tokens: a support kept too wide at
    two temperatures (9 and 12 tokens outside the law against the baseline's 1 and 5, each short of its alpha)
    or a uniform shared by a step's tokens (consecutive-token z of +1.7 / +2.4 / +3.0) passes every temperature's
    test and not the pooled one. Each stays conditional on its temperature, so the scorer's noise, which differs
    between temperatures, cancels as it does per temperature:

    - outside: the candidate's tokens outside the request's law, summed; under a correct sampler, given each
      temperature's total of both sides, Binomial with the candidate's share of that temperature's tokens, so
      the sum's law is the convolution (binomial_sum_tail); one-sided (more than its share).
    - edge: the token at the law's cut drawn, summed; each temperature Binomial with the candidate's share of
      the expectation (edge_p); one-sided (fewer).
    - serial: Stouffer's z of the temperatures' serial z (each N(0, 1) under a correct sampler); two-sided.
    - cuts (alphas.cut > 0): the outside count again, by the truncation that left each token outside (cut_by,
      cut_counts_p): a fault of one truncation (min-p computed before the temperature: tokens outside min-p's cut
      at T < 1 only) stands out against that cut's own noise, where the count of all cuts dilutes it with the
      others' (top-p's cumulative sum flips most often). A threshold cut (top-k, min-p) counts, on both sides,
      only the tokens past it by more than CUT_REACH logits: the scorer's flips at the cut drop out of the count
      (the H100 series' weakest min-p fault run: 18 outside against 8.7 expected, p 2e-4; past 0.1 logits 16
      against the baseline's 1, docs/likelihood.md)."""
    outside = [(int(tv["n_candidate"]) + int(tv["outside_candidate"]), int(tv["outside_candidate"]),
                int(tv["n_baseline"]) + int(tv["outside_baseline"]), int(tv["outside_baseline"])) for tv in tests]
    edges = [(EdgeCount(int(tv.get("edge_candidate", 0)), float(tv.get("edge_expected_candidate", 0.0))),
              EdgeCount(int(tv.get("edge_baseline", 0)), float(tv.get("edge_expected_baseline", 0.0))))
             for tv in tests]
    edges = [(c, b) for c, b in edges if c.expected > 0 and b.expected > 0]
    zs = [float(tv.get("serial_z", 0.0)) for tv in tests if int(tv.get("serial_pairs", 0)) >= 2]
    p_out, out_exp, p_edge, edge_exp = pooled_counts_p(outside, edges)
    oc, ob = sum(o[1] for o in outside), sum(o[3] for o in outside)
    ec, eb = sum(c.drawn for c, _ in edges), sum(b.drawn for _, b in edges)
    z = sum(zs) / math.sqrt(len(zs)) if zs else 0.0
    p_ser = math.erfc(abs(z) / math.sqrt(2.0)) if zs else 1.0
    v = PooledVerdict(True, len(tests), oc, ob, round(out_exp, 3), p_out, ec, eb, round(edge_exp, 3), p_edge,
                      round(z, 4), p_ser, alphas)
    if alphas.cut > 0:
        v.cuts = cut_counts_p(tests)
    parts = []
    if p_out < alphas.outside:
        parts.append(f"{oc} tokens outside the request's top-k/top-p/min-p support over the {len(tests)} T>0 "
                     f"temperatures where the baseline's rate gives {out_exp:.1f} (baseline {ob}), p {p_out:.2g} < "
                     f"{alphas.outside:.2g}: the sampler's support is wider than the request's")
    for name, c in v.cuts.items():
        if c["p"] < alphas.cut:
            parts.append(f"{int(c['candidate'])} tokens outside the request's {name.replace('_', '-')} cut"
                         f"{_past(name)} over the T>0 temperatures where the baseline's rate gives "
                         f"{c['expected']:.1f} (baseline {int(c['baseline'])}), p {c['p']:.2g} < {alphas.cut:.2g}: "
                         f"the sampler's {name.replace('_', '-')} keeps more than the request's")
    if p_edge < alphas.edge:
        parts.append(f"the token at the law's cut drawn {ec} times where {edge_exp:.1f} are expected (baseline {eb}), "
                     f"p {p_edge:.2g} < {alphas.edge:.2g}: the sampler's support ends short of the request's cut")
    if p_ser < alphas.serial:
        parts.append(f"consecutive tokens' draws move together over the {len(zs)} temperatures: Stouffer z "
                     f"{z:+.1f}, p {p_ser:.2g} < {alphas.serial:.2g} (random numbers shared or replayed between "
                     "tokens)")
    v.ok = not parts
    v.reason = "; ".join(parts) or (
        f"over {len(tests)} T>0 temperatures: outside the law {oc} (expected {out_exp:.1f}, baseline {ob}) p "
        f"{p_out:.2g}; at the law's cut {ec} drawn, {edge_exp:.1f} expected p {p_edge:.2g}; consecutive tokens "
        f"Stouffer z {z:+.1f} p {p_ser:.2g}" + "".join(
            f"; outside the {k.replace('_', '-')} cut{_past(k)} {int(c['candidate'])} (expected "
            f"{c['expected']:.1f}) p {c['p']:.2g}" for k, c in v.cuts.items()))
    return v


NOISE_P = 0.01  # the baseline's own u count as non-uniform (the scorer's deviation allowed) below this p
MEDIAN_K = 0.8276  # the median of the Kolmogorov distribution


@dataclass
class TokenVerdict:
    """The per-token test at one temperature."""

    ok: bool
    n_candidate: int
    n_baseline: int
    ks_d: float
    ks_p: float
    baseline_ks_d: float
    baseline_ks_p: float
    noise_allowance: float
    outside_candidate: int
    outside_baseline: int
    outside_p: float
    alpha_ks: float
    alpha_outside: float
    mean_u: float | None
    approximate_share: float
    reason: str = ""
    power: dict[str, Any] = field(default_factory=dict)
    mean_p: float = 1.0               # the location test's p (after its allowance)
    mean_allowance: float = 0.0       # the scorer's own shift of the mean, measured on the baseline
    baseline_mean_u: float | None = None
    alpha_mean: float = 0.0
    # tokens clearly outside the law: past its cut by more than `outside_margin` of p_T mass. Zero tolerance, and
    # only where the scorer is exact at the cut for this engine: none of the baseline's own drawn tokens, at any
    # temperature, lies outside its law (margin MIN_MARGIN); else the margin is infinite and the outside count's
    # binomial test alone judges (a scorer whose numerics differ from the engine's moves the cut: the embedded
    # llama.cpp target drew a token 0.056 of p_T past the reference model's cut, 2026-12-04)
    clearly_outside: int = 0
    outside_margin: float = MIN_MARGIN
    farthest_outside: float = 0.0
    # tokens past a threshold cut (top-k, min-p) by more than the scorer's numeric reach (threshold_reach, logits):
    # zero tolerance. The margin is the profile's floor or a multiple of the farthest the baseline's own tokens lie
    # past such a cut (its numeric flips), whichever is larger (inf: the rule is off)
    past_reach: int = 0
    reach_margin: float = math.inf
    farthest_reach: float = 0.0
    baseline_farthest_reach: float = 0.0
    # the dispersion of the answers' mean u: sum of 12 n (mean - 1/2)^2 over answers / the number of answers (1
    # expected), the baseline's, the scorer's inflation of it measured there (1: none), its p, its alpha
    answers: int = 0
    dispersion: float | None = None
    baseline_dispersion: float | None = None
    dispersion_inflation: float = 1.0
    dispersion_p: float = 1.0
    alpha_dispersion: float = 0.0
    # the draws of the token at the law's cut (edge_p): the candidate's and the baseline's counts and expectations
    edge_candidate: int = 0
    edge_expected_candidate: float = 0.0
    edge_baseline: int = 0
    edge_expected_baseline: float = 0.0
    edge_positions: int = 0
    edge_p: float = 1.0
    alpha_edge: float = 0.0
    # consecutive tokens within answers (serial_p): the mean product of their centred vocabulary-order mid-PITs,
    # candidate and baseline, the pairs, z and p
    serial_candidate: float | None = None
    serial_baseline: float | None = None
    serial_pairs: int = 0
    serial_z: float = 0.0
    serial_p: float = 1.0
    alpha_serial: float = 0.0
    # per truncation (CUTS) the tokens of the requests that turn it on and those left outside by it, each side
    # (cut_by; pooled over the temperatures by pooled_test)
    cut_candidate: dict[str, list[int]] = field(default_factory=dict)
    cut_baseline: dict[str, list[int]] = field(default_factory=dict)
    # per threshold cut (top_k, min_p) the reach of each token it leaves outside, each side (cut_reaches, logits,
    # sorted): the counts by cut at any bar (CUT_REACH is the gate's), recomputable from the report
    cut_reach_candidate: dict[str, list[float]] = field(default_factory=dict)
    cut_reach_baseline: dict[str, list[float]] = field(default_factory=dict)
    cut_reach_bar: float = CUT_REACH

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def noise_allowance(base_u: np.ndarray) -> tuple[float, float, float]:
    """(the baseline's KS distance, its p, the allowance): the scorer's own deviation from the engine's sampler,
    the baseline's distance beyond its median under uniformity when the baseline is not uniform at NOISE_P."""
    n = base_u.size
    d = ks_uniform(base_u)
    p = ks_p(d, n)
    allow = max(0.0, d - MEDIAN_K / math.sqrt(n)) if n and p < NOISE_P else 0.0
    return d, p, allow


def mean_allowance(base_u: np.ndarray) -> float:
    """The scorer's own shift of the mean u, from the baseline: its distance from 1/2 beyond the median of that
    distance under uniformity (0.6745 sd) when the baseline's mean is off at NOISE_P, else 0."""
    n = base_u.size
    if not n:
        return 0.0
    sd = 1.0 / math.sqrt(12.0 * n)
    off = abs(float(base_u.mean()) - 0.5)
    return max(0.0, off - 0.6745 * sd) if math.erfc(off / sd / math.sqrt(2.0)) < NOISE_P else 0.0


def mean_p(u: np.ndarray, allow: float) -> float:
    """Two-sided p of the mean of n uniform draws being this far from 1/2 (less the allowance)."""
    if not u.size:
        return 1.0
    z = max(0.0, abs(float(u.mean()) - 0.5) - allow) * math.sqrt(12.0 * u.size)
    return math.erfc(z / math.sqrt(2.0))


def chi2_sf(x: float, k: int) -> float:
    """P(X > x) for X ~ chi-square with k degrees of freedom: the regularized upper incomplete gamma Q(k/2, x/2),
    by its power series below a + 1 and its continued fraction (modified Lentz) above."""
    if x <= 0 or k <= 0:
        return 1.0
    a, z = k / 2.0, x / 2.0
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1.0:  # P(a, z) = z^a e^-z / Gamma(a) * sum z^n / (a (a+1) ... (a+n))
        term = total = 1.0 / a
        d = a
        for _ in range(10000):
            d += 1.0
            term *= z / d
            total += term
            if term < total * 1e-15:
                break
        return min(1.0, max(0.0, 1.0 - math.exp(log_front) * total))
    tiny = 1e-300
    b = z + 1.0 - a
    c, dd = 1.0 / tiny, 1.0 / b
    h = dd
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2.0
        dd = an * dd + b
        dd = tiny if abs(dd) < tiny else dd
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        dd = 1.0 / dd
        delta = dd * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return min(1.0, max(0.0, math.exp(log_front) * h))


def dispersion(groups: Sequence[np.ndarray]) -> tuple[float, int]:
    """(sum over answers of 12 n (mean u - 1/2)^2, the number of answers with a u): each term has mean 1 when the
    answer's u are independent uniforms."""
    total, k = 0.0, 0
    for g in groups:
        if g.size:
            total += 12.0 * g.size * (float(g.mean()) - 0.5) ** 2
            k += 1
    return total, k


def dispersion_inflation(d: float, k: int) -> float:
    """The scorer's own inflation of the dispersion, from the baseline's answers scored the same way (`d`, `k`:
    their `dispersion`): their dispersion per answer when it is above 1 at NOISE_P, else 1 (none)."""
    return max(1.0, d / k) if k and chi2_sf(d, k) < NOISE_P else 1.0


@dataclass(frozen=True)
class Alphas:
    """The per-token test's alpha per statistic."""

    ks: float
    mean: float
    outside: float
    dispersion: float = 0.0  # 0: the answers' dispersion is not tested (a test given no answer grouping)
    edge: float = 0.0  # 0: the draws at the law's cut are not tested (edge_p)
    serial: float = 0.0  # 0: consecutive tokens' vocabulary-order mid-PITs are not tested (serial_p)


def decide(cand_u: np.ndarray, n_out_c: int, n_base: int, n_out_b: int, allow: float, a: Alphas,
           allow_mean: float = 0.0) -> tuple[bool, float, float, float, float]:
    """(pass, the candidate's KS distance, its p after the allowance, the outside test's p, the mean's p)."""
    n = cand_u.size
    d = ks_uniform(cand_u)
    p = ks_p(max(0.0, d - allow), n)
    pm = mean_p(cand_u, allow_mean)
    n_c = n + n_out_c
    k = n_out_c + n_out_b
    p_out = binomial_upper(n_out_c, k, n_c / max(1, n_c + n_base)) if k else 1.0
    return p >= a.ks and pm >= a.mean and p_out >= a.outside, d, p, p_out, pm


def token_test(cand: Sequence[float | None], base: Sequence[float | None], alphas: Alphas,
               approximate: int = 0, limit: float = 0.05, cand_excess: Sequence[float] = (),
               exact_cut: bool = False, cand_answers: Sequence[Sequence[float | None]] = (),
               base_answers: Sequence[Sequence[float | None]] = (), cand_edge: EdgeCount | None = None,
               base_edge: EdgeCount | None = None, cand_mid: Sequence[Sequence[float]] = (),
               base_mid: Sequence[Sequence[float]] = (), cand_cut: Mapping[str, Sequence[int]] | None = None,
               base_cut: Mapping[str, Sequence[int]] | None = None, cand_reach: Sequence[float | None] = (),
               reach_margin: float = math.inf, baseline_reach: float = 0.0) -> TokenVerdict:
    """The candidate's per-token PITs (None: outside the law) against uniform, the baseline's scored the same way
    giving the scorer's allowance (module docstring). `limit`: the largest allowance the test accepts: beyond it
    the scorer does not reproduce the engine's law and the test cannot judge (a fail, with that reason).
    `cand_answers` / `base_answers`: the same PITs by answer, for the dispersion test (tested when given and
    alphas.dispersion > 0). `cand_edge` / `base_edge`: the draws at the law's cut, for the edge test (tested when
    given and alphas.edge > 0). `cand_mid` / `base_mid`: each answer's vocabulary-order mid-PITs, for the serial
    test (tested when given and alphas.serial > 0). `cand_cut` / `base_cut`: per truncation [tokens, outside]
    (kept in the verdict for the pooled test). `cand_reach`: each outside candidate token's reach past the
    request's threshold cuts (threshold_reach; None: outside top-p only); any past `reach_margin` refuses
    (`baseline_reach`: the farthest of the baseline's, reported)."""
    cu = np.asarray([x for x in cand if x is not None], dtype=np.float64)
    bu = np.asarray([x for x in base if x is not None], dtype=np.float64)
    oc, ob = len(cand) - cu.size, len(base) - bu.size
    bd, bp, allow = noise_allowance(bu) if bu.size else (0.0, 1.0, 0.0)
    am = mean_allowance(bu)
    ok, d, p, p_out, pm = decide(cu, oc, bu.size, ob, allow, alphas, am)
    v = TokenVerdict(ok, cu.size, bu.size, d, p, bd, bp, allow, oc, ob, p_out, alphas.ks, alphas.outside,
                     float(cu.mean()) if cu.size else None, approximate / max(1, len(cand)), mean_p=pm,
                     mean_allowance=am, baseline_mean_u=float(bu.mean()) if bu.size else None,
                     alpha_mean=alphas.mean)
    a_ks, a_out = alphas.ks, alphas.outside
    disp_bad = False
    if alphas.dispersion > 0 and cand_answers:
        cg = [np.asarray([x for x in g if x is not None], dtype=np.float64) for g in cand_answers]
        bg = [np.asarray([x for x in g if x is not None], dtype=np.float64) for g in base_answers]
        d_c, k_c = dispersion(cg)
        d_b, k_b = dispersion(bg)
        v.answers, v.alpha_dispersion = k_c, alphas.dispersion
        v.dispersion = d_c / k_c if k_c else None
        v.baseline_dispersion = d_b / k_b if k_b else None
        v.dispersion_inflation = dispersion_inflation(d_b, k_b)
        v.dispersion_p = chi2_sf(d_c / v.dispersion_inflation, k_c) if k_c else 1.0
        disp_bad = v.dispersion_p < alphas.dispersion
    edge_bad = False
    if alphas.edge > 0 and cand_edge is not None and base_edge is not None:
        v.edge_candidate, v.edge_expected_candidate = cand_edge.drawn, round(cand_edge.expected, 3)
        v.edge_baseline, v.edge_expected_baseline = base_edge.drawn, round(base_edge.expected, 3)
        v.edge_positions, v.alpha_edge = cand_edge.positions, alphas.edge
        v.edge_p = edge_p(cand_edge, base_edge)
        edge_bad = v.edge_p < alphas.edge
    serial_bad = False
    if alphas.serial > 0 and cand_mid and base_mid:
        sc, sb = serial(cand_mid), serial(base_mid)
        v.serial_candidate, v.serial_baseline, v.serial_pairs = round(sc[0], 6), round(sb[0], 6), sc[2]
        v.serial_z, v.serial_p = serial_p(sc, sb)
        v.alpha_serial = alphas.serial
        serial_bad = v.serial_p < alphas.serial
    v.cut_candidate = {k: [int(x) for x in n] for k, n in (cand_cut or {}).items()}
    v.cut_baseline = {k: [int(x) for x in n] for k, n in (base_cut or {}).items()}
    v.outside_margin = MIN_MARGIN if exact_cut else math.inf
    v.farthest_outside = max(cand_excess, default=0.0)
    v.clearly_outside = sum(1 for e in cand_excess if e > v.outside_margin)
    reach = [r for r in cand_reach if r is not None]
    v.reach_margin, v.baseline_farthest_reach = reach_margin, round(baseline_reach, 4)
    v.farthest_reach = round(max(reach, default=0.0), 4)
    v.past_reach = sum(1 for r in reach if r > reach_margin)
    if cu.size == 0:
        v.ok, v.reason = False, "no candidate token inside the law: nothing to test"
    elif allow > limit:
        v.ok = False
        v.reason = (f"the scorer does not reproduce the engine's law on the baseline's own tokens (KS {bd:.3f}, "
                    f"p {bp:.2g}; allowance {allow:.3f} > {limit:g}): wrong sampler order or parameters, or another "
                    "model")
    elif not ok or v.clearly_outside or v.past_reach or disp_bad or edge_bad or serial_bad:
        v.ok = False
        parts = []
        if v.past_reach:
            parts.append(f"{v.past_reach} token(s) past the request's top-k/min-p cut by more than the scorer's "
                         f"numeric reach (up to {v.farthest_reach:.3g} logits past it, margin {reach_margin:.3g}; the "
                         f"baseline's own tokens at most {v.baseline_farthest_reach:.3g}): a cut computed on another "
                         "law or with another parameter")
        if v.clearly_outside:
            parts.append(f"{v.clearly_outside} token(s) clearly outside the request's top-k/top-p/min-p support (up to "
                         f"{v.farthest_outside:.3g} of p_T past its cut, margin {v.outside_margin:.3g}: what a correct "
                         "sampler never draws)")
        if p < a_ks or pm < alphas.mean:
            parts.append(f"sampled tokens not distributed as the target's law over {cu.size} tokens: KS {d:.4f} "
                         f"(allowance {allow:.4f}) p {p:.2g} (alpha {a_ks:.2g}); mean u {v.mean_u:.4f}, 0.5 expected "
                         f"(below: too often the most likely tokens; above: too often unlikely ones), p {pm:.2g} "
                         f"(alpha {alphas.mean:.2g})")
        if p_out < a_out:
            parts.append(f"{oc} of {len(cand)} tokens outside the request's top-k/top-p/min-p support (baseline "
                         f"{ob} of {len(base)}), p {p_out:.2g} < {a_out:.2g}")
        if disp_bad:
            parts.append(f"the draws within an answer are not independent draws of the law: the {v.answers} answers' "
                         f"mean u stray {v.dispersion:.2f}x as far as independent draws do (baseline "
                         f"{v.baseline_dispersion or 0.0:.2f}x, scorer inflation {v.dispersion_inflation:.2f}), p "
                         f"{v.dispersion_p:.2g} < {alphas.dispersion:.2g} (random numbers shared or replayed across "
                         "positions, or a law wrong per request)")
        if edge_bad:
            parts.append(f"the token at the law's cut drawn {v.edge_candidate} times where the law expects "
                         f"{v.edge_expected_candidate:.1f} (baseline {v.edge_baseline} of "
                         f"{v.edge_expected_baseline:.1f}), p {v.edge_p:.2g} < {alphas.edge:.2g}: the sampler's "
                         "support ends short of the request's top-k/top-p/min-p cut")
        if serial_bad:
            parts.append(f"consecutive tokens' draws are not independent: their vocabulary-order PITs move together "
                         f"(mean product {v.serial_candidate:+.5f} against the baseline's {v.serial_baseline:+.5f} "
                         f"over {v.serial_pairs} pairs, z {v.serial_z:+.1f}, p {v.serial_p:.2g} < "
                         f"{alphas.serial:.2g}: random numbers shared between the tokens of a step)")
        v.reason = "; ".join(parts)
    else:
        v.reason = (f"{cu.size} tokens: KS {d:.4f} (allowance {allow:.4f}) p {p:.3g}; mean u {v.mean_u:.4f} p "
                    f"{pm:.3g}; outside the law {oc} (baseline {ob}) p {p_out:.3g}")
        if v.dispersion is not None:
            v.reason += f"; answers' dispersion {v.dispersion:.2f} over {v.answers} answers p {v.dispersion_p:.3g}"
        if v.alpha_serial > 0:
            v.reason += f"; consecutive tokens z {v.serial_z:+.1f} p {v.serial_p:.3g}"
        if v.alpha_edge > 0:
            v.reason += (f"; at the law's cut {v.edge_candidate} drawn, {v.edge_expected_candidate:.1f} expected "
                         f"(baseline {v.edge_baseline} of {v.edge_expected_baseline:.1f}) p {v.edge_p:.3g}")
    return v


@dataclass(frozen=True)
class PowerInput:
    """One temperature's share of a power statement: the wrong laws' draws over the baseline's tokens (rows of
    wrong_draws, DRAW_COLUMNS wide; narrower rows hold the families' PITs and distances only) and what `decide`
    needs at the gate's own size."""

    draws: np.ndarray
    n_cand: int
    allow: float
    n_base: int
    n_out_b: int
    alphas: Alphas
    allow_mean: float = 0.0
    base_edge: EdgeCount | None = None  # the baseline's draws at the law's cut (the edge test; None: not tested)
    # the baseline's [tokens, outside] per truncation (CUTS; pooled_test's counts by cut; None: not tested)
    base_cut: Mapping[str, Sequence[int]] | None = None


# below this mean total-variation distance a family is no deviation from the law at all (kept_at_t1 at T=1, or
# untruncated for requests with no truncation): nothing can refuse it and nothing needs to
TV_FLOOR = 1e-4


@dataclass(frozen=True)
class _Simulated:
    """One simulated candidate at one temperature (_refused_once)."""

    refused: bool  # by a statistic of its temperature
    n_out: int  # its tokens outside the law
    edge: EdgeCount | None  # its draws at the law's cut (None: not tested)
    cut: dict[str, list[int]] | None  # its [tokens, outside] per truncation (None: not tested)


def _refused_once(x: PowerInput, j: int, r: float, rng: np.random.Generator) -> _Simulated:
    """One simulated candidate: each of its tokens at a baseline position drawn at random, from wrong law j (its
    PITs: column j of the draws) with probability r, else from the correct law (a uniform u)."""
    col = x.draws[:, j]
    m = int(rng.binomial(x.n_cand, r))
    at = rng.integers(col.size, size=x.n_cand)
    picked = col[at[:m]]
    u = np.concatenate([picked, rng.random(x.n_cand - m)])  # u[i] is a draw at position at[i]
    inside = u[~np.isnan(u)]
    n_out = int(np.isnan(picked).sum())
    refused = not decide(inside, n_out, x.n_base, x.n_out_b, x.allow, x.alphas, x.allow_mean)[0]
    full = x.draws.shape[1] == DRAW_COLUMNS
    cut_counts = None
    if full and x.base_cut is not None:  # the tokens per cut: those of requests turning it on; outside: the wrong
        on = x.draws[at, CUTS_ON_COL].astype(np.int64)  # law's draws that cut leaves outside
        out_mask = np.where(np.isnan(picked), x.draws[at[:m], CUT_MASK_COL + j], 0.0).astype(np.int64)
        cut_counts = {name: [int(np.sum((on >> i) & 1)), int(np.sum((out_mask >> i) & 1))]
                      for i, name in enumerate(CUTS)}
    edge_col = EDGE_COL if full else 2 * N_FAMILIES
    if x.base_edge is None or x.alphas.edge <= 0 or x.draws.shape[1] <= edge_col:
        return _Simulated(refused, n_out, None, cut_counts)
    e = x.draws[at, edge_col]  # the law's cut: a token drawn there has u in its top e of (0, 1)
    cut = ~np.isnan(e)
    drawn = int(np.sum(cut & ~np.isnan(u) & (u >= 1.0 - np.where(cut, e, 0.0))))
    cand = EdgeCount(drawn, float(e[cut].sum()), int(cut.sum()))
    return _Simulated(refused or edge_p(cand, x.base_edge) < x.alphas.edge, n_out, cand, cut_counts)


def _pooled_refuses(inputs: Sequence[PowerInput], once: Sequence[_Simulated], alphas: PooledAlphas) -> bool:
    """The pooled outside, edge and by-truncation tests (pooled_test) of one simulated candidate over the
    temperatures of `inputs` (the serial statistic is not simulated: the wrong laws are marginal laws)."""
    outside = [(x.n_cand, o.n_out, x.n_base + x.n_out_b, x.n_out_b) for x, o in zip(inputs, once, strict=True)]
    edges = [(o.edge, x.base_edge) for x, o in zip(inputs, once, strict=True)
             if o.edge is not None and x.base_edge is not None]
    p_out, _, p_edge, _ = pooled_counts_p(outside, edges)
    if p_out < alphas.outside or p_edge < alphas.edge:
        return True
    if alphas.cut <= 0 or any(o.cut is None for o in once):
        return False
    by_cut = cut_counts_p([{"cut_candidate": o.cut, "cut_baseline": x.base_cut}
                           for x, o in zip(inputs, once, strict=True)])
    return any(c["p"] < alphas.cut for c in by_cut.values())


def _rejection(inputs: Sequence[PowerInput], j: int, r: float, reps: int, rng: np.random.Generator,
               pooled: PooledAlphas | None = None) -> float:
    """The probability that a candidate whose tokens come from family j with probability r, at every temperature
    of `inputs` at once, is refused by at least one of their tests, or by the pooled tests over them when
    `pooled` alphas are given and there are two or more (Monte Carlo)."""
    hits = 0
    for _ in range(reps):
        once = [_refused_once(x, j, r, rng) for x in inputs]
        hit = any(o.refused for o in once)
        if not hit and pooled is not None and len(inputs) > 1:
            hit = _pooled_refuses(inputs, once, pooled)
        hits += hit
    return hits / reps


def power_statement(inputs: Sequence[PowerInput], target: float, reps: int, seed: int, lo: float = 1e-3,
                    steps: int = 9, families: Sequence[str] = FAMILIES,
                    pooled: PooledAlphas | None = None) -> dict[str, Any]:
    """What the per-token tests of `inputs` refuse together, by Monte Carlo at the gate's own token counts: per
    family of FAMILIES, the smallest share r of tokens drawn from that wrong law (at every temperature of
    `inputs`) refused with probability >= target, found by bisection on log r between `lo` and 1 (`steps`
    halvings: about 4% apart at the end), and the mean total-variation distance from p_T it makes (r times the
    family's mean distance over the candidate's tokens). A family whose mean distance is below TV_FLOOR is no
    deviation (`no_deviation`, left out); one not refused even at r = 1 is named in `unrefused_families` and counts
    with its whole distance (no law in its direction lies farther from p_T). The statement over all families,
    `min_mean_tv_all_families`, is the largest of those distances: every sampler law farther than that from p_T in
    one of these directions is refused with the target probability. `pooled`: the pooled tests' alphas
    (pooled_test), simulated too when `inputs` hold two or more temperatures: its outside count, its draws at
    the law's cut (the edge test) and, where the draws and the baseline's counts carry them, its counts by
    truncation (cut_counts_p)."""
    rng = np.random.default_rng(seed)
    xs = [x for x in inputs if x.draws.size and x.n_cand]
    n_tok = sum(x.n_cand for x in xs)
    out: dict[str, Any] = {"reps": reps, "target": target, "n_tokens": n_tok, "families": {}}
    if not xs:
        return {**out, "estimated": False}
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown wrong-law families {unknown}; known: {list(FAMILIES)}")
    nf = N_FAMILIES  # the draws' columns follow FAMILIES, whichever of them are asked for
    weights = np.asarray([x.n_cand for x in xs], dtype=np.float64) / n_tok
    worst: list[float] = []
    unrefused: list[str] = []
    rates: list[float | None] = []
    for fam in families:
        j = FAMILIES.index(fam)
        tvs = [float(x.draws[:, nf + j].mean()) if x.draws.shape[1] >= 2 * nf else math.nan for x in xs]
        mean_tv = float(np.dot(weights, tvs))
        rec: dict[str, Any] = {"mean_tv_of_law": mean_tv, "rejection_rate": {}}
        if math.isfinite(mean_tv) and mean_tv < TV_FLOOR:
            rec.update(min_rate=None, min_mean_tv=None, no_deviation=True)
            out["families"][fam] = rec
            continue

        def rej(r: float, j: int = j, rec: dict[str, Any] = rec) -> float:
            got = _rejection(xs, j, r, reps, rng, pooled)
            rec["rejection_rate"][f"{r:.4g}"] = got
            return got

        if rej(1.0) < target:
            rec.update(min_rate=None, min_mean_tv=None)
            unrefused.append(fam)
            worst.append(mean_tv)
            rates.append(None)
        else:
            a, b = math.log(lo), 0.0  # rej(e^b) >= target; bisect for the smallest such r
            if rej(lo) >= target:
                b = a
            else:
                for _ in range(steps):
                    mid = 0.5 * (a + b)
                    if rej(math.exp(mid)) >= target:
                        b = mid
                    else:
                        a = mid
            r = math.exp(b)
            rec.update(min_rate=r, min_mean_tv=r * mean_tv if math.isfinite(mean_tv) else None)
            worst.append(rec["min_mean_tv"] if rec["min_mean_tv"] is not None else math.nan)
            rates.append(r)
        out["families"][fam] = rec
    out["estimated"] = True
    known = [r for r in rates if r is not None]
    out["min_rate_all_families"] = max(known) if known and len(known) == len(rates) else None
    # the deviation refused in every family, as the mean total-variation distance of the sampler's law from p_T; a
    # family not refused even with every token drawn from it (`unrefused_families`) counts with its whole distance:
    # no law in that direction lies farther from p_T
    out["min_mean_tv_all_families"] = max(worst) if worst and all(math.isfinite(w) for w in worst) else None
    out["unrefused_families"] = unrefused
    return out


def token_power(draws: np.ndarray, n_cand: int, allow: float, n_base: int, n_out_b: int, alphas: Alphas,
                target: float, reps: int, seed: int, allow_mean: float = 0.0, base_edge: EdgeCount | None = None
                ) -> dict[str, Any]:
    """power_statement for one temperature's test."""
    return power_statement([PowerInput(draws, n_cand, allow, n_base, n_out_b, alphas, allow_mean, base_edge)],
                           target, reps, seed)


__all__ = [
    "CUTS",
    "CUTS_ON_COL",
    "CUT_MASK_COL",
    "CUT_REACH",
    "DRAW_COLUMNS",
    "EDGE_COL",
    "FAMILIES",
    "N_FAMILIES",
    "ORDERS",
    "TV_FLOOR",
    "Alphas",
    "EdgeCount",
    "Law",
    "PooledAlphas",
    "PowerInput",
    "Row",
    "SamplingParams",
    "TokenVerdict",
    "binomial_lower",
    "binomial_upper",
    "decide",
    "edge_of",
    "edge_p",
    "ks_critical",
    "ks_p",
    "ks_uniform",
    "law_of",
    "noise_allowance",
    "order_of",
    "pit",
    "power_statement",
    "row_from_logits",
    "row_from_topk",
    "serial",
    "serial_p",
    "token_power",
    "token_test",
    "uniform_of",
    "wrong_draws",
]
