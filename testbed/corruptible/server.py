"""The corruptible engine over HTTP: the OpenAI routes the gate uses, as llama.cpp's server answers them.

Routes: `GET /health`, `GET /v1/models`, `GET /props` (llama.cpp's, so the gate reads this server as a
llama.cpp-style one), `POST /v1/chat/completions` (stream with SSE chunks and `[DONE]`, or one JSON body;
temperature, top_p, top_k, seed, max_tokens / max_completion_tokens, stream_options.include_usage, logprobs
+ top_logprobs, continue_final_message for an open assistant prefix as sglang's). Every response carries
llama.cpp's `timings` (prompt_n, predicted_n, and for the speculative engine draft_n / draft_n_accepted,
from which the gate derives the accept length); in a stream they ride the last chunk before [DONE].
Concurrent requests share the engine's running batch (engine.py); a bad request gets HTTP 400 with an OpenAI
error body.

    with CorruptibleServer(fault="mask_width", budget=11) as url: ...   # child process on a free port
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sglfleet.pipeline.procs import free_port
from testbed import REPO_ROOT
from testbed.childserver import ChildServer
from testbed.corruptible.engine import Engine, EngineConfig, Generation, Request, TokenOut

REPO = REPO_ROOT
MAX_TOP_LOGPROBS = 20


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400."""


def _number(body: dict[str, Any], key: str, default: float | None, lo: float, hi: float,
            integer: bool = False) -> Any:
    v = body.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or (integer and not isinstance(v, int)):
        raise BadRequest(f"{key} must be {'an integer' if integer else 'a number'}, not {v!r}")
    if not lo <= v <= hi:
        raise BadRequest(f"{key} must be within [{lo:g}, {hi:g}], got {v!r}")
    return v


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages must be a non-empty list")
    out = []
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise BadRequest("every message needs a role of system, user or assistant")
        c = m.get("content")
        if isinstance(c, list):  # content parts: the text ones, joined
            c = "".join(p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(c, str):
            raise BadRequest("message content must be a string")
        out.append({"role": m["role"], "content": c})
    return out


def parse_chat(body: Any, engine: Engine) -> tuple[Request, dict[str, Any]]:
    """A chat completion body as an engine Request, plus the response options; BadRequest when malformed."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is served")
    msgs = _messages(body)
    cont = bool(body.get("continue_final_message"))
    if cont and msgs[-1]["role"] != "assistant":
        raise BadRequest("continue_final_message needs the last message to be the assistant's")
    try:
        ids = engine.encode(engine.render(msgs, continue_final=cont))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    room = engine.cfg.n_ctx - len(ids)
    if room < 1:
        raise BadRequest(f"prompt of {len(ids)} tokens leaves no room in the context of {engine.cfg.n_ctx}")
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _number({"max_tokens": mt}, "max_tokens", min(256, room), 1, room, integer=True)
    temperature = _number(body, "temperature", 1.0, 0.0, 5.0)
    top_p = _number(body, "top_p", None, 1e-9, 1.0)
    top_k = _number(body, "top_k", None, -1, 1 << 31, integer=True)
    min_p = _number(body, "min_p", None, 0.0, 1.0)
    seed = _number(body, "seed", None, -(1 << 63), (1 << 64) - 1, integer=True)
    want = None
    if body.get("logprobs"):
        want = _number(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS, integer=True)
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(x, str) and x for x in stop):
        raise BadRequest("stop must be a non-empty string or a list of at most 4 non-empty strings")
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise BadRequest("stream_options must be an object")
    req = Request(ids, int(max_tokens), float(temperature), float(top_p) if top_p is not None else None,
                  int(top_k) if top_k and top_k > 0 else None, int(seed) % (1 << 64) if seed is not None else None,
                  want, float(min_p) if min_p else None, tuple(stop))
    return req, {"stream": bool(body.get("stream")), "include_usage": bool(so.get("include_usage")),
                 "model": engine.cfg.alias}


class TextStream:
    """Token ids -> text deltas; a partial UTF-8 character is held back until it completes, and so is a tail that
    may be the start of a stop string (a stop string is never sent: the engine's `stop_at` cuts the text)."""

    def __init__(self, engine: Engine, stop: tuple[str, ...] = ()) -> None:
        self.engine = engine
        self.stop = stop
        self.ids: list[int] = []
        self.sent = ""

    def _held(self, text: str) -> int:
        """The length of the longest tail of `text` that begins a stop string."""
        return max((k for s in self.stop for k in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:k])), default=0)

    def push(self, toks: list[int], final: bool = False, cut: int | None = None) -> str:
        self.ids.extend(toks)
        text = self.engine.decode(self.ids)
        if cut is not None:
            text = text[:cut]
        elif not final and text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")
        if not final and cut is None and self.stop:  # up to a complete stop string, less a tail that may begin one
            hits = [h for h in (text.find(x) for x in self.stop) if h >= 0]
            text = text[:min(hits)] if hits else text[:len(text) - self._held(text)]
        if not text.startswith(self.sent):  # a held-back character resolved differently: send the rest
            text = self.sent + text[len(self.sent):]
        delta, self.sent = text[len(self.sent):], text
        return delta


