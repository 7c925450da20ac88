"""Target distributions and the speculative acceptance rule, in numpy (no model inside: unit-testable).

`target_probs` turns one row of logits into the distribution the target samples from at a temperature,
top-k and top-p. `speculative_accept` is the speculative-sampling rule for one drafted token x drawn from a
drafter distribution q: accept with probability min(1, p(x)/q(x)), otherwise the next token comes from the
residual max(p - q, 0) renormalised; the result is distributed exactly as p. `accept_tree` walks a drafted
tree with it: at a node, the children are tried one after another (each a deterministic proposal, q a point
mass), every rejection replacing p by its residual; the first accepted child is descended into, and when
none is accepted the bonus token is drawn from what is left (recursive rejection sampling, exact for any
tree). At T=0 the same walk is greedy: descend while a child is the target's argmax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

_TOP_P_CANDIDATES = 512  # top-p first looks among this many most likely tokens, then sorts everything if short


def target_probs(logits: np.ndarray, temperature: float, top_p: float | None = None,
                 top_k: int | None = None, min_p: float | None = None, fault: str | None = None) -> np.ndarray:
    """The sampling distribution (float64, sums to 1) of one logits row at temperature > 0: softmax of
    logits / T, cut to the top_k most likely tokens (0 or None: no cut), then to the smallest set of most
    likely tokens whose mass reaches top_p (the token that crosses it included), then to the tokens with at
    least min_p times the most likely one's probability, renormalised after each cut (the order this engine
    names in its /props `samplers`). fault: the engine's sampler fault, if any (heldout_d lives here)."""
    if temperature <= 0:
        raise ValueError("target_probs needs a temperature > 0 (T=0 is greedy)")
    z = np.asarray(logits, dtype=np.float64) / temperature
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    n = p.shape[0]
    if top_k and 0 < top_k < n:
        keep = np.argpartition(-p, top_k - 1)[:top_k]
        q = np.zeros_like(p)
        q[keep] = p[keep]
        p = q / q.sum()
    if top_p is not None and top_p < 1.0:
        m = min(n, _TOP_P_CANDIDATES)
        cand = np.argpartition(-p, m - 1)[:m] if m < n else np.arange(n)
        if p[cand].sum() < top_p:  # the nucleus is wider than the candidates: sort the whole row
            cand = np.arange(n)
        order = cand[np.argsort(-p[cand], kind="stable")]
        csum = np.cumsum(p[order])
        cut = int(np.searchsorted(csum, top_p, side="left")) + 1
        if fault == "heldout_d":  # the fault: only the tokens whose cumsum < top_p (the + 1 forgotten), at least one
            cut = max(1, cut - 1)
        q = np.zeros_like(p)
        keep = order[:cut]
        q[keep] = p[keep]
        p = q / q.sum()
    if min_p:
        p = np.where(p >= p.max() * min_p, p, 0.0)
        p = p / p.sum()
    return p


def node_probs(row: np.ndarray, temperature: float, top_p: float | None = None, top_k: int | None = None,
               fault: str | None = None, min_p: float | None = None) -> np.ndarray:
    """The distribution the acceptance walk uses at a verify node: target_probs of its logits row (fault: the
    engine's sampler fault, if any)."""
    if fault == "heldout_a":  # the fault: the verify pass drops the request's top-p and top-k
        top_p, top_k = None, None
    return target_probs(row, temperature, top_p, top_k, min_p, fault)


def sample(p: np.ndarray, rng: np.random.Generator, u: float | None = None) -> int:
    """One token drawn from p (inverse CDF on one uniform draw; u: that draw, default a fresh one from rng)."""
    c = np.cumsum(p)
    if u is None:
        u = rng.random()
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(p) - 1))


