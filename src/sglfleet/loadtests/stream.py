"""A minimal, cheap HTTP/1.1 client for one streamed OpenAI chat completion, with exact timings.

It speaks raw sockets so that the harness costs as little CPU per token as possible and every
timestamp is taken right where bytes come off the socket (no client-library buffering in between).
Inside Locust the socket module is gevent's (cooperative); outside it the same code blocks normally,
which is how the CLI's preflight check and the precision tests use it.

Per request it measures TTFT, every inter-token gap (ITL; one gap per streamed content chunk, so a
chunk carrying several tokens counts once, as in `sglang.bench_serving`), end-to-end latency and the
output token count (the server's `usage.completion_tokens` when sent, else the number of content
chunks). Failures are classified into a small fixed set of error classes.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sglfleet.pipeline import metrics
from sglfleet.pipeline.errors import UsageError

try:  # orjson parses a small chunk several times faster than json; the harness's hot path
    from orjson import JSONDecodeError as _JSONError
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a pinned dependency
    _JSONError = ValueError  # type: ignore[assignment,misc]
    _loads = json.loads  # type: ignore[assignment]

# Error classes: the only values `StreamResult.error` takes besides None (plus "http_<status>").
ERR_CONNECT = "connect_error"
ERR_TIMEOUT = "timeout"  # the whole request over its total limit (or the connect timed out)
ERR_STALL = "stall"  # no bytes for `stall_s` (before the answer or mid-stream): a target that stopped answering
ERR_CUT = "stream_cut"  # connection closed before `data: [DONE]`
ERR_MALFORMED = "malformed_chunk"  # a `data:` line that is not JSON / not a chat chunk
ERR_EMPTY = "empty_output"  # [DONE] without any content
ERR_NOT_STREAMING = "not_streaming"  # HTTP 200 but not text/event-stream
ERROR_CLASSES = (ERR_CONNECT, ERR_TIMEOUT, ERR_STALL, ERR_CUT, ERR_MALFORMED, ERR_EMPTY, ERR_NOT_STREAMING,
                 "http_<status>")


@dataclass(frozen=True)
class Endpoint:
    """Where to send chat completions: parsed once from the base URL."""

    scheme: str
    host: str
    port: int
    path: str
    host_header: str

    @classmethod
    def parse(cls, base_url: str, path: str = "/v1/chat/completions") -> Endpoint:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"host must be an http(s) URL like http://127.0.0.1:30000, got '{base_url}'")
        base_path = parts.path.rstrip("/")
        if base_path.endswith("/v1") and path.startswith("/v1/"):
            base_path = base_path[:-3]
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise UsageError(f"host has an invalid port: '{base_url}'") from None
        return cls(parts.scheme, parts.hostname, port, base_path + path, parts.netloc)


@dataclass
class StreamResult:
    """One streamed request as seen by the client. Times in seconds (perf_counter based)."""

    ok: bool = False
    error: str | None = None
    detail: str = ""
    status: int = 0
    ttft: float | None = None
    t_headers: float | None = None  # time to the response headers (queueing + connection, before any token)
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    chunks: int = 0
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    text_chars: int = 0
    t_start: float = 0.0  # wall clock (time.time) at send

    @property
    def output_tokens(self) -> int:
        """Server-reported completion tokens when given, else the streamed content chunks."""
        return self.usage_tokens if self.usage_tokens is not None else self.chunks

    @property
    def tpot(self) -> float | None:
        """TPOT (pipeline.metrics): (E2E - TTFT) / (tokens - 1); None for fewer than two tokens."""
        return metrics.tpot(self.e2e, self.ttft, self.output_tokens)

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Decode rate after the first token (pipeline.metrics)."""
        return metrics.decode_tokens_per_s(self.e2e, self.ttft, self.output_tokens) if self.ok else None

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens over the end-to-end time of the request (pipeline.metrics request tok/s)."""
        return metrics.request_tokens_per_s(self.e2e, self.output_tokens) if self.ok else None


def build_request(ep: Endpoint, body: dict[str, Any], api_key: str | None = None) -> bytes:
    """The raw HTTP/1.1 request bytes (with `Connection: close`: llama.cpp closes after each stream)."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    head = (
        f"POST {ep.path} HTTP/1.1\r\nHost: {ep.host_header}\r\nUser-Agent: loadtests\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n"
        f"{auth}Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