def _logprobs(engine: Engine, toks: list[TokenOut]) -> dict[str, Any]:
    def entry(i: int, lp: float) -> dict[str, Any]:
        b = engine.token_bytes(i)
        # llama.cpp's entry shape, id included: the gate keeps the sampled ids from it (pipeline.client)
        return {"id": int(i), "token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}

    return {"content": [{**entry(t.token, t.logprob if t.logprob is not None else 0.0),
                         "top_logprobs": [entry(i, lp) for i, lp in t.top]} for t in toks]}


def _usage(gen: Generation) -> dict[str, int]:
    return {"prompt_tokens": gen.prompt_tokens, "completion_tokens": len(gen.tokens),
            "total_tokens": gen.prompt_tokens + len(gen.tokens)}


def make_handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    spec = engine.cfg.speculative

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _json(self, code: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        def _error(self, code: int, msg: str) -> None:
            self._json(code, {"error": {"message": msg, "type": "invalid_request_error", "code": code}})

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._json(200, {"status": "ok"})
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": engine.cfg.alias, "object": "model",
                                                             "owned_by": "testbed.corruptible"}]})
            elif path == "/props":
                c = engine.cfg
                self._json(200, {"model_alias": c.alias, "total_slots": 1, "engine": "testbed.corruptible",
                                 "speculative": c.speculative, "budget": c.budget if spec else None,
                                 "topk": c.topk if spec else None, "verify_width": c.verify_width,
                                 "fault": c.fault, "n_ctx": c.n_ctx,
                                 # the order its sampler applies these (llama.cpp's /props names its chain so)
                                 "default_generation_settings": {"params": {
                                     "samplers": ["temperature", "top_k", "top_p", "min_p"]}}})
            else:
                self._error(404, f"no route {path}")

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path != "/v1/chat/completions":
                self._error(404, f"no route {path}")
                return
            try:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"null")
            except (ValueError, OSError):
                self._error(400, "the body is not JSON")
                return
            try:
                req, opts = parse_chat(body, engine)
            except BadRequest as exc:
                self._error(400, str(exc))
                return
            rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
            if opts["stream"]:
                self._stream(req, opts, rid)
            else:
                self._whole(req, opts, rid)

        def _whole(self, req: Request, opts: dict[str, Any], rid: str) -> None:
            try:
                gen = engine.generate(req)
            except ValueError as exc:
                self._error(400, str(exc))
                return
            ts = TextStream(engine, req.stop)
            text = ts.push([t.token for t in gen.tokens], final=True, cut=gen.stop_at)
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": gen.finish_reason,
                                      "logprobs": _logprobs(engine, gen.tokens) if req.logprobs is not None else None}
            self._json(200, {"id": rid, "object": "chat.completion", "created": int(time.time()),
                             "model": opts["model"], "choices": [choice], "usage": _usage(gen),
                             "timings": gen.timings(spec)})

        def _stream(self, req: Request, opts: dict[str, Any], rid: str) -> None:
            created = int(time.time())
            base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": opts["model"]}

            def send(obj: dict[str, Any] | str) -> None:
                data = obj if isinstance(obj, str) else json.dumps(obj)
                self.wfile.write(b"data: " + data.encode() + b"\n\n")
                self.wfile.flush()

            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            ts = TextStream(engine, req.stop)
            send({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                       "finish_reason": None}]})

            def on_tokens(toks: list[TokenOut]) -> None:
                delta = ts.push([t.token for t in toks])
                ch: dict[str, Any] = {"index": 0, "delta": {"content": delta}, "finish_reason": None}
                if req.logprobs is not None:
                    ch["logprobs"] = _logprobs(engine, toks)
                send({**base, "choices": [ch]})

            try:
                gen = engine.generate(req, on_tokens)
                tail = ts.push([], final=True, cut=gen.stop_at)
                timings = gen.timings(spec)
                if tail:
                    send({**base, "choices": [{"index": 0, "delta": {"content": tail}, "finish_reason": None}]})
                send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": gen.finish_reason}],
                      "timings": timings})
                if opts["include_usage"]:
                    send({**base, "choices": [], "usage": _usage(gen), "timings": timings})
                send("[DONE]")
            except (BrokenPipeError, ConnectionError):
                return
            except ValueError as exc:  # a request that does not fit: an error event, then the end
                send({"error": {"message": str(exc), "type": "invalid_request_error", "code": 400}})
                send("[DONE]")

    return Handler


