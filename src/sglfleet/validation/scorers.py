"""The scorers of the target model: each answer's per-token log-probabilities under the target, and the
per-token fields the likelihood test reads (validation/likelihood.py holds the statistics, none of them here).

Two scorers: `ReferenceScorer`, the in-process numpy forward pass of the embedded llama.cpp target's own model
(textscore/refmodel.py, full logits: p_T exact), and `SGLangScorer`, the target-only SGLang server's `/generate`
with input log-probs (top-k rows: p_T's normaliser from the alternatives seen). `make_scorer` probes one once
(served model, tokenizer, log-probs) and fails with a UsageError before any gate request when it cannot score;
`score_all` scores a list of `ScoreRequest`s, batched where the scorer can; `record_scores` is what
record-baseline keeps so that a gate can trust the candidate's own prefill as the scorer.

    scorer = make_scorer("reference", gate_cfg, model=name, candidate_url=url)   # or the baseline's URL
    a = scorer.score(messages, answer_text, temperature, stop=True)            # AnswerScore
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sglfleet.pipeline.errors import UsageError
from sglfleet.validation import tokenlaw
from sglfleet.validation.tokenlaw import SamplingParams

PROBE_TEXT = ("The quick brown fox jumps over the lazy dog. Numbers 12345 and symbols: #@!; "
              "déjà vu, naïve café, 東京, emoji 🙂\n\n```python\ndef f(x):\n    return x * 2\n```")
PROBE_MESSAGES = [{"role": "user", "content": "Say hello."}]

# ---------------------------------------------------------------------------- scores


NO_EDGE = tokenlaw.EdgeCount()


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
    # each outside token's reach past the request's threshold cuts in logits (tokenlaw.threshold_reach; None:
    # outside top-p only), in the order of tok_excess
    tok_reach: tuple[float | None, ...] = ()
    # each outside token's reach past the top-k cut and past the min-p cut, each alone (tokenlaw.cut_reaches; None:
    # that cut holds it or is off), in the order of tok_excess: the counts by cut at any bar, after the fact
    tok_cut_reach: tuple[tuple[float | None, float | None], ...] = ()
    # the draws of the token at the law's cut, where the law is cut inside the listed candidates (tokenlaw.edge_of)
    edge: tokenlaw.EdgeCount = NO_EDGE
    # per truncation (tokenlaw.CUTS): the answer's tokens when its request turns it on (else 0), and its tokens
    # left outside the law by it (tokenlaw.cut_by)
    cut_tokens: tuple[int, int, int] = (0, 0, 0)
    cut_outside: tuple[int, int, int] = (0, 0, 0)

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

class Scorer(Protocol):
    name: str
    method: str
    order: tuple[str, ...]  # the engine's truncation order the per-token test applies (tokenlaw.ORDERS)
    eos_id: int | None

    def score(self, messages: list[dict[str, str]], answer: str, temperature: float, *, prompt_id: str = "",
              seed: int | None = None, stop: bool = False) -> AnswerScore: ...

    def next_token_row(self, messages: list[dict[str, str]], prefix: str, k: int) -> list[tuple[bytes, float]]: ...

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
    reach: list[float | None] = []
    cut_reach: list[tuple[float | None, float | None]] = []
    approx, edge_drawn, edge_exp, edge_n = 0, 0, 0.0, 0
    cut_out = [0, 0, 0]
    for k, (row, tok) in enumerate(zip(rows, seq, strict=True)):
        law = tokenlaw.law_of(row, params, order)
        hit = np.flatnonzero(row.ids == tok)
        rank = int(hit[0]) if hit.size else None
        pits.append(tokenlaw.pit(law, rank, tokenlaw.uniform_of(f"{label}/{k}")))
        if pits[-1] is None:
            excess.append(tokenlaw.outside_excess(row, law, rank, temperature))
            cut_reach.append(tokenlaw.cut_reaches(row, params, order, rank))
            reach.append(tokenlaw.farthest(cut_reach[-1]))  # its threshold_reach, the cuts placed once
            by = tokenlaw.cut_by(row, params, order, rank, tokenlaw.CUT_REACH)  # a threshold cut: past CUT_REACH
            cut_out = [c + int(b) for c, b in zip(cut_out, by, strict=True)]
        wrong.append(tokenlaw.wrong_draws(row, law, params, order, rng))
        approx += law.approximate
        e = wrong[-1][-1]  # wrong_draws ends with the cut token's probability (edge_of; NaN: no cut in the row)
        if not math.isnan(e):
            edge_n, edge_exp, edge_drawn = edge_n + 1, edge_exp + e, edge_drawn + (rank == law.n - 1)
    return {"tok_pit": tuple(pits), "wrong": tuple(wrong), "tok_excess": tuple(excess), "tok_reach": tuple(reach),
            "tok_cut_reach": tuple(cut_reach),
            "approx_tokens": approx,
            "edge": tokenlaw.EdgeCount(edge_drawn, edge_exp, edge_n),
            "cut_tokens": tuple(len(seq) * int(on) for on in tokenlaw.cuts_of(params)),
            "cut_outside": tuple(cut_out)}


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
        from sglfleet.textscore.judge import FluencyJudge, judge_model_path

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
        end = end_token(seq, stop, self.eos_id)
        if end is not None:
            seq.append(end)
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

    def next_token_row(self, messages: list[dict[str, str]], prefix: str, k: int) -> list[tuple[bytes, float]]:
        """The target's `k` likeliest next tokens after the assistant text `prefix` (piece bytes, log p at T=1,
        likeliest first): lossless_t0 places a candidate's token the baseline did not list (lossless.Place)."""
        logits = self._judge.logits(self.prompt_ids(messages) + (self.tokenize(prefix) if prefix else []), [0])
        row = tokenlaw.row_from_logits(logits[0], 1.0, keep=k)
        top = [int(i) for i in row.ids]
        return [(piece.encode(), float(lp)) for lp, piece in zip(row.lp, self._judge.pieces(top), strict=True)]

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

    def logprobs(self, prompt: list[int], ids: list[int], top_k: int | None = None
                 ) -> tuple[list[float], list[list[tuple[float, int]]]]:
        """(log p_1 of each id, its top-k alternatives; top_k None: the scorer's) after prompt, from one /generate
        call."""
        body = {"input_ids": prompt + ids, "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                "return_logprob": True, "logprob_start_len": len(prompt) - 1,
                "top_logprobs_num": self.top_k if top_k is None else top_k,
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
        end = end_token(ids, stop, self.eos_id)
        if end is not None:
            ids.append(end)
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

    def next_token_row(self, messages: list[dict[str, str]], prefix: str, k: int) -> list[tuple[bytes, float]]:
        """The target's `k` likeliest next tokens after the assistant text `prefix` (piece bytes, log p at T=1,
        likeliest first), from the server's input log-probs (its prefill: no drafting) of one more position."""
        context = self.prompt_ids(messages) + (self.tokenize(prefix) if prefix else [])
        # one more input position after the text: its row is the next-token law there, whatever id fills it
        _, alts = self.logprobs(context, [context[-1]], top_k=k)
        top = sorted(alts[0], key=lambda t: -t[0])[:k]
        pieces = self._pieces([i for _, i in top])
        return [(piece.encode(), lp) for (lp, _), piece in zip(top, pieces, strict=True)]

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


# ---------------------------------------------------------------------------- the candidate as its own scorer


def score_key(prompt_id: str, temperature: float, seed: int | None) -> str:
    return f"{prompt_id}@T{temperature:g}/seed{seed}"


def ended_at_end_of_turn(finish_reason: str | None, sampling: dict[str, Any] | None = None) -> bool | None:
    """Whether an answer ended on the model's end-of-turn token, so a scorer scores that token after it: the one
    rule for every side that scores answers (the gate's candidate and baseline, record-baseline's recorded
    scores). An answer requested with stop strings may have stopped on one of them instead, which no server
    reports alike: scored without an end. None: the server did not say why it finished."""
    if finish_reason is None:
        return None
    return finish_reason == "stop" and not (sampling or {}).get("stop")


def end_token(ids: Sequence[int], ended: bool | None, eos_id: int | None) -> int | None:
    """The end-of-turn token a scorer appends to an answer's ids, or None: appended when the answer ended on it and
    the ids do not already hold it (sampled ids may). The one rule of ReferenceScorer.score, SGLangScorer._with_end
    and scored_length."""
    return eos_id if ended and eos_id is not None and (not ids or ids[-1] != eos_id) else None


def scored_length(ids: Sequence[int], ended: bool | None, eos_id: int | None) -> int:
    """How many log-probs a scorer returns for an answer's sampled ids (``end_token``)."""
    return len(ids) + int(end_token(ids, ended, eos_id) is not None)


def check_recorded_scores(recorded: dict[str, Any], rows: list[Any], path: str) -> None:
    """A baseline file's recorded scores (record_scores) must be of its own answers under today's end-of-turn
    rule: one log-prob per sampled id, plus the end-of-turn token where the answer ended on it. A file recorded
    by an sglfleet that scored stop-string answers with an end (before 2026-12-05) is refused here, before any
    request, instead of every gate run failing its scorer-trust check."""
    lp, eos = recorded.get("logprobs") or {}, recorded.get("eos_id")
    eos_id = int(eos) if isinstance(eos, int) else None
    bad = []
    for r in rows:
        got = lp.get(score_key(r.prompt_id, r.temperature, r.seed))
        if got is None or not r.output_ids:
            continue
        ended = ended_at_end_of_turn(r.finish_reason, r.sampling)
        want = scored_length(r.output_ids, ended, eos_id)
        if len(got) != want:
            why = "it stopped on a stop string" if r.finish_reason == "stop" and not ended else \
                f"finish_reason {r.finish_reason}"
            bad.append(f"{score_key(r.prompt_id, r.temperature, r.seed)}: {len(got)} scores for {len(r.output_ids)} "
                       f"sampled ids, {want} expected ({why})")
    if bad:
        raise UsageError(f"baseline {path}: the recorded target-only scores do not match its answers under the "
                         f"gate's end-of-turn rule for {len(bad)} answers ({'; '.join(bad[:3])}): recorded by an "
                         "older record-baseline; re-record it (python -m sglfleet.validation record-baseline)")


def record_scores(url: str, cfg: Any, model: str, api_key: str | None, samples: list[Any],
                  messages: dict[str, list[dict[str, str]]]) -> dict[str, Any]:
    """What record-baseline keeps so that a gate without a live target-only server can trust the candidate's own
    prefill as the target's scorer: every T>0 baseline answer's log p_1 per token, scored by the recording
    (target-only) server itself through the same SGLang scorer the gate uses."""
    scorer = make_scorer(url, cfg, model=model, api_key=api_key)
    try:
        hot = [s for s in samples if s.purpose == "suite" and s.temperature > 0 and not s.error]
        got = score_all(scorer, [ScoreRequest(messages[s.prompt_id], s.text, s.temperature, s.prompt_id, s.seed,
                                              bool(ended_at_end_of_turn(s.finish_reason, s.sampling)),
                                              tuple(s.output_ids) if s.output_ids else None) for s in hot])
    finally:
        scorer.close()
    return {"method": scorer.method, "eos_id": scorer.eos_id,
            "logprobs": {score_key(a.prompt_id, a.temperature, a.seed): [round(x, 5) for x in a.token_logprobs]
                         for a in got if not a.error}}
