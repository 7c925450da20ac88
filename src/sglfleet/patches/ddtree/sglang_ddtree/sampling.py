"""The target's draw at every node of a DDTree verify step, in plain torch (no sglang import at module level).

Law (``node_draws``): for each request ``b`` of the batch and each of its ``width`` tree nodes ``n``,

- greedy requests (temperature <= ``GREEDY_T`` or top_k == 1) take ``argmax(logits[n])``;
- every other request draws from ``q = softmax(logits[n] / T_b)`` restricted to the joint top-k / top-p / min-p
  support of ``q`` (``renorm``: all three masks computed on the same sorted ``q``, sglang's order) and
  renormalised; seeded requests through the seeded draw (sglang's ``multinomial_with_seed``: Gumbel noise hashed
  from seed, position and vocabulary id), the others through ``torch.multinomial``.

The per-request parameters are repeated over the ``width`` nodes of each request (rows ``b * width ..
(b + 1) * width - 1`` of ``logits``). ``TEST_FAULTS`` are wrong samplers on purpose, for the validation tests:
each keeps the greedy rows exact and changes one thing about the draw (docs/ddtree-sampler.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

# Faults the validation tests put into a served DDTree on purpose (never set in production, never on by default):
# the gate must refuse the server they run in. Each one keeps every greedy row (T = 0 or top_k == 1) exactly argmax
# and makes the T > 0 draws wrong in one way, one per class of "how a draw can be wrong":
TEST_FAULTS = (
    # randomness: the target's draws at the nodes of one verify step share their random numbers, so the tokens a
    # step emits are dependent while each keeps its own law. Unseeded requests (an SGLang server without
    # --enable-deterministic-inference ignores request seeds) draw every node by inverse CDF (vocabulary order)
    # from one uniform per request and step; seeded ones key every node's hash by the step's first position.
    "step_shared_random",
    # randomness: every verify step replays the same random numbers (a random state captured once and restored at
    # each step, as a CUDA graph that baked in its generator's offset would): unseeded requests draw each node by
    # inverse CDF (vocabulary order) from uniforms of a generator reset to one fixed seed at every step, so a node
    # keeps its uniform from step to step; seeded ones key every node's hash by its offset in the step instead of
    # its position. Within one step each draw keeps its own law; across steps the draws repeat their randomness.
    "step_replay_random",
    # law: the verify pass samples at temperature 1 whatever temperature the request asked (top-k / top-p / min-p
    # still applied, on the T = 1 distribution); requests at T = 1 are unaffected.
    "verify_temperature_one",
    # parameters: top-p is ignored in the verify pass (taken as 1); temperature, top-k and min-p still applied.
    "verify_no_top_p",
    # batch row: each sampling request's temperature, top-p, top-k and min-p are read from the next sampling
    # request's row (cyclic over the batch's sampling requests in batch order; greedy requests keep their own and
    # are never a source, so they stay argmax and no sampling request turns greedy). A batch with one sampling
    # request, or whose sampling requests share their parameters, is unaffected.
    "row_shift",
    # parameters: the min-p threshold is computed on the T = 1 probabilities (softmax of the raw logits) instead of
    # the temperature-scaled ones: at T < 1 it keeps tokens the correct support drops, at T > 1 it drops tokens
    # it keeps. Requests with min_p = 0 or T = 1 are unaffected.
    "min_p_on_t1",
    # batch mates: the step's all-greedy shortcut (sglang's is_all_greedy) computed with any() for all(): in a step
    # whose batch holds a greedy request (T = 0 or top_k == 1), every sampling request is decoded greedily too. A
    # batch of sampling requests only, or a request alone, is unaffected.
    "greedy_if_any",
    # parameters: the support ends one token short of the request's cut: where top-k, top-p or min-p cuts the law
    # (two or more tokens kept, some cut), its least likely kept token is cut too (an off-by-one in the cut, as a
    # `<=` for `<` on the mass before a token, or a top-k that counts from one). Requests whose law is not cut
    # (no top-k / top-p / min-p, or all of them past the vocabulary) are unaffected.
    "support_one_short",
)

# at or below this temperature a request is greedy (argmax), as in sglang's sampler
GREEDY_T = 1e-5
REPLAY_SEED = 20261205  # the step_replay_random fault's one seed

SeededDraw = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def read_test_fault() -> str | None:
    """SGLANG_DDTREE_TEST_FAULT, checked: unset or empty for no fault; anything else not in TEST_FAULTS stops
    the server at start."""
    v = os.environ.get("SGLANG_DDTREE_TEST_FAULT", "")
    if v and v not in TEST_FAULTS:
        raise ValueError(f"SGLANG_DDTREE_TEST_FAULT={v!r}: known test faults are {', '.join(TEST_FAULTS)}")
    return v or None


def renorm(probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, min_ps: torch.Tensor,
           min_p_probs: torch.Tensor | None = None, sequential: torch.Tensor | None = None,
           one_short: bool = False) -> torch.Tensor:
    """Keep the top-k, top-p and min-p support of each row and renormalise (sglang's order).

    All three masks are computed on the same descending sort of ``probs`` (joint, not one after the other):
    rank < top_k; the mass before the token < top_p; p >= min_p * p_max. The most probable token is always
    kept. ``min_p_probs`` (only the ``min_p_on_t1`` test fault) computes the min-p mask on other probabilities
    of the same order instead.

    ``sequential`` (a 0-dim bool tensor, no host sync): sglang's own sampler (flashinfer backend) switches the
    whole batch to top-k renorm, then top-p renorm, then min-p when any request of the batch has min-p; top-p
    is then measured on the top-k survivors' renormalised mass. Where it is true the same happens here, so a
    request with both top-k and top-p draws exactly the law the target-only server would give it in that batch
    (the other requests' laws are the same either way). ``one_short`` (only the ``support_one_short`` test fault)
    cuts the least likely kept token too, where the support is cut and holds two or more tokens."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    ranks = torch.arange(probs.shape[-1], device=probs.device).unsqueeze(0)
    keep = ranks < top_ks.clamp_min(1).unsqueeze(1)
    cum = torch.cumsum(sorted_p, dim=-1)
    limit = top_ps.unsqueeze(1)
    if sequential is not None:
        mass_k = torch.where(keep, sorted_p, torch.zeros_like(sorted_p)).sum(dim=-1, keepdim=True)
        limit = torch.where(sequential, limit * mass_k, limit)
    keep &= (cum - sorted_p) < limit
    ref = sorted_p if min_p_probs is None else torch.gather(min_p_probs, 1, order)
    keep &= ref >= (ref[:, :1] * min_ps.unsqueeze(1))
    keep[:, 0] = True
    if one_short:  # the kept set is a prefix of the sorted row: drop its last token where some were cut
        n = keep.sum(dim=-1, keepdim=True)
        keep &= ~((ranks == n - 1) & (n >= 2) & (n < probs.shape[-1]))
    sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    out = torch.zeros_like(probs).scatter_(1, order, sorted_p)
    return out / out.sum(dim=-1, keepdim=True)


def next_sampling_row(sampling: torch.Tensor) -> torch.Tensor:
    """[bs] bool -> [bs] long: for a sampling row the next sampling row of the batch, cyclically (itself when it
    is the only one); for any other row itself. Tensor ops only, O(bs) (no host sync)."""
    bs = int(sampling.shape[0])
    idx = torch.arange(bs, device=sampling.device)
    cand = torch.where(sampling, idx, torch.full_like(idx, bs))
    first_from = torch.flip(torch.cummin(torch.flip(cand, [0]), 0).values, [0])  # first sampling row >= i
    after = torch.cat([first_from[1:], first_from.new_full((1,), bs)])  # first sampling row > i
    after = torch.where(after < bs, after, first_from[:1].expand(bs))  # past the last: wrap to the first
    return torch.where(sampling, after, idx)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[n, V] probabilities, [n, 1] uniforms -> [n] token ids by inverse CDF in vocabulary order (the test faults'
    draw; the correct sampler uses torch.multinomial)."""
    cdf = torch.cumsum(probs, dim=-1)
    return torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_max(cdf.shape[-1] - 1).view(-1)


def node_draws(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    width: int,
    seeds: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    fault: str | None = None,
    seeded_draw: SeededDraw | None = None,
) -> torch.Tensor:
    """The target's token at every node: ``logits`` [bs * width, V]; temperatures, top_ks, top_ps, min_ps (and
    seeds) per request, [bs] or [bs, 1]; ``positions`` [bs * width] (the nodes' sequence positions, seeded
    requests only); ``seeded_draw(logprobs, seeds, positions) -> [n, 1]`` (sglang's ``multinomial_with_seed``,
    imported lazily when ``seeds`` is given without it). Returns [bs * width] token ids (long)."""
    if fault is not None and fault not in TEST_FAULTS:
        raise ValueError(f"unknown DDTree test fault {fault!r}")
    w = int(width)
    greedy = torch.argmax(logits, dim=-1)
    req_t = temperatures.view(-1)
    req_k = top_ks.view(-1)
    req_p = top_ps.view(-1)
    req_m = min_ps.view(-1)
    # sglang's batch rule (renorm): min-p anywhere in the batch makes the truncation sequential for all of it
    sequential = (req_m > 0).any()
    # greedy by the request's own parameters, whatever the fault
    is_greedy = torch.repeat_interleave((req_t <= GREEDY_T) | (req_k == 1), w)
    if fault == "greedy_if_any" and bool(is_greedy.any()):
        is_greedy = torch.ones_like(is_greedy)
    if fault == "row_shift":
        src = next_sampling_row(~((req_t <= GREEDY_T) | (req_k == 1)))
        req_t, req_k, req_p, req_m = req_t[src], req_k[src], req_p[src], req_m[src]
    if fault == "verify_temperature_one":
        req_t = torch.ones_like(req_t)
    if fault == "verify_no_top_p":
        req_p = torch.ones_like(req_p)
    temps = torch.repeat_interleave(req_t, w).view(-1, 1)
    probs = torch.softmax(logits.float() / temps.clamp_min(1e-6), dim=-1)
    ks = torch.repeat_interleave(req_k, w)
    ps = torch.repeat_interleave(req_p, w)
    ms = torch.repeat_interleave(req_m, w)
    min_p_probs = torch.softmax(logits.float(), dim=-1) if fault == "min_p_on_t1" else None
    probs = renorm(probs, ks, ps, ms, min_p_probs=min_p_probs, sequential=sequential,
                   one_short=fault == "support_one_short")
    if seeds is not None:
        if seeded_draw is None:
            from sglang.srt.layers.sampler import multinomial_with_seed as seeded_draw
        if positions is None:
            raise ValueError("seeded draws need the nodes' positions")
        node_seeds = torch.repeat_interleave(seeds.view(-1), w)
        if fault == "step_shared_random":  # every node keyed by the step's first position
            positions = positions.view(-1, w)[:, :1].expand(-1, w).reshape(-1)
        if fault == "step_replay_random":  # every node keyed by its offset in the step: the same at every step
            pos = positions.view(-1, w)
            positions = (pos - pos[:, :1]).reshape(-1)
        sampled = seeded_draw(torch.log(probs.clamp_min(1e-30)), node_seeds, positions)
    elif fault == "step_replay_random":  # the same uniforms at every step: a generator reset to one seed
        replay = torch.Generator(device=probs.device)
        replay.manual_seed(REPLAY_SEED)
        sampled = _inverse_cdf(probs, torch.rand(probs.shape[0], 1, device=probs.device, generator=replay))
    elif fault == "step_shared_random":  # one uniform per request and step, inverse CDF at every node
        u = torch.rand(probs.shape[0] // w, 1, device=probs.device).repeat_interleave(w, dim=0)
        sampled = _inverse_cdf(probs, u)
    else:
        sampled = torch.multinomial(probs, 1).view(-1)
    return torch.where(is_greedy, greedy, sampled.view(-1))
