"""The T>0 verdict from the target's own likelihood: candidate answers against target-only answers.

A speculative decoder is correct exactly when, at every temperature, it samples from the target model's
own distribution. At T>0 no single answer proves that, but the target can score every answer: each token's
log-probability under the target (the target-only SGLang server's `/generate` with input log-probs, or,
for the embedded llama.cpp target, the in-process numpy forward pass of the same model,
validation/refmodel.py). Per temperature T:

1. **Support.** p_T = softmax(logits / T). A correct sampler at T with top_p <= 1 (top_p, top-k and min-p
   only remove candidates, and keep at least top_p of the mass) gives any one token at most p_T(tok) / top_p.
   At one position the tokens with p_T < eps hold less than V * eps of the mass (V the vocabulary size: all
   of them may lie below eps at once), so over N candidate tokens a correct sampler emits one with
   probability below N * V * eps / top_p. Every candidate token with log p_T < log(eps) fails the
   temperature; eps is the configured limit, lowered at gate time until that bound is within the support's
   share of alpha. Token-level corruption (a foreign KV slot, a wrong row) emits exactly such tokens. A token
   whose text holds U+FFFD is not checked: the text lost the engine's bytes there (it still counts in 2.).
2. **Distribution.** Per answer, the mean NLL at T (-mean log p_T) and the worst `window`-token window of
   it. A stratified (by prompt) two-sample permutation test compares the candidate's answers with the
   baseline's: the statistic is the sum over prompts of (candidate mean - baseline mean) / the prompt's
   pooled spread, labels are permuted within each prompt, p = (1 + #{|S*| >= |S|}) / (1 + permutations),
   a fixed RNG seed. Two-sided: a corruption that loops lowers the NLL (the model predicts its own
   repetition), garbage raises it. A third statistic is tested the same way: the lag-1 autocorrelation of
   each token's mid-PIT under p_T in vocabulary order, where an inverse-CDF sampler had its uniform
   (`pit_lag1`): a sampler can keep every token's law exact and still draw successive tokens from one
   shared random number, which no NLL mean sees.
3. **Alpha.** `alpha` is the false-fail rate of the whole T>0 verdict: alpha / (number of T>0 temperatures)
   per temperature (Bonferroni), `support_share` of that to the support check, the rest split evenly over
   the statistics (a statistic the scorer cannot give keeps its share unspent).
4. **Power.** From the baseline's own scored answers and corrupted variants of them (validation/synth.py,
   scored by the same scorer), Monte Carlo draws of a candidate whose answers are corrupted with rate r give
   the rejection probability at this sample count; the verdict reports the smallest r rejected with
   probability >= power_target.

    scorer = make_scorer("reference", gate_cfg, model=name, candidate_url=url)   # or the baseline's URL
    a = scorer.score(messages, answer_text, temperature, stop=True)            # AnswerScore
    verdict = likelihood_test(candidate_scores, baseline_scores, gate_cfg, n_temperatures=3, variants=v)
"""

from __future__ import annotations

import math
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from sglfleet.pipeline.errors import UsageError
from sglfleet.validation import tokenlaw
from sglfleet.validation.tokenlaw import SamplingParams

PROBE_TEXT = ("The quick brown fox jumps over the lazy dog. Numbers 12345 and symbols: #@!; "
              "déjà vu, naïve café, 東京, emoji 🙂\n\n```python\ndef f(x):\n    return x * 2\n```")
PROBE_MESSAGES = [{"role": "user", "content": "Say hello."}]


# ---------------------------------------------------------------------------- scores


@dataclass(frozen=True)
class AnswerScore:
    """One answer scored under the target model, token by token (natural log)."""

    prompt_id: str
    temperature: float
    seed: int | None
    token_logprobs: tuple[float, ...]            # log p(token | prompt, previous) at T=1
    support_logprobs: tuple[float, ...] | None   # log p_T(token) under softmax(logits / T)
    pieces: tuple[str, ...] = ()
    window: int = 16
    error: str | None = None                     # why this answer could not be scored
    exact_support: bool = True                   # False: p_T's normaliser from top-k only (over-estimated)
    vocab: int = 262_144                         # the model's vocabulary size (the support bound's V); DEFAULT_VOCAB
    # each token's mid-PIT under p_T: the mass of the lower token ids plus half its own (pit_of_row); None when
    # the scorer does not give it
    pit: tuple[float, ...] | None = None
    # the per-token test (validation/tokenlaw.py): each token's randomized PIT in descending-probability order
    # under the request's own law (None: outside its support); None when the answer was scored without its
    # sampling parameters
    tok_pit: tuple[float | None, ...] | None = None
    # per token, its PIT had it been drawn from each wrong law of tokenlaw.FAMILIES (NaN: outside): the power
    wrong: tuple[tuple[float, ...], ...] | None = None
    approx_tokens: int = 0  # tokens whose law reached into a server row's unlisted tail (placed approximately)
    tok_excess: tuple[float, ...] = ()  # each outside token's distance past the law's cut (tokenlaw.outside_excess)

    @property
    def n_tokens(self) -> int:
        return len(self.token_logprobs)

    @property
    def label(self) -> str:
        return f"{self.prompt_id}@T{self.temperature:g}" + (f"/seed{self.seed}" if self.seed is not None else "")

    def _nll_t(self) -> np.ndarray:
        lp = self.support_logprobs if self.support_logprobs is not None else self.token_logprobs
        return -np.asarray(lp, dtype=np.float64)

    @property
    def mean_nll(self) -> float | None:
        """Mean NLL at T (nats per token); None when nothing was scored."""
        v = self._nll_t()
        return float(v.mean()) if v.size else None

    def worst_window(self) -> tuple[float | None, int]:
        """(the highest mean NLL at T over `window` consecutive tokens, its start); the mean when shorter."""
        v = self._nll_t()
        if not v.size:
            return None, 0
        if v.size <= self.window:
            return float(v.mean()), 0
        c = np.concatenate([[0.0], np.cumsum(v)])
        w = (c[self.window:] - c[:-self.window]) / self.window
        at = int(np.argmax(w))
        return float(w[at]), at

    @property
    def worst_window_nll(self) -> float | None:
        return self.worst_window()[0]

    def text_at(self, start: int, n: int) -> str:
        return "".join(self.pieces[max(0, start):start + n])

    @property
    def pit_lag1(self) -> float | None:
        """Lag-1 autocorrelation of the answer's mid-PITs around their own mean (0.0 when fewer than 3 tokens or
        no spread); None without PITs. Draws that are independent, whatever their law, keep it near 0 in
        expectation; draws that reuse or share random numbers across positions move it."""
        if self.pit is None:
            return None
        u = np.asarray(self.pit, dtype=np.float64)
        if u.size < 3:
            return 0.0
        d = u - u.mean()
        den = float(np.dot(d, d))
        return float(np.dot(d[1:], d[:-1]) / den) if den > 1e-12 else 0.0


DEFAULT_VOCAB = 262_144  # the support bound's V when no answer says its vocabulary


class Scorer(Protocol):
    name: str
    method: str
    order: tuple[str, ...]  # the engine's truncation order the per-token test applies (tokenlaw.ORDERS)
    eos_id: int | None

    def score(self, messages: list[dict[str, str]], answer: str, temperature: float, *, prompt_id: str = "",
              seed: int | None = None, stop: bool = False) -> AnswerScore: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ScoreRequest:
    """One answer to score: Scorer.score's arguments."""

    messages: list[dict[str, str]]
    answer: str
    temperature: float
    prompt_id: str = ""
    seed: int | None = None
    stop: bool = False
    # the token ids the server sampled (SGLang says them): a scorer that reads ids (`scores_ids`) scores these
    # instead of the text re-tokenized, which need not be the sequence the sampler drew
    ids: tuple[int, ...] | None = None
    # the request's sampling parameters: the per-token test places each token in exactly this law
    params: SamplingParams | None = None


def _scorer_kw(scorer: Any, r: ScoreRequest) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if r.ids is not None and getattr(scorer, "scores_ids", False):
        kw["ids"] = r.ids
    if r.params is not None:
        kw["params"] = r.params
    return kw


