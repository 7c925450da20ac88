"""Workloads: what each request asks. Built once per process into ready-to-send request bytes.

* `builtin`   - a fixed set of everyday prompts (below), `max_tokens` each.
* `synthetic` - prompts of a target input length (random common words, a unique prefix per prompt so
  prefix caches do not flatter the server) and a target output length, with `ignore_eos` and
  `min_tokens` so servers that support them emit exactly that many tokens. Asked-vs-received
  lengths are recorded per request and summarised as mismatches. The prompts are new on every run
  (the run's nonce seeds the words and heads each prompt), so a server's prefix cache warmed by an
  earlier run does not turn a TTFT measurement into a cache benchmark; `reuse_prompts: true` asks for
  the same prompts as every other run with the same seed.
* `prefix-cache` - on purpose the cache's best case: `prefix_pool` fixed synthetic prompts (from the
  seed alone, the same in every run) sent over and over.
* `jsonl`     - one JSON object per line: `{"prompt": "..."}` or `{"messages": [...]}`, optionally
  `"max_tokens"` (alias `"output_tokens"`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglfleet.loadtests.config import LoadTestConfig, WorkloadConfig
from sglfleet.loadtests.stream import Endpoint, build_request
from sglfleet.pipeline.errors import UsageError

BUILTIN_PROMPTS: tuple[str, ...] = (
    "Explain in a few sentences how a refrigerator keeps food cold.",
    "Write a short poem about the ocean at night.",
    "What are three tips for writing readable Python code?",
    "Summarise the plot of a detective story you invent, in one paragraph.",
    "Describe the water cycle to a ten-year-old.",
    "List five fruits and one fact about each.",
    "Why is the sky blue? Answer briefly.",
    "Give me a simple recipe for pancakes.",
    "What is the difference between a list and a tuple in Python?",
    "Write a friendly email inviting a colleague to lunch.",
    "Explain what a load balancer does in a web service.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Describe a sunrise over the mountains.",
    "What should I pack for a weekend hiking trip?",
    "Explain the rules of tic-tac-toe.",
    "Write a haiku about autumn leaves.",
    "How do vaccines train the immune system? Keep it short.",
    "Give three reasons to learn a second language.",
    "What is a prime number? Give examples.",
    "Tell a short story about a robot who learns to paint.",
)

# Common words; most are one token in BPE vocabularies, so word count tracks token count closely.
_WORD_TEXT = """
the of and to in is you that it he was for on are as with his they at be this have from or one had
by word but not what all were we when your can said there use an each which she do how their if
will up other about out many then them these so some her would make like him into time has look two
more write go see number no way could people my than first water been call who oil its now find
long down day did get come made may part over new sound take only little work know place year live
me back give most very after thing our just name good sentence man think say great where help
through much before line right too mean old any same tell boy follow came want show also around
form three small set put end does another well large must big even such because turn here why ask
went men read need land different home us move try kind hand picture again change off play spell
air away animal house point page letter
"""
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class RequestSpec:
    """One prepared request: the bytes to send plus what it asked for."""

    raw: bytes
    asked_output: int
    asked_input: int | None  # synthetic only: the target prompt length in tokens
    exact_output: bool  # True when ignore_eos/min_tokens ask the server for exactly asked_output


def synthetic_prompt(rng: random.Random, n_words: int, index: int, nonce: str = "") -> str:
    """A unique prompt of `n_words` random common words (headed by the run's nonce, when given)."""
    words = [rng.choice(_WORDS) for _ in range(max(0, n_words))]
    return f"Request {nonce + '-' if nonce else ''}{index}: " + " ".join(words)


def read_jsonl(path: str | Path, default_max_tokens: int) -> list[tuple[list[dict[str, str]], int]]:
    """Parse a JSONL dataset into (messages, max_tokens) pairs; UsageError names the bad line."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"dataset file not found: {p}")
    items: list[tuple[list[dict[str, str]], int]] = []
    with p.open(encoding="utf-8", errors="strict") as fh:
        try:
            lines = list(fh)
        except UnicodeDecodeError:
            raise UsageError(f"{p}: not UTF-8 text") from None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{p}:{no}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise UsageError(f"{p}:{no}: each line must be a JSON object")
        if isinstance(obj.get("prompt"), str) and obj["prompt"]:
            messages = [{"role": "user", "content": obj["prompt"]}]
        elif isinstance(obj.get("messages"), list) and obj["messages"]:
            messages = obj["messages"]
            if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                       for m in messages):
                raise UsageError(f"{p}:{no}: messages must be objects with string 'role' and 'content'")
        else:
            raise UsageError(f"{p}:{no}: needs a non-empty 'prompt' string or 'messages' list")
        mt = obj.get("max_tokens", obj.get("output_tokens", default_max_tokens))
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise UsageError(f"{p}:{no}: max_tokens must be a positive integer")
        items.append((messages, mt))
    if not items:
        raise UsageError(f"{p}: dataset has no requests")
    return items


def _body(model: str, messages: list[dict[str, str]], max_tokens: int, wl: WorkloadConfig,
          exact: bool, seed: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": wl.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if wl.temperature > 0:
        body["seed"] = seed
    if exact:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    return body


def build_requests(cfg: LoadTestConfig, model: str, words_per_token: float = 1.0, overhead_tokens: int = 0,
                   pool: int = 256, nonce: str = "") -> list[RequestSpec]:
    """The request pool a process cycles through (synthetic: `pool` distinct prompts, headed by `nonce`, the
    run's, unless `workload.reuse_prompts`; prefix-cache: `workload.prefix_pool` fixed ones)."""
    assert cfg.host is not None
    ep = Endpoint.parse(cfg.host, cfg.path)
    wl = cfg.workload
    specs: list[RequestSpec] = []
    if wl.kind == "builtin":
        for i, prompt in enumerate(BUILTIN_PROMPTS):
            body = _body(model, [{"role": "user", "content": prompt}], wl.max_tokens, wl, False, wl.seed + i)
            specs.append(RequestSpec(build_request(ep, body, cfg.api_key), wl.max_tokens, None, False))
    elif wl.kind == "jsonl":
        assert wl.dataset is not None
        for i, (messages, mt) in enumerate(read_jsonl(wl.dataset, wl.max_tokens)):
            body = _body(model, messages, mt, wl, False, wl.seed + i)
            specs.append(RequestSpec(build_request(ep, body, cfg.api_key), mt, None, False))
    else:
        fixed = wl.kind == "prefix-cache" or wl.reuse_prompts or not nonce
        rng = random.Random(wl.seed if fixed else f"{wl.seed}:{nonce}")
        n_words = max(1, round((wl.input_tokens - overhead_tokens) * words_per_token))
        for i in range(min(pool, wl.prefix_pool) if wl.kind == "prefix-cache" else pool):
            prompt = synthetic_prompt(rng, n_words, i, "" if fixed else nonce)
            body = _body(model, [{"role": "user", "content": prompt}], wl.output_tokens, wl, wl.ignore_eos,
                         wl.seed + i)
            specs.append(RequestSpec(build_request(ep, body, cfg.api_key), wl.output_tokens, wl.input_tokens,
                                     wl.ignore_eos))
    return specs
