"""A small OpenAI-compatible client shared by every stage (gate, sweep, rollout health checks).

Speaks `/v1/models` and `/v1/chat/completions` (streaming and not), and knows the two server
flavours we care about: SGLang (`/server_info`, `/metrics` with `sglang:` series, spec-decoding
details in responses) and llama.cpp (`/props`, `/metrics` with `llamacpp:` series). Streaming
requests send `Connection: close`: llama.cpp closes the socket after each stream and a reused
connection then shows spurious disconnects.

Time limits (every request): `stall_s` bounds each wait for bytes (the response headers, every chunk
of a stream: a stream that goes silent mid-answer fails after `stall_s`, not after the total);
`timeout_s` bounds a whole request (checked between chunks, so a request ends within
`timeout_s + stall_s`). Both raise `TargetTimeout`, whose `kind` is `stall`, `total` or `connect`.
A target that hangs (accepts connections, never answers, or stops answering) trips the client's breaker:
after `max_timeouts_in_row` silent requests in a row (stall or connect timeouts) every further request fails
at once with `TargetHung`, so a caller with `c` requests in flight stops waiting on the target after at most
`(ceil(max_timeouts_in_row / c) + 1) * stall_s`, not one timeout per remaining request. A request over the
total limit fails (`total`) but does not count: bytes kept coming, the target is slow, not hung (measured:
docs/results/gate-under-load-2026-12-03-total-in-breaker.json, where counting them called a slow, loaded
embedded target hung).

API keys: `api_key` is sent as `Authorization: Bearer ...` and never appears in an error message (it is
masked in every server text this client quotes). A 401/403 is `UsageError` ("the target needs an API
key: ..."), bad input, exit 2: `pipeline.auth.resolve_api_key` reads keys from an environment variable or
a file, never from the command line.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from sglfleet.pipeline import metrics
from sglfleet.pipeline.errors import TargetError, UsageError

DEFAULT_STALL_S = 30.0
DEFAULT_TIMEOUTS_IN_ROW = 3


class TargetTimeout(TargetError):
    """A request ran into a time limit: `kind` is 'stall' (no bytes for stall_s), 'total' (the whole
    request over timeout_s) or 'connect'."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class TargetHung(TargetError):
    """The breaker is open: the target timed out on too many requests in a row; nothing more is sent."""


def auth_error(url: str, status: int, sent_key: bool) -> UsageError:
    """The one error for HTTP 401/403 (bad input: exit 2)."""
    if sent_key:
        return UsageError(f"the target needs an API key: {url} answered HTTP {status} to the key given "
                          "(wrong or revoked key? check the file / environment variable it came from)")
    return UsageError(f"the target needs an API key: {url} answered HTTP {status}; give it with --api-key-file "
                      "FILE or api_key_env: NAME (an environment variable), never on the command line")


@dataclass
class ChatResult:
    """One chat completion, with the timings measured on the client."""

    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    ttft_s: float | None = None
    chunks: int = 0
    raw: dict[str, Any] = field(default_factory=dict)
    spec_accept_length: float | None = None
    spec_verify_ct: int | None = None
    # per output token, when asked for (`top_logprobs=`): (token, logprob, [(alternative, logprob), ...])
    logprobs: list[TokenLogprob] | None = None
    # the token ids the server sampled, where it says them (SGLang: `return_output_ids_in_sglext`; llama.cpp: the
    # `id` of each `logprobs.content` entry, when log-probs were asked for); the text
    # re-tokenized need not be the same sequence (a sampler may emit " Or" "ter" "ol" "le" for " Or" "terol" "le")
    output_ids: list[int] | None = None

    @property
    def tokens_per_s(self) -> float | None:
        """Decode rate: output tokens over the time after the first token (whole latency if no stream)."""
        if not self.completion_tokens:
            return None
        if self.ttft_s is not None and self.completion_tokens > 1:
            return metrics.decode_tokens_per_s(self.latency_s, self.ttft_s, self.completion_tokens)
        return metrics.request_tokens_per_s(self.latency_s, self.completion_tokens)


# One output token: its bytes, its log-prob, and the most likely alternatives (bytes, log-prob). Bytes,
# not the display text: a token that is part of a multi-byte character has no text of its own.
TokenLogprob = tuple[bytes, float, list[tuple[bytes, float]]]


def _token_bytes(item: dict[str, Any]) -> bytes:
    raw = item.get("bytes")
    if isinstance(raw, list):
        return bytes(raw)
    return str(item["token"]).encode()


