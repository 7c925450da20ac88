"""A small OpenAI-compatible client shared by every stage (gate, sweep, rollout health checks).

Speaks `/v1/models` and `/v1/chat/completions` (streaming and not), and knows the two server
flavours we care about: SGLang (`/server_info`, `/metrics` with `sglang:` series, spec-decoding
details in responses) and llama.cpp (`/props`, `/metrics` with `llamacpp:` series). Streaming
requests send `Connection: close`: llama.cpp closes the socket after each stream and a reused
connection then shows spurious disconnects.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from pipeline import metrics
from pipeline.errors import TargetError, UsageError


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
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise UsageError(f"target must be an http(s) URL, got '{base_url}'")
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0), headers=headers)
        self._model = model
        self._kind: str | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OpenAIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ discovery
    def _get(self, path: str) -> httpx.Response:
        try:
            return self._http.get(self.base_url + path)
        except httpx.HTTPError as exc:
            raise TargetError(f"cannot reach {self.base_url}{path}: {type(exc).__name__}: {exc}") from None

    def health(self) -> bool:
        """True when GET /health answers 200 (SGLang and llama.cpp both serve it once loaded)."""
        try:
            return self._http.get(self.base_url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

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
            try:
                if self._http.get(self.base_url + "/server_info").status_code == 200:
                    self._kind = "sglang"
                elif self._http.get(self.base_url + "/props").status_code == 200:
                    self._kind = "llamacpp"
            except httpx.HTTPError:
                pass
        return self._kind

    def server_info(self) -> dict[str, Any] | None:
        """SGLang's /server_info (None elsewhere)."""
        try:
            resp = self._http.get(self.base_url + "/server_info")
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        try:
            return resp.json()
        except ValueError:
            return None

    def metrics_text(self) -> str | None:
        """Prometheus text from /metrics, None when the server has none."""
        try:
            resp = self._http.get(self.base_url + "/metrics")
        except httpx.HTTPError:
            return None
        return resp.text if resp.status_code == 200 else None

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
        t0 = time.perf_counter()
        try:
            if stream:
                return self._chat_stream(url, body, t0)
            resp = self._http.post(url, json=body)
        except httpx.TimeoutException:
            raise TargetError(f"{url}: request timed out") from None
        except httpx.HTTPError as exc:
            raise TargetError(f"{url}: {type(exc).__name__}: {exc}") from None
        latency = time.perf_counter() - t0
        if resp.status_code != 200:
            raise TargetError(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}")
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
        lps: list[TokenLogprob] | None = [] if body.get("logprobs") else None
        with self._http.stream("POST", url, json=body, headers={"Connection": "close"}) as resp:
            if resp.status_code != 200:
                resp.read()
                raise TargetError(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}")
            for line in resp.iter_lines():
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
                for choice in obj.get("choices") or []:
                    delta = (choice.get("delta") or {}).get("content")
                    if delta:
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                        parts.append(delta)
                        chunks += 1
                    if lps is not None:
                        lps.extend(_extract_logprobs(choice) or [])
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
        )