def per_token(label: str, temperature: float, rows: list[tokenlaw.Row], seq: list[int], params: SamplingParams,
              order: tuple[str, ...]) -> dict[str, Any]:
    """AnswerScore's per-token fields: each token's PIT under the request's law, the wrong laws' PITs, how far
    outside the law each outside token lies, the tokens placed approximately."""
    if params.temperature != temperature:
        raise ValueError(f"sampling parameters at T={params.temperature} for an answer at T={temperature}")
    rng = np.random.default_rng(int.from_bytes(label.encode()[:8].ljust(8, b"\0"), "little") & 0xFFFFFFFF)
    pits: list[float | None] = []
    wrong: list[tuple[float, ...]] = []
    excess: list[float] = []
    approx = 0
    for k, (row, tok) in enumerate(zip(rows, seq, strict=True)):
        law = tokenlaw.law_of(row, params, order)
        hit = np.flatnonzero(row.ids == tok)
        rank = int(hit[0]) if hit.size else None
        pits.append(tokenlaw.pit(law, rank, tokenlaw.uniform_of(f"{label}/{k}")))
        if pits[-1] is None:
            excess.append(tokenlaw.outside_excess(row, law, rank, temperature))
        wrong.append(tokenlaw.wrong_draws(row, law, params, order, rng))
        approx += law.approximate
    return {"tok_pit": tuple(pits), "wrong": tuple(wrong), "tok_excess": tuple(excess), "approx_tokens": approx}


def drawn_count(ids: tuple[int, ...] | None, seq: list[int]) -> int:
    """How many leading tokens of a scored sequence the server said it drew: its sampled ids (an end-of-turn token
    the scorer appended after an answer that stopped is not one: the server may have ended on another), none
    when the answer was scored on its text re-tokenized (a segmentation the sampler need not have drawn). The
    per-token test places only drawn tokens in the law; whether an answer has its ids depends on its content
    alone, alike on both sides."""
    return min(len(ids), len(seq)) if ids is not None else 0


def score_all(scorer: Scorer, reqs: list[ScoreRequest], on_score: Any = None) -> list[AnswerScore]:
    """Every request's score, in order: through the scorer's own batched `score_many` where it has one (the
    SGLang scorer: a few HTTP requests for the lot instead of four per answer), else one `score` each.
    on_score(score), if given, is called for every answer once scored (progress)."""
    many = getattr(scorer, "score_many", None)
    if many is not None:
        out = many(reqs)
        for sc in out if on_score is not None else ():
            on_score(sc)
        return out
    out = []
    for r in reqs:
        kw = _scorer_kw(scorer, r)
        out.append(scorer.score(r.messages, r.answer, r.temperature, prompt_id=r.prompt_id, seed=r.seed,
                                stop=r.stop, **kw))
        if on_score is not None:
            on_score(out[-1])
    return out


