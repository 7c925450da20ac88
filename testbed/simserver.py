"""A local OpenAI-compatible streaming server with known timings, for harness tests and benchmarks.

It emits `--tokens` content chunks per request: the first after `--ttft-ms`, then one every
`--itl-ms` (a comma list cycles through several gaps). `--slots K` serves at most K streams at once
and queues the rest, so latency grows with concurrency and the capacity knee sits at K users.
With zero delays the whole stream is written at once from a cached buffer, which makes it a cheap
endpoint for measuring the client's own ceiling. Each request's actual send instants
(time.perf_counter, the same monotonic clock as the client's on Linux) are kept and served at
`GET /_timings`, so tests compare the client's TTFT/ITL against what the server really did.

`--mode` picks misbehaviour for bad-input tests: `json` (answers stream requests with a plain JSON
body), or `mixed` (cycles ok, HTTP 503, stream cut before [DONE], malformed chunk, empty output, stall).
Time-limit tests: `--stall-after N --stall-s S` goes silent for S seconds after the N-th content chunk
of every stream (then finishes it); `--hang-after K` answers the first K chat requests and then hangs
every request on any path (reads it, never answers: a target that stopped answering; K=0 hangs at once).
`--api-key KEY` answers 401 to any request without `Authorization: Bearer KEY`.

    python -m testbed.simserver --port 18500 --ttft-ms 20 --itl-ms 5 --tokens 32 [--slots 4] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import socket
import sys
import time
from typing import Any

from testbed.childserver import ChildServer

MIXED = ("ok", "http_503", "cut", "malformed", "empty", "stall")


class Sim:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ttft = args.ttft_ms / 1000.0
        self.itls = [float(x) / 1000.0 for x in str(args.itl_ms).split(",")]
        self.slots = asyncio.Semaphore(args.slots) if args.slots else None
        self.timings: list[dict[str, Any]] = []
        self.counter = itertools.count()
        self.cache: dict[tuple[int, bool], bytes] = {}
        self.chats = 0  # chat requests answered (--hang-after)

    # ---------------------------------------------------------------- wire format
    def _chunk(self, payload: bytes) -> bytes:
        if self.args.chunked:
            return b"%x\r\n%s\r\n" % (len(payload), payload)
        return payload

    def _event(self, obj: dict[str, Any] | str) -> bytes:
        data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
        return self._chunk(b"data: " + data.encode() + b"\n\n")

    def _head(self, status: str = "200 OK", ctype: str = "text/event-stream") -> bytes:
        te = "Transfer-Encoding: chunked\r\n" if self.args.chunked else ""
        return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nCache-Control: no-cache\r\n{te}"
                "Connection: close\r\n\r\n").encode()

    def _token(self, rid: str, i: int) -> bytes:
        return self._event({"id": rid, "object": "chat.completion.chunk", "model": "sim",
                            "choices": [{"index": 0, "delta": {"content": f" tok{i}"}, "finish_reason": None}]})

    def _tail(self, rid: str, n: int, usage: bool) -> bytes:
        out = self._event({"id": rid, "object": "chat.completion.chunk", "model": "sim",
                           "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if usage:
            out += self._event({"id": rid, "object": "chat.completion.chunk", "model": "sim", "choices": [],
                                "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}})
        out += self._event("[DONE]")
        if self.args.chunked:
            out += b"0\r\n\r\n"
        return out

    # ---------------------------------------------------------------- requests
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            t_recv = time.perf_counter()
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            length = 0
            auth = ""
            for line in lines[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
                if line.lower().startswith("authorization:"):
                    auth = line.split(":", 1)[1].strip()
            body = await reader.readexactly(length) if length else b""
            if length:
                t_recv = time.perf_counter()
            if self.args.hang_after is not None and self.chats >= self.args.hang_after and path != "/_timings":
                await asyncio.sleep(3600)  # a hung target: the request was read, no answer ever comes
                return
            if self.args.api_key and auth != f"Bearer {self.args.api_key}" and path != "/_timings":
                data = b'{"error":{"message":"Invalid API Key","type":"authentication_error"}}'
                writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(data), data))
                return
            if method == "POST" and path == "/v1/chat/completions":
                self.chats += 1
            if method == "GET" and path == "/v1/models":
                await self._json(writer, {"object": "list", "data": [{"id": "sim", "object": "model"}]})
            elif method == "GET" and path == "/_timings":
                await self._json(writer, self.timings)
            elif method == "POST" and path == "/v1/chat/completions":
                await self.chat(writer, json.loads(body or b"{}"), t_recv)
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            try:
                await writer.drain()
                writer.close()
            except ConnectionError:
                pass

    async def _json(self, writer: asyncio.StreamWriter, obj: Any) -> None:
        data = json.dumps(obj).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(data), data))

    async def chat(self, writer: asyncio.StreamWriter, req: dict[str, Any], t_recv: float) -> None:
        n_req = next(self.counter)
        a = self.args
        n = min(int(req.get("max_tokens") or a.tokens), a.tokens) if a.honor_max_tokens else a.tokens
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        rid = f"chatcmpl-{os.getpid()}-{n_req}"
        mode = MIXED[n_req % len(MIXED)] if a.mode == "mixed" else a.mode
        if mode == "json" or not req.get("stream"):
            await self._json(writer, {"id": rid, "object": "chat.completion", "model": "sim",
                                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                                   "finish_reason": "stop"}],
                                      "usage": {"prompt_tokens": 10, "completion_tokens": 1}})
            return
        if mode == "http_503":
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 22\r\nConnection: close\r\n\r\n{\"error\":\"overloaded\"}")
            return
        if self.slots is not None:
            await self.slots.acquire()
        try:
            await self._stream(writer, rid, n, usage, mode, t_recv)
        finally:
            if self.slots is not None:
                self.slots.release()

    async def _stream(self, writer: asyncio.StreamWriter, rid: str, n: int, usage: bool, mode: str,
                      t_recv: float) -> None:
        if self.ttft == 0 and all(x == 0 for x in self.itls) and mode == "ok" and self.args.stall_after is None:
            key = (n, usage)
            if key not in self.cache:
                self.cache[key] = self._head() + b"".join(self._token("chatcmpl-sim", i) for i in range(n)) \
                    + self._tail("chatcmpl-sim", n, usage)
            writer.write(self.cache[key])
            return
        writer.write(self._head())
        t_head = time.perf_counter()
        await writer.drain()
        sends: list[float] = []
        if mode == "stall":
            await asyncio.sleep(3600)
        if mode == "empty":
            writer.write(self._tail(rid, 0, usage))
            return
        delay = self.ttft
        for i in range(n):
            if delay > 0:
                await asyncio.sleep(delay)
            if mode == "malformed" and i == 1:
                writer.write(self._chunk(b"data: {not json\n\n"))
                return
            if mode == "cut" and i == 2:
                writer.transport.abort()
                return
            writer.write(self._token(rid, i))  # the transport sends at once when the socket is writable
            sends.append(time.perf_counter())
            await writer.drain()
            delay = self.itls[i % len(self.itls)]
            if self.args.stall_after is not None and i + 1 == self.args.stall_after:
                delay += self.args.stall_s  # silent mid-stream, then the stream goes on
        writer.write(self._tail(rid, n, usage))
        if self.args.record:
            self.timings.append({"id": rid, "t_recv": t_recv, "t_head": t_head, "sends": sends})


async def _serve(args: argparse.Namespace, sock: socket.socket | None) -> None:
    sim = Sim(args)
    server = await asyncio.start_server(sim.handle, sock=sock, backlog=4096)
    async with server:
        await server.serve_forever()


def _listen(host: str, port: int, reuse_port: bool) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((host, port))
    s.listen(4096)
    s.setblocking(False)
    return s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m testbed.simserver", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--itl-ms", default="0", help="gap between tokens in ms; a comma list cycles")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--honor-max-tokens", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--slots", type=int, default=0, help="max concurrent streams (0: unlimited)")
    ap.add_argument("--mode", choices=["ok", "json", "mixed"], default="ok")
    ap.add_argument("--chunked", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--record", action=argparse.BooleanOptionalAction, default=True,
                    help="keep per-request send times for GET /_timings")
    ap.add_argument("--workers", type=int, default=1, help="processes sharing the port (SO_REUSEPORT)")
    ap.add_argument("--stall-after", type=int, default=None, help="go silent after this many content chunks")
    ap.add_argument("--stall-s", type=float, default=3600.0, help="how long (--stall-after)")
    ap.add_argument("--hang-after", type=int, default=None, help="after this many chat requests, hang every request")
    ap.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY (else HTTP 401)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.workers > 1:
        socks = [_listen(args.host, args.port, True) for _ in range(args.workers)]
        pids = []
        for s in socks:
            pid = os.fork()
            if pid == 0:
                asyncio.run(_serve(args, s))
                os._exit(0)
            pids.append(pid)
        print(f"simserver listening on http://{args.host}:{args.port} ({args.workers} workers)", flush=True)
        try:
            for pid in pids:
                os.waitpid(pid, 0)
        except KeyboardInterrupt:
            pass
        return 0
    sock = _listen(args.host, args.port, False)
    print(f"simserver listening on http://{args.host}:{args.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args, sock))
    return 0


def _raise_priority() -> None:
    """Timing tests share the CPU with whatever else runs: ask for a higher priority (root only)."""
    with contextlib.suppress(OSError):
        os.nice(-10)


class SimServer(ChildServer):
    """Run the simulator as a child process: `with SimServer(18500, "--ttft-ms", "20") as srv: srv.url ...`;
    cpu=N pins it to one core (taskset)."""

    label = "simserver"
    ready_timeout_s = 15.0
    poll_s = 0.05
    stop_timeout_s = 5.0
    quiet = True

    def __init__(self, port: int, *args: str, cpu: int | None = None) -> None:
        super().__init__(port)
        self.args = args
        self.cpu = cpu

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "testbed.simserver", "--port", str(self.port), *self.args]
        return cmd if self.cpu is None else ["taskset", "-c", str(self.cpu), *cmd]

    def popen_kwargs(self) -> dict[str, object]:
        return {"preexec_fn": _raise_priority}

    def ready(self) -> bool:  # it serves no /health: ready once it accepts a connection
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def timings(self) -> list[dict[str, Any]]:
        from sglfleet.loadtests.stream import get_json

        return get_json(self.url, "/_timings")[1]


if __name__ == "__main__":
    sys.exit(main())