def _extract_logprobs(choice: dict[str, Any]) -> list[TokenLogprob] | None:
    """OpenAI `choices[].logprobs.content` (a chunk's or the whole answer's) as TokenLogprob rows;
    None when the choice carries none."""
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return None
    rows: list[TokenLogprob] = []
    for item in content:
        try:
            top = [(_token_bytes(a), float(a["logprob"])) for a in item.get("top_logprobs") or []]
            rows.append((_token_bytes(item), float(item["logprob"]), top))
        except (KeyError, TypeError, ValueError):
            raise TargetError(f"malformed logprobs entry in a chat completion: {str(item)[:120]}") from None
    return rows


def _extract_output_ids(obj: dict[str, Any]) -> list[int] | None:
    """The sampled token ids of the first choice under `sglext.output_ids` (SGLang 0.5.23: one list per choice,
    in the response or in a stream's last chunk), or None where the server says none."""
    for node in (obj, *(obj.get("choices") or [])):
        ext = node.get("sglext") if isinstance(node, dict) else None
        ids = ext.get("output_ids") if isinstance(ext, dict) else None
        if isinstance(ids, list) and ids:
            first = ids[0] if isinstance(ids[0], list) else ids
            try:
                return [int(i) for i in first]
            except (TypeError, ValueError):
                raise TargetError(f"malformed sglext.output_ids: {str(ids)[:120]}") from None
    return None


def _logprob_entries(choice: dict[str, Any]) -> list[Any]:
    content = (choice.get("logprobs") or {}).get("content")
    return content if isinstance(content, list) else []


def ids_from_logprobs(entries: list[Any], text: str, n_tokens: int | None, stopped: bool) -> list[int] | None:
    """The sampled ids from `logprobs.content` entries that name them (llama.cpp's server gives each entry an
    `id` and its `bytes`), or None, and the answer is then scored on its text, when they are not all of them:
    an entry without an int id or bytes; bytes that do not join to exactly the answer's text; or fewer entries
    than the server's completion_tokens (less the end-of-turn token of a stopped answer). llama.cpp folds the
    tokens of one multi-byte character into one entry (an emoji drawn as two tokens: one entry, the last id,
    the four bytes), so the count is the check that catches a folded entry; without a count, no ids."""
    ids: list[int] = []
    raw = bytearray()
    for e in entries:
        i, b = (e.get("id"), e.get("bytes")) if isinstance(e, dict) else (None, None)
        if isinstance(i, bool) or not isinstance(i, int) or not isinstance(b, list):
            return None
        ids.append(i)
        try:
            raw.extend(bytes(b))
        except (TypeError, ValueError):
            return None
    if not ids or bytes(raw) != text.encode("utf-8") or n_tokens is None:
        return None
    return ids if len(ids) in (n_tokens, n_tokens - 1 if stopped else n_tokens) else None


def _extract_spec(obj: dict[str, Any]) -> tuple[float | None, int | None]:
    """Per-request spec-decoding stats wherever SGLang puts them.

    SGLang 0.5.23 returns them (with ``return_spec_tokens_details: true``) under
    ``sglext.spec_tokens_details`` of the response, chunk or choice; /generate puts them in
    ``meta_info``; older builds put them beside usage.
    """
    holders: list[Any] = [obj.get("meta_info"), obj.get("usage"), obj]
    for node in (obj, *(obj.get("choices") or [])):
        if isinstance(node, dict):
            holders.append(node)
            ext = node.get("sglext")
            if isinstance(ext, dict):
                det = ext.get("spec_tokens_details")
                holders.extend(det if isinstance(det, list) else [det])
    for holder in holders:
        if not isinstance(holder, dict):
            continue
        acc = holder.get("spec_accept_length")
        ct = holder.get("spec_verify_ct")
        if acc is not None or ct is not None:
            return (float(acc) if acc is not None else None, int(ct) if ct is not None else None)
    return None, None