def serve(cfg: EngineConfig, host: str, port: int) -> None:
    """Load the engine and serve until SIGINT / SIGTERM."""
    import signal
    import threading

    engine = Engine(cfg)
    httpd = ThreadingHTTPServer((host, port), make_handler(engine))
    httpd.daemon_threads = True
    # serve_forever runs in this thread: shutdown() has to come from another one
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown, daemon=True).start())
    what = "target-only" if not cfg.speculative else (f"speculative budget {cfg.budget} top-k {cfg.topk}, fault "
                                                      f"{cfg.fault or 'none'}")
    print(f"corruptible engine ({what}) listening on http://{host}:{port} (model {cfg.alias})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        httpd.serve_forever()
    httpd.server_close()


class CorruptibleServer(ChildServer):
    """The engine in a child process on a free port (testbed/childserver.py), ready once /health answers:

        with CorruptibleServer(fault="stale_kv") as url: ...        # speculative, one fault
        with CorruptibleServer(speculative=False) as url: ...      # the target-only baseline
    """

    label = "corruptible engine"

    def __init__(self, *, fault: str | None = None, budget: int | None = None, topk: int | None = None,
                 speculative: bool = True, port: int | None = None, threads: int = 1,
                 ready_timeout_s: float = 180.0, log_path: str | Path | None = None) -> None:
        self.args = ["--threads", str(threads)]
        if not speculative:
            self.args.append("--target-only")
        for flag, v in (("--fault", fault), ("--budget", budget), ("--topk", topk)):
            if v is not None:
                self.args += [flag, str(v)]
        super().__init__(port or free_port(), Path(log_path) if log_path else
                         Path(tempfile.mkstemp(prefix="corruptible-", suffix=".log")[1]))
        self.ready_timeout_s = ready_timeout_s
        self.poll_s = 0.2

    def command(self) -> list[str]:
        return [sys.executable, "-m", "testbed.corruptible", "serve", "--port", str(self.port), *self.args]

    def exit_message(self, rc: int) -> str:
        tail = self.log_path.read_text(errors="replace")[-800:] if self.log_path else ""
        return f"corruptible engine exited at start; log {self.log_path}: {tail}"

    def __enter__(self) -> str:  # type: ignore[override]  # the URL, as the bench and tests use it
        return self.start().url