def speculative_accept(p: np.ndarray, q: np.ndarray, x: int, rng: np.random.Generator,
                       u: float | None = None) -> tuple[bool, np.ndarray]:
    """The speculative-sampling rule for a drafted token x ~ q: (True, p) when accepted (probability
    min(1, p(x)/q(x))), else (False, residual) with residual = max(p - q, 0) renormalised, the distribution
    the replacement token must be drawn from. u: the uniform draw of the test, default a fresh one from rng."""
    px, qx = float(p[x]), float(q[x])
    if qx <= 0:
        raise ValueError(f"drafted token {x} has drafter probability 0")
    if u is None:
        u = rng.random()
    if u < min(1.0, px / qx):
        return True, p
    r = np.maximum(p - q, 0.0)
    s = r.sum()
    if s <= 0:  # p <= q everywhere means p == q: a rejection has probability 0 then; keep p
        return False, p
    return False, r / s


def point_mass(n: int, x: int) -> np.ndarray:
    q = np.zeros(n, dtype=np.float64)
    q[x] = 1.0
    return q


def accept_tree(children: Sequence[Sequence[int]], tokens: Sequence[int], dist: Callable[[int], np.ndarray],
                rng: np.random.Generator | None, residual: bool = True,
                fault: str | None = None) -> tuple[list[int], int]:
    """Walk a drafted tree from its root (node 0) and return (accepted path of node indices starting with
    the root, the bonus token drawn after the path's last node).

    children[u]: node u's children in the drafter's order; tokens[u]: node u's token; dist(u): the target's
    distribution at node u (a probability vector at T>0; a logits row when rng is None, i.e. greedy).
    residual=False is the test bed's `no_residual` fault: after a rejection the walk keeps p (wrong).
    fault: the engine's sampler fault, if any (T>0 only).
    """
    path = [0]
    u = 0
    while True:
        row = dist(u)
        if rng is None:  # T=0: the target's argmax, descended into while a child carries it
            best = int(np.argmax(row))
            nxt = next((c for c in children[u] if tokens[c] == best), None)
            if nxt is None:
                return path, best
            path.append(nxt)
            u = nxt
            continue
        p = row
        nxt = None
        last: float | None = None
        for c in children[u]:
            last = rng.random()
            ok, r = speculative_accept(p, point_mass(len(p), tokens[c]), tokens[c], rng, last)
            if residual:
                p = r
            if ok:
                nxt = c
                break
        if nxt is None:
            # heldout_b: the replacement drawn with the uniform that decided the last rejection (in [p(x), 1))
            held = last if fault == "heldout_b" else None
            return path, sample(p, rng, held)
        path.append(nxt)
        u = nxt


def emitted_law(p: np.ndarray, child_tokens: Sequence[int], residual: bool = True,
                held_last: bool = False) -> np.ndarray:
    """The exact law of the one token the T>0 walk emits at a node whose distribution is p and whose drafted
    children carry `child_tokens` (tried in order, point-mass drafts): the first accepted child, or the bonus
    drawn when every child is rejected. residual=False is `no_residual` (p is kept after a rejection);
    held_last is `heldout_b` (the bonus drawn by inverse CDF with the uniform that decided the last rejection,
    which lies in [p'(x), 1) for the residual p' the last child x was tested against). With residual=True and
    held_last=False the law is p itself (recursive rejection sampling is exact): tests/testbed check both."""
    out = np.zeros_like(p, dtype=np.float64)
    cur = np.asarray(p, dtype=np.float64)
    stay = 1.0            # the probability that every child so far was rejected
    last_a: float | None = None
    for x in child_tokens:
        px = float(cur[x])
        out[x] += stay * px  # accept with probability min(1, p'(x) / q(x)) = p'(x), q a point mass
        stay *= 1.0 - px
        last_a = px
        if residual:
            r = cur.copy()
            r[x] = 0.0
            s = r.sum()
            cur = r / s if s > 0 else cur
        if stay <= 0:
            return out
    if held_last and last_a is not None:
        # sample(): token i takes the uniforms in [C_{i-1}, C_i) of the cumulative sum; here u ~ U[last_a, 1)
        c = np.cumsum(cur) / cur.sum()
        lo = np.concatenate([[0.0], c[:-1]])
        bonus = np.clip(np.minimum(c, 1.0) - np.maximum(lo, last_a), 0.0, None) / max(1e-300, 1.0 - last_a)
        bonus[-1] += max(0.0, 1.0 - float(bonus.sum()))  # sample() clamps u * C past the end to the last index
        out += stay * bonus
    else:
        out += stay * cur
    return out


def total_variation(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).sum())