class _Chunked:
    """Incremental decoder for `Transfer-Encoding: chunked` (positional: no per-chunk buffer copies)."""

    __slots__ = ("buf", "done", "remaining", "state")

    def __init__(self) -> None:
        self.buf = b""
        self.remaining = 0
        self.state = 0  # 0 size line, 1 data, 2 CRLF after data
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf = self.buf + data if self.buf else data
        n = len(buf)
        pos = 0
        out: list[bytes] = []
        if self.state == 1:  # finish a chunk begun in an earlier read
            take = min(self.remaining, n)
            out.append(buf[:take])
            pos = take
            self.remaining -= take
            if self.remaining:
                self.buf = b""
                return out[0]
            self.state = 2
        if self.state == 2:
            if n - pos < 2:
                self.buf = buf[pos:]
                return b"".join(out)
            pos += 2
            self.state = 0
        find = buf.find
        while pos < n:  # state 0: one iteration per whole chunk
            i = find(b"\r\n", pos)
            if i < 0:
                break
            try:
                size = int(buf[pos:i], 16)
            except ValueError:
                size = int(buf[pos:i].split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                self.done = True
                pos = n
                break
            start = i + 2
            end = start + size
            if end + 2 <= n:
                out.append(buf[start:end])
                pos = end + 2
                continue
            take = min(size, n - start)  # a partial chunk: keep its state
            out.append(buf[start : start + take])
            self.remaining = size - take
            pos = start + take
            self.state = 1 if self.remaining else 2
            if self.state == 2 and n - pos >= 2:
                pos += 2
                self.state = 0
                continue
            break
        self.buf = buf[pos:] if pos < n and self.state == 0 else (buf[pos:] if self.state == 2 else b"")
        return out[0] if len(out) == 1 else b"".join(out)


def stream_chat(
    ep: Endpoint,
    request: bytes,
    timeout_s: float = 120.0,
    connect_timeout_s: float = 10.0,
    stall_s: float | None = None,
) -> StreamResult:
    """Send one prepared streaming request and read the SSE stream to the end.

    `timeout_s` bounds the whole request (`timeout`), `stall_s` every wait for the next bytes (`stall`:
    the headers, or a stream gone silent mid-answer). Never raises for target-side problems: they become
    `StreamResult.error` classes.
    """
    res = StreamResult(t_start=time.time())
    perf = time.perf_counter
    t0 = perf()
    deadline = t0 + timeout_s
    try:
        sock = socket.create_connection((ep.host, ep.port), timeout=min(connect_timeout_s, timeout_s))
    except TimeoutError:
        res.error, res.detail, res.e2e = ERR_TIMEOUT, "connect timed out", perf() - t0
        return res
    except OSError as exc:
        res.error, res.detail, res.e2e = ERR_CONNECT, f"{type(exc).__name__}: {exc}", perf() - t0
        return res
    try:
        if ep.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=ep.host)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stall = min(stall_s, timeout_s) if stall_s else timeout_s
        sock.settimeout(stall)
        t0 = perf()  # TTFT/E2E start when the request is sent (connect excluded, as in bench_serving)
        deadline = t0 + timeout_s
        sock.sendall(request)
        _read_stream(sock, res, t0, deadline, stall)
    except TimeoutError:
        if stall >= timeout_s or perf() >= deadline - 1e-3:
            res.error, res.detail = ERR_TIMEOUT, f"not finished within {timeout_s:g}s"
        else:
            where = f"mid-stream after {res.chunks} content chunks" if res.chunks else "before the first content"
            res.error, res.detail = ERR_STALL, f"no data for {stall:g}s {where}"
    except OSError as exc:
        res.error = res.error or ERR_CUT
        res.detail = f"{type(exc).__name__}: {exc}"
    finally:
        res.e2e = res.e2e or (perf() - t0)
        sock.close()
    return res