def _support_from_logits(logits: np.ndarray, ids: list[int], temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """(log p_1, log p_T) of ids[k] under row k of logits, exact (full vocabulary)."""
    lp1, lpt, _ = _scores_from_logits(logits, ids, temperature)
    return lp1, lpt


def _scores_from_logits(logits: np.ndarray, ids: list[int], temperature: float
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log p_1, log p_T, mid-PIT under p_T) of ids[k] under row k of logits, exact (full vocabulary). The
    exponentials are taken in float32 after the row maximum is subtracted and summed in float64 (within 1e-6
    nats of a float64 log-softmax, 5x faster). The mid-PIT as `pit_of_row` defines it."""
    n = len(ids)
    lp1, lpt, pit = np.empty(n), np.empty(n), np.empty(n)
    tg = np.asarray(ids, dtype=np.int64)
    for a in range(0, n, 128):
        b = min(n, a + 128)
        x = np.asarray(logits[a:b], dtype=np.float32)
        rows = np.arange(b - a)
        for out, scale in ((lp1, 1.0), (lpt, 1.0 / temperature)):
            y = x * np.float32(scale)
            m = y.max(axis=1)
            e = np.exp(y - m[:, None])
            z = e.sum(axis=1, dtype=np.float64)
            own = y[rows, tg[a:b]]
            out[a:b] = own.astype(np.float64) - (m.astype(np.float64) + np.log(z))
            if scale != 1.0 or temperature == 1.0:
                below = np.where(np.arange(y.shape[1]) < tg[a:b, None], e, np.float32(0)).sum(axis=1,
                                                                                               dtype=np.float64)
                pit[a:b] = (below + 0.5 * e[rows, tg[a:b]].astype(np.float64)) / z
    return lp1, lpt, pit


def pit_of_row(logp: dict[int, float], own_id: int) -> float:
    """The mid-PIT of token own_id under a distribution given as {token id: log-probability} (normalised over
    the ids given): the mass of the tokens with a lower id plus half its own, i.e. where an inverse-CDF
    sampler walking the vocabulary in id order (torch.multinomial, FlashInfer's sampling kernels, the test
    bed's `sample`) had its uniform. A token drawn from the distribution has a mid-PIT of mean exactly 1/2
    whatever the distribution, and independent draws give uncorrelated mid-PITs; draws that reuse one
    uniform give nearly equal ones."""
    ids = np.fromiter(logp.keys(), dtype=np.int64, count=len(logp))
    v = np.fromiter(logp.values(), dtype=np.float64, count=len(logp))
    p = np.exp(v - v.max())
    p /= p.sum()
    return float(p[ids < own_id].sum() + 0.5 * p[ids == own_id].sum())


def pit_from_topk(own: float, top: list[tuple[float, int]], own_id: int, temperature: float) -> float:
    """The mid-PIT of a token under p_T rebuilt, as in `support_from_topk`, from its T=1 log-prob and the
    top-k alternatives' (log p_1, id): normalised over the alternatives seen and the token. Not the exact
    PIT under the full p_T (the tail's mass and ids are missing), but the same function of the target's
    answer for the candidate and the baseline, which is all a two-sample test needs."""
    vals = {i: v / temperature for v, i in top}
    vals[own_id] = own / temperature
    return pit_of_row(vals, own_id)


def support_from_topk(own: float, top: list[tuple[float, int]], own_id: int, temperature: float) -> float:
    """log p_T of a token from its T=1 log-prob and the top-k alternatives' (log p_1, id).

    log p_T(tok) = log p_1(tok) / T - log sum_j p_1(j)^(1/T). The sum runs over the alternatives seen (and the
    token itself): it is at most the true normaliser, so the result is at least the true log p_T (a
    conservative support check: it can only miss an impossible token, never invent one)."""
    vals = {i: v for v, i in top}
    vals[own_id] = own
    a = np.asarray(list(vals.values()), dtype=np.float64) / temperature
    m = a.max()
    return float(own / temperature - (m + math.log(np.exp(a - m).sum())))


# ---------------------------------------------------------------------------- the reference scorer


def render_chat(template: str, messages: list[dict[str, str]], bos: str = "", eos: str = "",
                add_generation_prompt: bool = True) -> str:
    """The model's own chat template (GGUF tokenizer.chat_template, Jinja), by default with the generation prompt."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=False, lstrip_blocks=False)

    def raise_exception(msg: str) -> None:
        raise UsageError(f"chat template: {msg}")

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token=bos, eos_token=eos)


class ReferenceScorer:
    """The in-process numpy forward pass of the embedded target's own model (the judge's reference model),
    with the model's own chat template (from its GGUF file, as llama.cpp applies it). Full logits: p_T exact."""

    name = "reference"
    scores_ids = True  # an answer's sampled ids (llama.cpp names them in its log-prob entries) instead of its text

    def __init__(self, judge_cfg: Any, window: int) -> None:
        from sglfleet.validation.judge import FluencyJudge, judge_model_path

        self.model_path = judge_model_path(judge_cfg.model_path)
        self.window = window
        self._judge = FluencyJudge(judge_cfg.model_copy(update={"engine": "numpy"})).start()
        from gguf import GGUFReader

        fields = GGUFReader(self.model_path).fields

        def field_(key: str) -> Any:
            f = fields.get(key)
            return f.contents() if f is not None else None

        self.template = field_("tokenizer.chat_template")
        self.model_name = " ".join(str(field_(k) or "") for k in ("general.basename", "general.size_label")).strip()
        tokens = field_("tokenizer.ggml.tokens") or []
        eos = field_("tokenizer.ggml.eos_token_id")
        bos = field_("tokenizer.ggml.bos_token_id")
        self.eos_id = int(eos) if eos is not None else None
        self.vocab = len(tokens)
        self._bos = tokens[int(bos)] if bos is not None and int(bos) < len(tokens) else ""
        self._eos = tokens[self.eos_id] if self.eos_id is not None and self.eos_id < len(tokens) else ""
        if not self.template:
            raise UsageError(f"{self.model_path} has no chat template: the reference scorer cannot build the prompt")
        self.method = ("reference model in process (numpy forward pass of the GGUF weights in float32), the "
                       "model's own chat template; log p_T exact over the full vocabulary")

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return [i for i, _ in self._judge.tokenize(render_chat(self.template, messages, self._bos, self._eos))]

    def tokenize(self, text: str) -> list[int]:
        return [i for i, _ in self._judge.tokenize(text)]

    order: tuple[str, ...] = tokenlaw.ORDERS["llamacpp"]  # the engine's truncation order (the gate sets it)

    def score(self, messages: list[dict[str, str]], answer: str, temperature: float, *, prompt_id: str = "",
              seed: int | None = None, stop: bool = False, ids: tuple[int, ...] | None = None,
              params: SamplingParams | None = None) -> AnswerScore:
        """ids: the token ids the server sampled, scored instead of `answer` re-tokenized; params: the request's
        sampling parameters (each token's PIT under its law, validation/tokenlaw.py)."""
        if temperature <= 0:
            raise ValueError("the likelihood test scores T>0 answers")
        if ids is not None:
            bad = [i for i in ids if not 0 <= i < self.vocab]
            if bad:  # a server naming ids the model does not have is not scored as if it had drawn them
                return AnswerScore(prompt_id, temperature, seed, (), None, (), self.window, exact_support=False,
                                   error=f"sampled id {bad[0]} outside the vocabulary of {self.vocab}")
            seq, pieces = list(ids), self._judge.pieces(list(ids))
        else:
            toks = self._judge.tokenize(answer)
            seq, pieces = [i for i, _ in toks], [p for _, p in toks]
        if stop and self.eos_id is not None and (not seq or seq[-1] != self.eos_id):
            seq.append(self.eos_id)
            pieces.append(self._eos)
        if not seq:
            return AnswerScore(prompt_id, temperature, seed, (), (), (), self.window, error="empty answer")
        logits = self._judge.logits(self.prompt_ids(messages), seq)
        lp1, lpt, pit = _scores_from_logits(logits, seq, temperature)
        tok: dict[str, Any] = {}
        if params is not None:
            drawn = drawn_count(ids, seq)
            rows = [tokenlaw.row_from_logits(logits[k], temperature) for k in range(drawn)]
            label = f"{prompt_id}@T{temperature:g}/seed{seed}"
            tok = per_token(label, temperature, rows, seq[:drawn], params, self.order)
        return AnswerScore(prompt_id, temperature, seed, tuple(lp1.tolist()), tuple(lpt.tolist()), tuple(pieces),
                           self.window, vocab=int(logits.shape[1]), pit=tuple(pit.tolist()), **tok)

    def close(self) -> None:
        self._judge.stop()


# ---------------------------------------------------------------------------- the SGLang scorer


class SGLangScorer:
    """The target-only SGLang server scores each answer: the prompt as sglang renders it (`/tokenize` with
    the messages: the server's own chat template), the answer's ids (`/tokenize`), then `/generate` over
    prompt + answer with `max_new_tokens: 0`, `return_logprob`, `logprob_start_len` = prompt length - 1
    and `top_logprobs_num`. SGLang's input log-probs are log_softmax of the raw logits (T=1; temperature
    only scales the sampled positions' logprobs: sglang/srt/layers/logprob_processor.py), so log p_T is
    rebuilt from them: exact log p_1, and log p_T with the normaliser summed over the top-k alternatives
    only, which over-estimates p_T (conservative)."""

    name = "sglang"
    scores_ids = True  # an answer's sampled ids, where the gate has them, are scored instead of its text
    order: tuple[str, ...] = tokenlaw.ORDERS["sglang"]

    def __init__(self, url: str, top_k: int, window: int, timeout_s: float, model: str | None = None,
                 api_key: str | None = None) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.top_k = top_k
        self.window = window
        self.model = model
        self._http = httpx.Client(timeout=timeout_s, headers=_auth(api_key))
        self.eos_id: int | None = None
        self.method = (f"target-only SGLang server {self.url}: /generate input log-probs (T=1, exact); log p_T "
                       f"normalised over the top-{top_k} alternatives only, so p_T is over-estimated "
                       "(conservative: the support check can miss an impossible token, never invent one)")

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        import httpx

        try:
            r = self._http.post(self.url + path, json=body)
        except httpx.HTTPError as exc:
            raise ValueError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            raise ValueError(f"{self.url}{path} answered HTTP {r.status_code}: {r.text[:160]}")
        try:
            return r.json()
        except ValueError:
            raise ValueError(f"{self.url}{path} answered non-JSON") from None

    def tokenize(self, text: str) -> list[int]:
        got = self._post("/tokenize", {"prompt": text, "add_special_tokens": False,
                                       **({"model": self.model} if self.model else {})})
        return [int(i) for i in got["tokens"]]

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        got = self._post("/tokenize", {"messages": messages, **({"model": self.model} if self.model else {})})
        return [int(i) for i in got["tokens"]]

    def learn_eos(self) -> None:
        """The end-of-turn token the chat template writes after an assistant message (None: not scored)."""
        try:
            p = self.prompt_ids(PROBE_MESSAGES)
            full = self._post("/tokenize", {"messages": [*PROBE_MESSAGES, {"role": "assistant", "content": "Hi"}],
                                            "add_generation_prompt": False,
                                            **({"model": self.model} if self.model else {})})["tokens"]
            hi = self.tokenize("Hi")
            if full[:len(p)] == p and full[len(p):len(p) + len(hi)] == hi and len(full) > len(p) + len(hi):
                self.eos_id = int(full[len(p) + len(hi)])
        except (ValueError, KeyError, TypeError):
            self.eos_id = None

    def logprobs(self, prompt: list[int], ids: list[int]) -> tuple[list[float], list[list[tuple[float, int]]]]:
        """(log p_1 of each id, its top-k alternatives) after prompt, from one /generate call."""
        body = {"input_ids": prompt + ids, "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                "return_logprob": True, "logprob_start_len": len(prompt) - 1, "top_logprobs_num": self.top_k,
                "return_text_in_logprobs": False}
        got = self._post("/generate", body)
        if isinstance(got, list):
            got = got[0]
        return self._rows(got, ids)

    @staticmethod
    def _rows(got: Any, ids: list[int]) -> tuple[list[float], list[list[tuple[float, int]]]]:
        """One /generate answer's input log-probs for `ids` (the rows after the prompt's last token)."""
        if not isinstance(got, dict):
            raise ValueError(f"/generate returned {type(got).__name__}, not an object")
        meta = got.get("meta_info") or {}
        rows, tops = meta.get("input_token_logprobs"), meta.get("input_top_logprobs")
        if not isinstance(rows, list) or len(rows) != len(ids) + 1:
            raise ValueError(f"/generate returned {len(rows) if isinstance(rows, list) else 'no'} input log-probs "
                             f"for {len(ids) + 1} positions")
        rows, tops = rows[1:], (tops or [None] * (len(ids) + 1))[1:]
        lp, alts = [], []
        for k, (row, top) in enumerate(zip(rows, tops, strict=True)):
            if row is None or row[0] is None or int(row[1]) != ids[k]:
                raise ValueError(f"/generate input log-prob {k} is {row!r}, not token {ids[k]}")
            lp.append(float(row[0]))
            alts.append([(float(t[0]), int(t[1])) for t in (top or []) if t and t[0] is not None])
        return lp, alts

    def _with_end(self, ids: list[int], stop: bool) -> list[int]:
        """The answer's ids with the end-of-turn token when it stopped (not twice: sampled ids may hold it)."""
        if stop and self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
            ids.append(self.eos_id)
        return ids

    def score(self, messages: list[dict[str, str]], answer: str, temperature: float, *, prompt_id: str = "",
              seed: int | None = None, stop: bool = False, ids: tuple[int, ...] | None = None,
              params: SamplingParams | None = None) -> AnswerScore:
        """ids: the token ids the server sampled, scored instead of `answer` re-tokenized; params: the request's
        sampling parameters (the per-token test)."""
        if temperature <= 0:
            raise ValueError("the likelihood test scores T>0 answers")
        try:
            toks = self._with_end(list(ids) if ids is not None else self.tokenize(answer), stop)
            if not toks:
                return AnswerScore(prompt_id, temperature, seed, (), (), (), self.window, error="empty answer",
                                   exact_support=False)
            lp, alts = self.logprobs(self.prompt_ids(messages), toks)
        except (ValueError, KeyError, TypeError) as exc:
            return AnswerScore(prompt_id, temperature, seed, (), None, (), self.window, error=str(exc),
                               exact_support=False)
        lpt = [x if temperature == 1.0 else support_from_topk(x, a, i, temperature)
               for x, a, i in zip(lp, alts, toks, strict=True)]
        pit = tuple(pit_from_topk(x, a, i, temperature) for x, a, i in zip(lp, alts, toks, strict=True))
        pieces = self._pieces(toks)
        return AnswerScore(prompt_id, temperature, seed, tuple(lp), tuple(lpt), pieces, self.window,
                           exact_support=temperature == 1.0, pit=pit,
                           **self._per_token(prompt_id, temperature, seed, lp, alts, toks, params, ids))

    def _per_token(self, prompt_id: str, temperature: float, seed: int | None, lp: list[float],
                   alts: list[list[tuple[float, int]]], toks: list[int], params: SamplingParams | None,
                   ids: tuple[int, ...] | None = None) -> dict[str, Any]:
        """The per-token test's fields from the server's top-k rows (tokenlaw.row_from_topk), over the tokens the
        server said it drew (`drawn_count`)."""
        if params is None:
            return {}
        n = drawn_count(ids, toks)
        rows = [tokenlaw.row_from_topk(x, i, a, temperature)
                for x, a, i in zip(lp[:n], alts[:n], toks[:n], strict=True)]
        return per_token(f"{prompt_id}@T{temperature:g}/seed{seed}", temperature, rows, toks[:n], params, self.order)

    def score_many(self, reqs: list[ScoreRequest], batch: int = 64) -> list[AnswerScore]:
        """`score` for many answers in a few requests: the answers tokenized in one `/tokenize` (a list of
        prompts), each distinct prompt rendered once, the log-probs of `batch` answers per `/generate` (a
        batch of input_ids, one `logprob_start_len` each), every token's piece in one `/detokenize`. The
        same numbers as `score`, answer by answer: a batch the server refuses is scored one by one, so one
        bad answer gets its own error, as it would there."""
        if any(r.temperature <= 0 for r in reqs):
            raise ValueError("the likelihood test scores T>0 answers")
        out: list[AnswerScore | None] = [None] * len(reqs)
        for a in range(0, len(reqs), batch):
            chunk = list(range(a, min(len(reqs), a + batch)))
            try:
                got = self._score_batch([reqs[i] for i in chunk])
            except (ValueError, KeyError, TypeError):
                got = [self.score(reqs[i].messages, reqs[i].answer, reqs[i].temperature, prompt_id=reqs[i].prompt_id,
                                  seed=reqs[i].seed, stop=reqs[i].stop, ids=reqs[i].ids, params=reqs[i].params)
                       for i in chunk]
            for i, sc in zip(chunk, got, strict=True):
                out[i] = sc
        return [sc for sc in out if sc is not None]

    def _score_batch(self, reqs: list[ScoreRequest]) -> list[AnswerScore]:
        texts = [k for k, r in enumerate(reqs) if r.ids is None]  # the others are scored on their sampled ids
        toks: list[Any] = [list(r.ids) if r.ids is not None else None for r in reqs]
        if texts:
            got = self._post("/tokenize", {"prompt": [reqs[k].answer for k in texts], "add_special_tokens": False,
                                           **({"model": self.model} if self.model else {})})["tokens"]
            if not isinstance(got, list) or len(got) != len(texts):
                raise ValueError("/tokenize did not answer one token list per prompt")
            for k, t in zip(texts, got, strict=True):
                toks[k] = t
        prompts: dict[str, list[int]] = {}
        rows: list[tuple[list[int], list[int]]] = []
        for r, t in zip(reqs, toks, strict=True):
            # as score(): an empty answer that stopped scores its end
            ids = self._with_end([int(i) for i in t], r.stop)
            key = repr(r.messages)
            if ids and key not in prompts:
                prompts[key] = self.prompt_ids(r.messages)
            rows.append((prompts.get(key, []), ids))
        live = [k for k, (_, ids) in enumerate(rows) if ids]
        scored: dict[int, tuple[list[float], list[list[tuple[float, int]]]]] = {}
        if live:
            body = {"input_ids": [rows[k][0] + rows[k][1] for k in live],
                    "sampling_params": {"max_new_tokens": 0, "temperature": 0}, "return_logprob": True,
                    "logprob_start_len": [len(rows[k][0]) - 1 for k in live], "top_logprobs_num": self.top_k,
                    "return_text_in_logprobs": False}
            got = self._post("/generate", body)
            if not isinstance(got, list) or len(got) != len(live):
                raise ValueError("/generate did not answer one result per input")
            for k, g in zip(live, got, strict=True):
                scored[k] = self._rows(g, rows[k][1])
        flat = [i for k in live for i in rows[k][1]]
        pieces = self._pieces(flat) if flat else ()
        out, at = [], 0
        for k, r in enumerate(reqs):
            ids = rows[k][1]
            if not ids:
                out.append(AnswerScore(r.prompt_id, r.temperature, r.seed, (), (), (), self.window,
                                       error="empty answer", exact_support=False))
                continue
            lp, alts = scored[k]
            lpt = [x if r.temperature == 1.0 else support_from_topk(x, al, i, r.temperature)
                   for x, al, i in zip(lp, alts, ids, strict=True)]
            pit = tuple(pit_from_topk(x, al, i, r.temperature) for x, al, i in zip(lp, alts, ids, strict=True))
            out.append(AnswerScore(r.prompt_id, r.temperature, r.seed, tuple(lp), tuple(lpt),
                                   tuple(pieces[at:at + len(ids)]), self.window, exact_support=r.temperature == 1.0,
                                   pit=pit, **self._per_token(r.prompt_id, r.temperature, r.seed, lp, alts, ids,
                                                              r.params, r.ids)))
            at += len(ids)
        return out

    def _pieces(self, ids: list[int]) -> tuple[str, ...]:
        try:
            got = self._post("/detokenize", {"tokens": [[i] for i in ids], "skip_special_tokens": False,
                                             **({"model": self.model} if self.model else {})})
            text = got.get("text")
            if isinstance(text, list) and len(text) == len(ids):
                return tuple(str(t) for t in text)
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        return tuple(f"<{i}>" for i in ids)

    def close(self) -> None:
        self._http.close()


# ---------------------------------------------------------------------------- make_scorer and its probes


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _auth(api_key: str | None) -> dict[str, str]:
    """The bearer header of a server started with an API key (the key never reaches a message or report)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _served_models(url: str, timeout_s: float, api_key: str | None = None) -> list[str]:
    import httpx

    try:
        r = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout_s, headers=_auth(api_key))
        return [str(m["id"]) for m in r.json()["data"]] if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return []


def server_tokenize(url: str, text: str, timeout_s: float = 30.0, api_key: str | None = None) -> list[int] | None:
    """A server's own token ids of text (llama.cpp `/tokenize {content}`, SGLang `/tokenize {prompt}`), or None."""
    import httpx

    for body in ({"prompt": text, "add_special_tokens": False}, {"content": text, "add_special": False}):
        try:
            r = httpx.post(url.rstrip("/") + "/tokenize", json=body, timeout=timeout_s, headers=_auth(api_key))
            if r.status_code == 200:
                toks = r.json().get("tokens")
                if isinstance(toks, list) and toks:
                    return [int(t["id"]) if isinstance(t, dict) else int(t) for t in toks]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            continue
    return None


def make_scorer(kind_or_url: str | None, cfg: Any, *, model: str | None = None,
                candidate_url: str | None = None, api_key: str | None = None) -> Scorer:
    """The scorer of the target model, probed once; UsageError before any gate request when it cannot score.

    kind_or_url: "reference" (the in-process numpy model: the embedded llama.cpp target), or the URL of the
    target-only SGLang server; None: cfg.likelihood.scorer, else cfg.baseline_url, else reference.
    `model`: the candidate's served model name; `candidate_url`: the candidate, whose tokenizer must be the
    scorer's (the same probe text must give the same token ids)."""
    lc = cfg.likelihood
    kind = kind_or_url or lc.scorer or cfg.baseline_url or "reference"
    scorer: Any
    if kind == "reference":
        scorer = ReferenceScorer(cfg.judge, lc.window)
        _check_reference_model(scorer, model, candidate_url, lc.request_timeout_s, api_key)
    elif kind.startswith(("http://", "https://")):
        scorer = SGLangScorer(kind, lc.top_logprobs, lc.window, lc.request_timeout_s, model=None, api_key=api_key)
        served = _served_models(kind, lc.request_timeout_s, api_key)
        if not served:
            scorer.close()
            raise UsageError(f"likelihood scorer {kind} lists no model on /v1/models: not a serving target-only server")
        if model is not None and model not in served:
            scorer.close()
            raise UsageError(f"likelihood scorer {kind} serves {served}, not the candidate's model {model!r}: "
                             "it would score the answers under another model")
        scorer.model = model or served[0]
        try:
            ids = scorer.tokenize(PROBE_TEXT)
        except (ValueError, KeyError, TypeError) as exc:
            scorer.close()
            raise UsageError(f"likelihood scorer {kind} cannot tokenize ({exc}): not an SGLang server") from None
        try:
            lp, _ = scorer.logprobs(scorer.prompt_ids(PROBE_MESSAGES), ids)
        except (ValueError, KeyError, TypeError) as exc:
            scorer.close()
            raise UsageError(f"likelihood scorer {kind} cannot return input log-probs ({exc}): it needs /generate "
                             "with return_logprob and logprob_start_len (a target-only SGLang server)") from None
        if not all(math.isfinite(x) and x <= 1e-6 for x in lp):
            scorer.close()
            raise UsageError(f"likelihood scorer {kind} returned log-probs that are not log-probabilities")
        scorer.learn_eos()
    else:
        raise UsageError(f"likelihood scorer must be 'reference' or an http(s) URL, not {kind!r}")
    if candidate_url:
        theirs = server_tokenize(candidate_url, PROBE_TEXT, lc.request_timeout_s, api_key)
        mine = scorer.tokenize(PROBE_TEXT)
        if theirs is not None and theirs != mine:
            scorer.close()
            raise UsageError(f"the candidate {candidate_url} tokenizes the probe text into {len(theirs)} tokens, the "
                             f"likelihood scorer ({scorer.name}) into {len(mine)}"
                             + ("" if len(theirs) != len(mine) else " with other ids")
                             + ": another tokenizer, so its answers cannot be scored token by token")
    return scorer


def _check_reference_model(scorer: ReferenceScorer, model: str | None, candidate_url: str | None,
                           timeout_s: float, api_key: str | None = None) -> None:
    """The candidate must serve the reference model itself: its llama.cpp /props model file, else its name."""
    import httpx

    if candidate_url:
        try:
            r = httpx.get(candidate_url.rstrip("/") + "/props", timeout=timeout_s, headers=_auth(api_key))
            path = r.json().get("model_path") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            path = None
        if isinstance(path, str) and path:
            from pathlib import Path

            a, b = Path(path), Path(scorer.model_path)
            # a file here is compared by size too; a remote candidate's path (not on this machine) by name only
            same = a.name == b.name and (not a.is_file() or a.resolve() == b.resolve()
                                         or a.stat().st_size == b.stat().st_size)
            if not same:
                scorer.close()
                raise UsageError(f"the candidate serves {path}, the reference scorer's model is {scorer.model_path}: "
                                 "it would score the answers under another model (set likelihood.scorer to the "
                                 "target-only server's URL)")
            return
    if model is not None:
        want = [_norm(w) for w in scorer.model_name.split()]
        if not want or not all(w in _norm(model) for w in want):
            scorer.close()
            raise UsageError(f"the candidate serves {model!r}, the reference scorer's model is {scorer.model_name!r}: "
                             "it would score the answers under another model (set likelihood.scorer to the "
                             "target-only server's URL)")


# ---------------------------------------------------------------------------- the test


@dataclass
class LikelihoodVerdict:
    """One temperature's likelihood test."""

    temperature: float
    ok: bool
    alpha: float                 # this temperature's share of the family-wise alpha
    p_value: float               # the smallest p of the statistics (1.0 when not tested)
    n_candidate: int
    n_baseline: int
    statistic: dict[str, Any]
    support: dict[str, Any]
    power: dict[str, Any]
    method: str
    evidence: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    # answers scored on the ids the server sampled, per side (the rest on their text re-tokenized)
    on_ids: dict[str, int] = field(default_factory=dict)
    # the per-token test (tokenlaw.TokenVerdict.as_dict()), None when the answers carry no sampling parameters (not
    # "token": the reports redact values under keys ending so)
    per_token: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


STATS = ("mean_nll", "worst_window_nll", "pit_lag1")
_PIT_STATS = ("pit_lag1",)
# the floor of a prompt's pooled spread per statistic: the NLLs' is likelihood.sd_floor (nats); an
# autocorrelation of ~50 mid-PITs spreads by ~0.14, and 0.01 only keeps a zero spread from dividing
_PIT_SD_FLOOR = 0.01


def _stat(a: AnswerScore, name: str) -> float:
    v = {"mean_nll": a.mean_nll, "worst_window_nll": a.worst_window_nll, "pit_lag1": a.pit_lag1}[name]
    return float(v) if v is not None else float("nan")


def _computable(answers: list[AnswerScore]) -> tuple[str, ...]:
    """The statistics every answer has (the PIT statistics need the scorer's PITs)."""
    return tuple(n for n in STATS if n not in _PIT_STATS or all(a.pit is not None for a in answers))


def permutation_test(cand: dict[str, np.ndarray], base: dict[str, np.ndarray], permutations: int, seed: int,
                     sd_floor: float) -> dict[str, Any]:
    """Stratified two-sided permutation test: S = sum over strata of (mean_c - mean_b) / pooled sd, labels
    permuted within each stratum; p = (1 + #{|S*| >= |S|}) / (1 + permutations)."""
    rng = np.random.default_rng(seed)
    strata = sorted(set(cand) & set(base))
    obs = 0.0
    perm = np.zeros(permutations)
    per: dict[str, Any] = {}
    for s in strata:
        c, b = cand[s], base[s]
        x = np.concatenate([c, b])
        sd = max(float(x.std()), sd_floor)
        d = (c.mean() - b.mean()) / sd
        obs += d
        keys = rng.random((permutations, x.size))
        idx = np.argsort(keys, axis=1)[:, :c.size]
        mc = x[idx].mean(axis=1)
        mb = (x.sum() - c.size * mc) / b.size
        perm += (mc - mb) / sd
        per[s] = {"candidate_mean": float(c.mean()), "baseline_mean": float(b.mean()), "sd": sd,
                  "shift_sd": float(d), "n_candidate": int(c.size), "n_baseline": int(b.size)}
    p = (1 + int(np.sum(np.abs(perm) >= abs(obs) - 1e-12))) / (1 + permutations)
    z = obs / float(perm.std()) if perm.std() > 0 else 0.0
    return {"S": float(obs), "z": float(z), "p_value": float(p), "strata": per}


def smallest_p(sizes: list[tuple[int, int]], permutations: int) -> float:
    """The smallest p-value `permutation_test` can give for strata of (candidate, baseline) answers: the
    observed labelling is one of M = prod C(c + b, c) within-prompt labellings (two when every stratum has
    c == b: swapping all labels only flips the sign of S), and the Monte Carlo estimate adds one to both
    counts. When it is not below the statistic's alpha the test cannot reject whatever the answers are."""
    m = math.prod(math.comb(c + b, c) for c, b in sizes) if sizes else 1
    exact = (2 if sizes and all(c == b for c, b in sizes) else 1) / m
    return max(exact, 1 / (1 + permutations))


def design_problem(lc: Any, n_prompts: int, n_temperatures: int) -> str | None:
    """Why this sampling plan (len(seeds) candidate and len(baseline_seeds) baseline answers per prompt, over
    n_prompts prompts) can never fail the distribution test at its alpha, or None when it can."""
    a_stat = _alphas(lc, n_temperatures)[2]
    c, b = len(lc.seeds), len(lc.baseline_seeds)
    floor = smallest_p([(c, b)] * n_prompts, lc.permutations)
    if floor < a_stat:
        return None
    return (f"likelihood: {c} candidate and {b} baseline answer(s) per prompt over {n_prompts} prompts give the "
            f"permutation test no p-value below {floor:.3g}, and each statistic needs p < {a_stat:.3g} (alpha "
            f"{lc.alpha:g} over {n_temperatures} T>0 temperature(s)): the test could never fail; add seeds to "
            "likelihood.seeds / baseline_seeds")


def _alphas(lc: Any, n_temperatures: int, token: bool = True) -> tuple[float, float, float]:
    """(a temperature's alpha, the support check's share, each answer-level statistic's share); the per-token
    test's share is `_token_alphas` (token False: the answers carry no sampling parameters, so the per-token test
    cannot run and its share goes back to the answer-level statistics)."""
    a_t = lc.alpha / max(1, n_temperatures)
    share = float(getattr(lc, "token_share", 0.0)) if token else 0.0
    return a_t, a_t * lc.support_share, a_t * (1 - lc.support_share - share) / len(STATS)


def _token_alphas(lc: Any, n_temperatures: int) -> tokenlaw.Alphas:
    """The per-token test's alphas: `token_share` of the temperature's alpha, half to the KS test, three tenths
    to the mean u, a fifth to the count of tokens outside the law."""
    a_tok = lc.alpha / max(1, n_temperatures) * lc.token_share
    return tokenlaw.Alphas(ks=0.5 * a_tok, mean=0.3 * a_tok, outside=0.2 * a_tok)


def token_verdict(cand: list[AnswerScore], base: list[AnswerScore], lc: Any, n_temperatures: int,
                  exact_cut: bool = False) -> tokenlaw.TokenVerdict | None:
    """The per-token test of one temperature's answers (validation/tokenlaw.py), with its power at this gate's
    size from the baseline's rows; None when an answer was scored without its sampling parameters."""
    if not cand or not base or any(a.tok_pit is None for a in cand + base):
        return None
    alphas = _token_alphas(lc, n_temperatures)
    cp = [x for a in cand for x in a.tok_pit or ()]
    bp = [x for a in base for x in a.tok_pit or ()]
    if not cp or not bp:  # no drawn token known on a side (every answer scored on its text): nothing to place
        return None
    tv = tokenlaw.token_test(cp, bp, alphas, approximate=sum(a.approx_tokens for a in cand),
                             limit=lc.token_noise_limit, cand_excess=[e for a in cand for e in a.tok_excess],
                             exact_cut=exact_cut)
    draws = np.asarray([w for a in base for w in a.wrong or ()], dtype=np.float64)
    draws = draws.reshape(-1, draws.shape[1] if draws.ndim == 2 else 2 * len(tokenlaw.FAMILIES))
    if lc.token_power_reps:
        tv.power = tokenlaw.token_power(draws, len(cp), tv.noise_allowance, len(bp), tv.outside_baseline, alphas,
                                        lc.token_power_target, lc.token_power_reps, lc.rng_seed, tv.mean_allowance)
    return tv


def support_limit(lc: Any, n_tokens: int, top_p: float, a_support: float, vocab: int) -> tuple[float, float]:
    """(log eps, the false-fail bound N * V * eps / top_p) for N candidate tokens over a vocabulary of V."""
    log_eps = lc.support_log_eps
    if n_tokens > 0:
        log_eps = min(log_eps, math.log(a_support * top_p / (n_tokens * vocab)))
    return log_eps, n_tokens * vocab * math.exp(log_eps) / top_p


def _unvouched(piece: str) -> bool:
    """A token the text cannot vouch for: its piece holds U+FFFD, so the engine's bytes there were lost (a lone
    byte of a multi-byte character is shown as U+FFFD, and re-tokenizing the text scores the replacement
    character itself). Measured: every correct answer's token below -22 nats was one (docs/likelihood.md)."""
    return "\ufffd" in piece


def _impossible(answers: list[AnswerScore], log_eps: float) -> list[dict[str, Any]]:
    out = []
    for a in answers:
        if a.support_logprobs is None:
            continue
        for k, v in enumerate(a.support_logprobs):
            if v < log_eps and not (k < len(a.pieces) and _unvouched(a.pieces[k])):
                out.append({"answer": a.label, "position": k, "piece": a.pieces[k] if k < len(a.pieces) else "",
                            "log_p_T": v, "p_T": math.exp(v), "log_p_1": a.token_logprobs[k],
                            "context": a.text_at(k - 12, 12)[-60:]})
    return out


def _by_prompt(answers: list[AnswerScore], name: str) -> dict[str, np.ndarray]:
    g: dict[str, list[float]] = defaultdict(list)
    for a in answers:
        g[a.prompt_id].append(_stat(a, name))
    return {k: np.asarray(v) for k, v in g.items()}


def _decide(cand: list[AnswerScore], base: list[AnswerScore], lc: Any, log_eps: float, a_stat: float,
            permutations: int, normal: bool = False) -> tuple[bool, dict[str, Any], list[dict[str, Any]]]:
    """(pass, the statistics' tests, the impossible tokens). normal=True decides each statistic on the normal
    approximation of its permutation distribution (p = erfc(|z| / sqrt 2)) instead of the Monte Carlo count,
    which cannot go below 1 / (1 + permutations): the power estimate's few permutations would otherwise make
    every statistic unable to reject (as it was until 2026-12-04 at three T>0 temperatures)."""
    bad = _impossible(cand, log_eps)
    stats = {n: permutation_test(_by_prompt(cand, n), _by_prompt(base, n), permutations, lc.rng_seed,
                                 _PIT_SD_FLOOR if n in _PIT_STATS else lc.sd_floor)
             for n in _computable(cand + base)}
    if normal:
        ok = not bad and all(math.erfc(abs(s["z"]) / math.sqrt(2)) >= a_stat for s in stats.values())
    else:
        ok = not bad and all(s["p_value"] >= a_stat for s in stats.values())
    return ok, stats, bad


def likelihood_test(candidate: list[AnswerScore], baseline: list[AnswerScore], cfg: Any, n_temperatures: int,
                    variants: list[AnswerScore] | None = None, top_p: float | None = None,
                    exact_cut: bool = False) -> LikelihoodVerdict:
    """One temperature's verdict (every answer given must be at one T). cfg: a GateConfig (its likelihood and
    sampling.top_p) or a LikelihoodConfig with top_p given. variants: scored corruptions of the baseline's
    answers (make_variants) for the power estimate."""
    lc = getattr(cfg, "likelihood", cfg)
    if top_p is None:
        samp = getattr(cfg, "sampling", None)
        top_p = getattr(samp, "min_top_p", None) or getattr(samp, "top_p", None) or 1.0
    temps = {a.temperature for a in candidate} | {a.temperature for a in baseline}
    if len(temps) > 1:
        raise ValueError(f"likelihood_test takes one temperature's answers, got {sorted(temps)}")
    t = temps.pop() if temps else float("nan")
    per_token_on = bool(candidate) and bool(baseline) and all(a.tok_pit is not None for a in candidate + baseline)
    a_t, a_sup, a_stat = _alphas(lc, n_temperatures, per_token_on)
    unscored = [a for a in candidate if a.error or a.n_tokens == 0]
    cand = [a for a in candidate if not (a.error or a.n_tokens == 0)]
    base = [a for a in baseline if not (a.error or a.n_tokens == 0)]
    n_tok = sum(a.n_tokens for a in cand)
    vocab = max([a.vocab for a in cand], default=DEFAULT_VOCAB)
    log_eps, bound = support_limit(lc, n_tok, top_p, a_sup, vocab)
    method = (f"stratified two-sided permutation test ({lc.permutations} permutations, seed {lc.rng_seed}) of the "
              f"per-answer mean NLL, worst {lc.window}-token-window NLL and lag-1 autocorrelation of the "
              f"mid-PITs at T under the target model, by prompt; "
              f"alpha {lc.alpha:g} over {n_temperatures} T>0 temperatures -> {a_t:.3g} at T={t:g}: "
              f"{a_sup:.3g} to the support check (no token with log p_T < {log_eps:.2f}, false-fail bound "
              f"N*V*eps/top_p), {a_stat:.3g} to each statistic")
    sup: dict[str, Any] = {"log_eps": log_eps, "eps": math.exp(log_eps), "n_tokens": n_tok, "vocab": vocab,
                           "top_p": top_p,
                           "bound": bound, "alpha": a_sup, "exact": all(a.exact_support for a in cand),
                           "impossible": [], "min_log_p_T": None}
    sl = [min((v for k, v in enumerate(a.support_logprobs) if not (k < len(a.pieces) and _unvouched(a.pieces[k]))),
              default=0.0) for a in cand if a.support_logprobs]
    sup["unvouched_tokens"] = sum(1 for a in cand for p in a.pieces if _unvouched(p))
    sup["min_log_p_T"] = min(sl) if sl else None
    common = sorted({a.prompt_id for a in cand} & {a.prompt_id for a in base})
    v = LikelihoodVerdict(t, False, a_t, 1.0, len(cand), len(base), {"alpha_per_statistic": a_stat}, sup, {}, method)
    if unscored:
        v.reason = (f"{len(unscored)} candidate answer(s) could not be scored: "
                    + "; ".join(f"{a.label}: {a.error or 'no tokens'}" for a in unscored[:4]))
        v.evidence = [{"answer": a.label, "error": a.error or "no tokens"} for a in unscored]
        return v
    if len(cand) < lc.min_answers or len(base) < lc.min_answers or not common:
        v.reason = (f"{len(cand)} candidate and {len(base)} baseline answers scored at T={t:g} over "
                    f"{len(common)} shared prompts: fewer than likelihood.min_answers={lc.min_answers} per side "
                    "never pass")
        return v
    sizes = [(sum(1 for a in cand if a.prompt_id == p), sum(1 for a in base if a.prompt_id == p)) for p in common]
    floor = smallest_p(sizes, lc.permutations)
    if floor >= a_stat:  # what was scored cannot reject: a pass would be no verdict (the plan is checked at start)
        v.reason = (f"{len(cand)} candidate and {len(base)} baseline answers over {len(common)} prompts: the "
                    f"permutation test's smallest possible p is {floor:.3g}, not below {a_stat:.3g}; never passes")
        return v
    ok, stats, bad = _decide(cand, base, lc, log_eps, a_stat, lc.permutations)
    sup["impossible"] = bad
    v.statistic.update(stats)
    v.statistic["prompts"] = common
    v.statistic["prompts_not_shared"] = sorted(({a.prompt_id for a in cand} | {a.prompt_id for a in base})
                                               - set(common))
    v.p_value = min(s["p_value"] for s in stats.values())
    v.statistic["not_computed"] = [n for n in STATS if n not in stats]  # their alpha share stays unspent
    tv = token_verdict(cand, base, lc, n_temperatures, exact_cut)
    if tv is not None:
        v.per_token = tv.as_dict()
        ok = ok and tv.ok
    v.ok = ok
    v.power = estimate_power(base, variants, lc, log_eps, a_stat, {p: sum(1 for a in cand if a.prompt_id == p)
                                                                   for p in common})
    if not ok:
        parts = []
        if bad:
            parts.append(f"{len(bad)} candidate token(s) with log p_T < {log_eps:.2f} (a correct sampler emits one "
                         f"with probability < {bound:.2g})")
        for n, s in stats.items():
            if s["p_value"] < a_stat:
                parts.append(f"{n} shifted by {s['z']:+.1f} sd (p={s['p_value']:.2g} < {a_stat:.2g})"
                             + (": successive tokens are not drawn independently" if n == "pit_lag1" else ""))
        if tv is not None and not tv.ok:
            parts.insert(0, f"per-token: {tv.reason}")
        v.reason = "; ".join(parts)
        v.evidence = _evidence(cand, stats, bad)
    else:
        v.reason = (f"no impossible token (min log p_T {sup['min_log_p_T']:.2f} >= {log_eps:.2f}); "
                    + ", ".join(f"{n} p={s['p_value']:.3g}" for n, s in stats.items())
                    + (f"; per-token: {tv.reason}" if tv is not None else ""))
    return v


def _evidence(cand: list[AnswerScore], stats: dict[str, Any], bad: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for a in cand:
        zs = {}
        for n in stats:
            st = stats[n]["strata"].get(a.prompt_id)
            if st:
                zs[n] = (_stat(a, n) - st["baseline_mean"]) / st["sd"]
        if not zs:
            continue
        w, at = a.worst_window()
        rows.append({"answer": a.label, "z": zs, "mean_nll": a.mean_nll, "worst_window_nll": w,
                     "worst_window_text": a.text_at(at, a.window)[:160], "key": max(abs(x) for x in zs.values())})
    rows.sort(key=lambda r: -r["key"])
    for r in rows:
        r.pop("key")
    # keys that are no secret's (the reports redact values under keys ending in "token")
    return [{"impossible": b} for b in bad[:12]] + rows[:6]


# ---------------------------------------------------------------------------- power


def make_variants(baseline: list[tuple[AnswerScore, list[dict[str, str]], str]], scorer: Scorer, lc: Any,
                  seed: int | None = None) -> list[AnswerScore]:
    """Corrupted variants of the baseline's own answers (one per family of lc.power_families, where the family
    can corrupt the text), scored by the same scorer at the answer's temperature. baseline: (its score, the
    prompt's messages, its text)."""
    from sglfleet.validation.synth import corrupt

    rng = random.Random(lc.rng_seed if seed is None else seed)
    reqs = []
    for a, messages, text in baseline:
        for fam in lc.power_families:
            try:
                bad = corrupt(text, fam, rng)
            except ValueError:
                continue
            reqs.append(ScoreRequest(messages, bad, a.temperature, a.prompt_id, a.seed))
    return [s for s in score_all(scorer, reqs) if not s.error and s.n_tokens]


def estimate_power(base: list[AnswerScore], variants: list[AnswerScore] | None, lc: Any, log_eps: float,
                   a_stat: float, n_per_prompt: dict[str, int]) -> dict[str, Any]:
    """Monte Carlo rejection rate of the whole decision when a fraction r of the candidate's answers are
    corrupted: per prompt, n candidate answers drawn with replacement from the baseline's answers, each
    replaced with probability r by a corrupted variant (of that prompt), tested against the baseline."""
    if not variants or lc.power_reps == 0:
        return {"estimated": False, "why": "no scored corrupted variants" if lc.power_reps else "power_reps is 0"}
    rng = np.random.default_rng(lc.rng_seed + 1)
    bp: dict[str, list[AnswerScore]] = defaultdict(list)
    vp: dict[str, list[AnswerScore]] = defaultdict(list)
    for a in base:
        bp[a.prompt_id].append(a)
    for a in variants:
        vp[a.prompt_id].append(a)
    prompts = [p for p in n_per_prompt if bp.get(p)]
    rates = sorted(lc.power_rates)
    table = {}
    for r in [0.0, *rates]:
        rejected = 0
        for _ in range(lc.power_reps):
            cand = []
            for p in prompts:
                for _k in range(n_per_prompt[p]):
                    pool = vp[p] if vp.get(p) and rng.random() < r else bp[p]
                    cand.append(pool[int(rng.integers(len(pool)))])
            ok, _, _ = _decide(cand, base, lc.model_copy(update={"rng_seed": int(rng.integers(1 << 30))}),
                               log_eps, a_stat, lc.power_permutations, normal=True)
            rejected += not ok
        table[f"{r:g}"] = rejected / lc.power_reps
    hit = [r for r in rates if table[f"{r:g}"] >= lc.power_target]
    return {"estimated": True, "reps": lc.power_reps, "rejection_rate": table, "target": lc.power_target,
            "min_detectable_rate": hit[0] if hit else None, "families": list(lc.power_families),
            "n_variants": len(variants),
            "note": "candidate answers resampled from the baseline's own (rate 0 is the resampled null); each "
                    f"statistic decided on the normal approximation of {lc.power_permutations} permutations"}


# ---------------------------------------------------------------------------- the whole T>0 verdict


@dataclass(frozen=True)
class Answer:
    """One T>0 answer to score: what the gate sampled (candidate) or the baseline recorded."""

    prompt_id: str
    temperature: float
    seed: int | None
    text: str
    stopped: bool | None = None   # finish_reason == "stop"; None: unknown (a recorded baseline keeps texts only)
    ids: tuple[int, ...] | None = None  # the token ids the server sampled, where it said them
    params: SamplingParams | None = None  # the request's sampling parameters (the per-token test)


def likelihood_verdicts(candidate: list[Answer], baseline: list[Answer], scorer: Scorer, cfg: Any,
                        messages_of: Any, temperatures: list[float] | None = None,
                        on_score: Any = None, on_baseline: Any = None) -> list[LikelihoodVerdict]:
    """Every T>0 temperature's verdict: both sides scored by `scorer`, the baseline's corrupted variants made and
    scored for the power estimate, alpha split over the temperatures. messages_of(prompt_id) -> the prompt's
    chat messages. The end-of-turn token is scored only when every answer on both sides says whether it
    stopped (else on neither side: the two sides must be scored alike). The power estimate's variants are made
    of `likelihood.power_answers_per_prompt` baseline answers per prompt and temperature. on_score(score), if
    given, is called after every answer scored (progress)."""
    temps = sorted(temperatures or {a.temperature for a in candidate + baseline if a.temperature > 0})
    with_stop = all(a.stopped is not None for a in candidate + baseline)
    # the sampled ids where the server named them: a sampler may draw a non-canonical segmentation (" Or" "ter"
    # "ol" "le"), whose text re-tokenized holds a token it never drew (" Or" "terol" "le", log p -23.8: a false
    # "impossible token", H200 2026-12-03). Only when both sides have ids: one side scored on ids and the other
    # on text (a baseline recorded before ids were kept) would differ by that alone. Within that, an answer
    # without ids is scored on its text (llama.cpp names no ids for an answer holding a character drawn as
    # several tokens, an emoji): whether an answer has them depends on its content alone, alike on both sides
    # of a correct build, so the two sides stay exchangeable.
    with_ids = any(a.ids for a in candidate) and any(a.ids for a in baseline)

    def scored(rows: list[Answer]) -> list[AnswerScore]:
        # the per-token test needs every answer's parameters on both sides (a baseline recorded before they were
        # kept has none: the answer-level statistics judge alone then)
        with_params = all(a.params is not None for a in candidate + baseline)
        return score_all(scorer, [ScoreRequest(messages_of(a.prompt_id), a.text, a.temperature, a.prompt_id, a.seed,
                                               bool(with_stop and a.stopped), a.ids if with_ids else None,
                                               a.params if with_params else None)
                                  for a in rows], on_score)

    out = []
    sides = []
    for t in temps:  # every temperature scored first: the per-token test reads the baseline's tokens of all of them
        base_rows = [a for a in baseline if a.temperature == t]
        base = scored(base_rows)
        if on_baseline is not None:
            on_baseline(base)
        sides.append((t, base_rows, base, scored([a for a in candidate if a.temperature == t])))
    # the scorer is exact at the law's cut for this engine when none of the baseline's own drawn tokens, at any
    # temperature, lies outside its request's law (tokenlaw.token_test: then a candidate token clearly outside is
    # refused with zero tolerance)
    exact_cut = all(x is not None for _, _, base, _ in sides for a in base for x in (a.tok_pit or ()))
    for t, base_rows, base, cand in sides:
        lc = getattr(cfg, "likelihood", cfg)
        variants = None
        if lc.power_reps:
            kept: dict[str, int] = defaultdict(int)
            chosen = []
            for sc, r in zip(base, base_rows, strict=True):
                if not sc.error and kept[r.prompt_id] < lc.power_answers_per_prompt:
                    kept[r.prompt_id] += 1
                    chosen.append((sc, messages_of(r.prompt_id), r.text))
            variants = make_variants(chosen, scorer, lc)
        v = likelihood_test(cand, base, cfg, n_temperatures=len(temps), variants=variants, exact_cut=exact_cut)
        v.on_ids = {side: sum(1 for a in rows if with_ids and a.ids and a.temperature == t)
                    for side, rows in (("candidate", candidate), ("baseline", baseline))}
        out.append(v)
    return out


def answer_seed(seed: int, prompt_id: str, temperature: float) -> int:
    """The sampling seed to send for one (prompt, temperature) of a likelihood run: derived from the configured
    seed, the prompt and the temperature, so no two answers share a sampler stream.

    With one seed for every prompt, the answers of different prompts are not independent: llama.cpp (and any
    seeded sampler) draws the same uniforms for the same seed, so a seed whose draws land on likely tokens
    lowers the NLL of every prompt at once. Measured on 384 real answers of the embedded target
    (docs/likelihood.md): the per-seed mean over prompts varies 1.3-2x more than for independent answers,
    and the per-prompt permutation test then fails 6.5 % of correct gate runs instead of <= 1 %."""
    import hashlib

    h = hashlib.sha256(f"likelihood/{seed}/{prompt_id}/{temperature:g}".encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF


# ---------------------------------------------------------------------------- the candidate as its own scorer


def score_key(prompt_id: str, temperature: float, seed: int | None) -> str:
    return f"{prompt_id}@T{temperature:g}/seed{seed}"


def record_scores(url: str, cfg: Any, model: str, api_key: str | None, samples: list[Any],
                  messages: dict[str, list[dict[str, str]]]) -> dict[str, Any]:
    """What record-baseline keeps so that a gate without a live target-only server can trust the candidate's own
    prefill as the target's scorer: every T>0 baseline answer's log p_1 per token, scored by the recording
    (target-only) server itself through the same SGLang scorer the gate uses."""
    scorer = make_scorer(url, cfg, model=model, api_key=api_key)
    try:
        hot = [s for s in samples if s.purpose == "suite" and s.temperature > 0 and not s.error]
        got = score_all(scorer, [ScoreRequest(messages[s.prompt_id], s.text, s.temperature, s.prompt_id, s.seed,
                                              s.finish_reason == "stop",
                                              tuple(s.output_ids) if s.output_ids else None) for s in hot])
    finally:
        scorer.close()
    return {"method": scorer.method, "eos_id": scorer.eos_id,
            "logprobs": {score_key(a.prompt_id, a.temperature, a.seed): [round(x, 5) for x in a.token_logprobs]
                         for a in got if not a.error}}


@dataclass
class ScorerTrust:
    """Whether a scorer reproduces the log-probs the target-only server gave the baseline's answers."""

    ok: bool
    scorer: str
    answers: int
    tokens: int
    median_abs: float | None
    p99_abs: float | None
    max_abs: float | None
    limits: dict[str, float]
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def check_trust(recorded: dict[str, list[float]], scored: list[AnswerScore], scorer_name: str, lc: Any
                ) -> ScorerTrust:
    """The scorer's log p_1 of the baseline's own answers against what the target-only server recorded for them:
    the median and 99th-percentile absolute differences within likelihood.trust_* (bf16 numerics differ between
    batch shapes; another model, another quantisation or a broken prefill differ by far more)."""
    limits = {"median_abs_nats": lc.trust_median_nats, "p99_abs_nats": lc.trust_p99_nats}
    diffs: list[float] = []
    n = 0
    missing = []
    for a in scored:
        want = recorded.get(score_key(a.prompt_id, a.temperature, a.seed))
        if want is None or a.error:
            missing.append(a.label)
            continue
        if len(want) != a.n_tokens:
            return ScorerTrust(False, scorer_name, n, len(diffs), None, None, None, limits,
                               f"{a.label}: {a.n_tokens} tokens scored, {len(want)} recorded: another tokenizer or "
                               "chat template than the baseline's")
        n += 1
        diffs += [abs(x - y) for x, y in zip(a.token_logprobs, want, strict=True)]
    if not diffs:
        return ScorerTrust(False, scorer_name, 0, 0, None, None, None, limits,
                           "no baseline answer with recorded scores was scored: nothing shows the scorer is the "
                           "target model" + (f" ({len(missing)} without)" if missing else ""))
    d = np.asarray(diffs)
    med, p99, mx = float(np.median(d)), float(np.quantile(d, 0.99)), float(d.max())
    ok = med <= lc.trust_median_nats and p99 <= lc.trust_p99_nats
    what = (f"{scorer_name} scored the baseline's {n} answers ({d.size} tokens) within |d log p| median {med:.4f}, "
            f"p99 {p99:.4f}, max {mx:.3f} nats of the target-only server's recorded log-probs")
    reason = what if ok else (what + f": beyond the limits (median {lc.trust_median_nats:g}, p99 "
                                      f"{lc.trust_p99_nats:g}): its target model is not the baseline's")
    return ScorerTrust(ok, scorer_name, n, int(d.size), med, p99, mx, limits, reason)