class OpenAIClient:
    """Client for one OpenAI-compatible endpoint, e.g. ``http://127.0.0.1:30000``."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        timeout_s: float = 120.0,
        api_key: str | None = None,
        stall_s: float | None = DEFAULT_STALL_S,
        max_timeouts_in_row: int | None = DEFAULT_TIMEOUTS_IN_ROW,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise UsageError(f"target must be an http(s) URL, got '{base_url}'")
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._key = api_key or None
        self.timeout_s = timeout_s
        self.stall_s = min(stall_s, timeout_s) if stall_s else timeout_s
        self.max_timeouts_in_row = max_timeouts_in_row
        # httpx's read/write/pool timeouts apply to each network operation: the stall limit
        self._http = httpx.Client(timeout=httpx.Timeout(self.stall_s, connect=min(5.0, self.stall_s)), headers=headers)
        self._model = model
        self._kind: str | None = None
        self._lock = threading.Lock()
        self._timeouts_in_row = 0
        self.hung: str | None = None  # why the breaker opened (None: closed)

    # ------------------------------------------------------------------ time limits, breaker, secrets
    def _mask(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    def _check_breaker(self) -> None:
        if self.hung is not None:
            raise TargetHung(self.hung)

    def _timed_out(self, exc: TargetTimeout) -> TargetTimeout:
        with self._lock:
            self._timeouts_in_row += 1
            k = self.max_timeouts_in_row
            if k and self._timeouts_in_row >= k and self.hung is None:
                self.hung = (f"target hung: {self._timeouts_in_row} requests in a row timed out (last: {exc}); "
                             "no further request sent")
        return exc

    def _answered(self) -> None:
        with self._lock:
            self._timeouts_in_row = 0

    def _timeout(self, url: str, exc: httpx.TimeoutException, chunks: int | None = None) -> TargetTimeout:
        if isinstance(exc, httpx.ConnectTimeout):
            return self._timed_out(TargetTimeout(f"{url}: connect timed out", "connect"))
        where = (f"mid-stream after {chunks} content chunks" if chunks else
                 "before the first byte of the answer" if chunks is None else "before the first content chunk")
        return self._timed_out(TargetTimeout(f"{url}: stalled: no data for {self.stall_s:g}s {where} "
                                             "(request_stall_s)", "stall"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OpenAIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ discovery
    def _get(self, path: str) -> httpx.Response:
        """GET with the time limits and the breaker; TargetError when it fails, UsageError on 401/403."""
        self._check_breaker()
        url = self.base_url + path
        try:
            resp = self._http.get(url)
        except httpx.TimeoutException as exc:
            raise self._timeout(url, exc) from None
        except httpx.HTTPError as exc:
            raise TargetError(self._mask(f"cannot reach {url}: {type(exc).__name__}: {exc}")) from None
        self._answered()
        if resp.status_code in (401, 403):
            raise auth_error(url, resp.status_code, self._key is not None)
        return resp

    def _try_get(self, path: str) -> httpx.Response | None:
        """_get for the optional probes: None instead of an error (a 401 still raises)."""
        try:
            return self._get(path)
        except TargetError:
            return None

    def health(self) -> bool:
        """True when GET /health answers 200 (SGLang and llama.cpp both serve it once loaded)."""
        try:
            resp = self._try_get("/health")
        except UsageError:
            return False
        return resp is not None and resp.status_code == 200

    def list_models(self) -> list[str]:
        """Model ids from /v1/models; TargetError if the answer is not an OpenAI model list."""
        resp = self._get("/v1/models")
        if resp.status_code != 200:
            raise TargetError(f"{self.base_url}/v1/models answered HTTP {resp.status_code}: not OpenAI-compatible")
        try:
            data = resp.json()
            ids = [str(m["id"]) for m in data["data"]]
        except (ValueError, KeyError, TypeError):
            raise TargetError(f"{self.base_url}/v1/models did not return an OpenAI model list") from None
        return ids

    @property
    def model(self) -> str:
        """The model name: as given, else the first (only) one the server lists."""
        if self._model is None:
            ids = self.list_models()
            if not ids:
                raise TargetError(f"{self.base_url}/v1/models lists no models")
            self._model = ids[0]
        return self._model

    def server_kind(self) -> str:
        """'sglang', 'llamacpp' or 'openai' (anything else that answers /v1/models)."""
        if self._kind is None:
            self._kind = "openai"
            if (r := self._try_get("/server_info")) is not None and r.status_code == 200:
                self._kind = "sglang"
            elif (r := self._try_get("/props")) is not None and r.status_code == 200:
                self._kind = "llamacpp"
        return self._kind

    def server_info(self) -> dict[str, Any] | None:
        """SGLang's /server_info (None elsewhere)."""
        resp = self._try_get("/server_info")
        if resp is None or resp.status_code != 200:
            return None
        try:
            return resp.json()
        except ValueError:
            return None

    def props(self) -> dict[str, Any] | None:
        """llama.cpp's /props (None elsewhere)."""
        resp = self._try_get("/props")
        if resp is None or resp.status_code != 200:
            return None
        try:
            got = resp.json()
        except ValueError:
            return None
        return got if isinstance(got, dict) else None

    def metrics_text(self) -> str | None:
        """Prometheus text from /metrics, None when the server has none."""
        resp = self._try_get("/metrics")
        return resp.text if resp is not None and resp.status_code == 200 else None

    # ------------------------------------------------------------------ generation
    def chat(
        self,
        messages: list[dict[str, str]] | str,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stream: bool = True,
        extra: dict[str, Any] | None = None,
        top_logprobs: int | None = None,
    ) -> ChatResult:
        """One chat completion. Streams by default so TTFT is measured. `top_logprobs=n` asks for each
        output token's log-prob and its n most likely alternatives (ChatResult.logprobs)."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": stream,
        }
        if top_p is not None:
            body["top_p"] = top_p
        if top_k is not None:
            body["top_k"] = top_k
        if seed is not None:
            body["seed"] = seed
        if stream:
            body["stream_options"] = {"include_usage": True}
        if top_logprobs is not None:
            body["logprobs"] = True
            body["top_logprobs"] = top_logprobs
        if extra:
            body.update(extra)
        url = self.base_url + "/v1/chat/completions"
        self._check_breaker()
        t0 = time.perf_counter()
        try:
            if stream:
                result = self._chat_stream(url, body, t0)
                self._answered()
                return result
            resp = self._http.post(url, json=body)
        except httpx.TimeoutException as exc:
            raise self._timeout(url, exc) from None
        except httpx.HTTPError as exc:
            raise TargetError(self._mask(f"{url}: {type(exc).__name__}: {exc}")) from None
        latency = time.perf_counter() - t0
        self._answered()
        if latency > self.timeout_s:  # slow, not hung: it answered (the breaker counts silent requests only)
            raise TargetTimeout(f"{url}: request took {latency:.1f}s, over the total limit {self.timeout_s:g}s "
                                "(request_timeout_s)", "total")
        if resp.status_code in (401, 403):
            raise auth_error(url, resp.status_code, self._key is not None)
        if resp.status_code != 200:
            raise TargetError(self._mask(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}"))
        try:
            data = resp.json()
            choice = data["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise TargetError(f"{url}: response is not an OpenAI chat completion") from None
        usage = data.get("usage") or {}
        acc, ct = _extract_spec(data)
        return ChatResult(
            text=(choice.get("message") or {}).get("content") or "",
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            latency_s=latency,
            raw=data,
            spec_accept_length=acc,
            spec_verify_ct=ct,
            logprobs=_extract_logprobs(choice) if top_logprobs is not None else None,
            output_ids=_extract_output_ids(data) or ids_from_logprobs(
                _logprob_entries(choice), (choice.get("message") or {}).get("content") or "",
                usage.get("completion_tokens"), choice.get("finish_reason") == "stop"),
        )

    def _chat_stream(self, url: str, body: dict[str, Any], t0: float) -> ChatResult:
        parts: list[str] = []
        finish: str | None = None
        usage: dict[str, Any] = {}
        ttft: float | None = None
        chunks = 0
        done = False
        last: dict[str, Any] = {}
        acc = ct = None
        out_ids: list[int] | None = None
        lps: list[TokenLogprob] | None = [] if body.get("logprobs") else None
        lp_entries: list[Any] = []  # the raw entries, for the ids a server names in them (llama.cpp)
        deadline = t0 + self.timeout_s
        with self._http.stream("POST", url, json=body, headers={"Connection": "close"}) as resp:
            if resp.status_code in (401, 403):
                raise auth_error(url, resp.status_code, self._key is not None)
            if resp.status_code != 200:
                try:
                    resp.read()
                except httpx.TimeoutException as exc:
                    raise self._timeout(url, exc) from None
                raise TargetError(self._mask(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}"))
            lines = resp.iter_lines()
            while True:
                try:
                    line = next(lines)
                except StopIteration:
                    break
                except httpx.TimeoutException as exc:
                    raise self._timeout(url, exc, chunks) from None
                if time.perf_counter() > deadline:  # slow, not hung: bytes keep coming (no breaker count)
                    self._answered()
                    raise TargetTimeout(f"{url}: request over the total limit {self.timeout_s:g}s "
                                        f"(request_timeout_s) after {chunks} content chunks", "total")
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    obj = json.loads(payload)
                except ValueError:
                    raise TargetError(f"{url}: malformed stream chunk: {payload[:120]!r}") from None
                last = obj
                if obj.get("usage"):
                    usage = obj["usage"]
                a, c = _extract_spec(obj)
                if a is not None or c is not None:
                    acc, ct = a, c
                out_ids = _extract_output_ids(obj) or out_ids
                for choice in obj.get("choices") or []:
                    delta = (choice.get("delta") or {}).get("content")
                    if delta:
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                        parts.append(delta)
                        chunks += 1
                    if lps is not None:
                        lps.extend(_extract_logprobs(choice) or [])
                        lp_entries.extend(_logprob_entries(choice))
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
        latency = time.perf_counter() - t0
        if not done:
            raise TargetError(f"{url}: stream ended before [DONE]")
        text = "".join(parts)
        return ChatResult(
            text=text,
            finish_reason=finish,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            latency_s=latency,
            ttft_s=ttft,
            chunks=chunks,
            raw={"last_chunk": last, "usage": usage},
            spec_accept_length=acc,
            spec_verify_ct=ct,
            logprobs=lps,
            output_ids=out_ids or (ids_from_logprobs(lp_entries, text, usage.get("completion_tokens"),
                                                     finish == "stop") if lp_entries else None),
        )