def _read_stream(sock: socket.socket, res: StreamResult, t0: float, deadline: float, stall: float) -> None:
    perf = time.perf_counter
    recv = sock.recv
    head = b""
    while b"\r\n\r\n" not in head:
        data = recv(65536)
        if not data:
            res.error, res.detail = ERR_CUT, "connection closed before the response headers"
            return
        head += data
        res.t_headers = perf() - t0
        if len(head) > 65536:
            res.error, res.detail = ERR_MALFORMED, "response headers too large"
            return
    raw_head, _, rest = head.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    try:
        res.status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        res.error, res.detail = ERR_MALFORMED, f"bad status line {lines[0][:80]!r}"
        return
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length = int(headers["content-length"]) if "content-length" in headers and not chunked else None
    decoder = _Chunked() if chunked else None

    if res.status != 200:
        body = rest
        while len(body) < 2048:
            try:
                data = recv(65536)
            except OSError:
                break
            if not data:
                break
            body += data
        text = (decoder.feed(body) if decoder else body)[:300].decode("utf-8", "replace")
        res.error, res.detail = f"http_{res.status}", text
        res.e2e = perf() - t0
        return
    ctype = headers.get("content-type", "")
    if "text/event-stream" not in ctype:
        res.error, res.detail = ERR_NOT_STREAMING, f"HTTP 200 with content-type '{ctype}', not an SSE stream"
        res.e2e = perf() - t0
        return

    pending = b""
    received = 0
    now = t0 + (res.t_headers or 0.0)  # bytes that came with the headers arrived then
    data = rest
    last = 0.0
    itl = res.itl
    loads = _loads
    while True:
        if data:
            received += len(data)
            body = decoder.feed(data) if decoder else data
            if body:
                pending += body
                if b"\n" in pending:
                    *complete, pending = pending.split(b"\n")
                    for event in complete:
                        if not event.startswith(b"data:"):
                            continue
                        payload = event[5:].strip()
                        if payload == b"[DONE]":
                            res.e2e = now - t0
                            res.ok = res.chunks > 0
                            if not res.ok:
                                res.error, res.detail = ERR_EMPTY, "stream finished without any content"
                            return
                        try:
                            obj = loads(payload)
                            choices = obj.get("choices") or ()
                            usage = obj.get("usage")
                        except (_JSONError, ValueError, AttributeError):
                            res.error, res.detail = ERR_MALFORMED, f"bad chunk {payload[:120]!r}"
                            res.e2e = now - t0
                            return
                        if usage:
                            res.usage_tokens = usage.get("completion_tokens")
                            res.prompt_tokens = usage.get("prompt_tokens")
                        for choice in choices:
                            try:
                                content = choice["delta"].get("content")
                            except (KeyError, TypeError, AttributeError):
                                res.error, res.detail = ERR_MALFORMED, f"chunk without delta {payload[:120]!r}"
                                res.e2e = now - t0
                                return
                            if content:
                                if res.chunks == 0:
                                    res.ttft = now - t0
                                else:  # ITL as defined in pipeline.metrics.inter_token_gaps
                                    itl.append(now - last)
                                last = now
                                res.chunks += 1
                                res.text_chars += len(content)
                            fr = choice.get("finish_reason")
                            if fr:
                                res.finish_reason = fr
            if (decoder is not None and decoder.done) or (length is not None and received >= length):
                break
        if now > deadline:
            raise TimeoutError
        sock.settimeout(max(0.001, min(stall, deadline - now)))
        data = recv(65536)
        now = perf()
        if not data:
            break
    res.e2e = now - t0
    res.error, res.detail = ERR_CUT, f"stream ended before [DONE] after {res.chunks} content chunks"


def get_json(base_url: str, path: str, timeout_s: float = 10.0, api_key: str | None = None) -> tuple[int, Any]:
    """GET base_url+path over a plain socket; (status, parsed JSON or None). Raises OSError when unreachable."""
    ep = Endpoint.parse(base_url, path)
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    req = (f"GET {ep.path} HTTP/1.1\r\nHost: {ep.host_header}\r\nAccept: application/json\r\n{auth}"
           "Connection: close\r\n\r\n")
    sock = socket.create_connection((ep.host, ep.port), timeout=timeout_s)
    try:
        if ep.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=ep.host)
        sock.sendall(req.encode())
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) > 8 << 20:
                break
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0, None
    if b"chunked" in head.lower():
        body = _Chunked().feed(body)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None
