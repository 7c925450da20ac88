"""A minimal OpenAI-compatible worker for router tests: `/health`, `/v1/models`, `/v1/chat/completions`
(plain or streamed), each answer taking `--delay-s` so requests are really in flight when the router drains
the worker; `GET /_stats` says how many requests it served and holds now.

    python -m testbed.routerworker --port 18601 [--delay-s 0.5] [--name w1] [--unhealthy]

It exists because the router health-checks `/health` before it routes to a worker, which the simulated
streaming server (testbed/simserver.py) does not serve.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from testbed.childserver import ChildServer


class _State:
    def __init__(self, name: str, delay_s: float, healthy: bool) -> None:
        self.name, self.delay_s, self.healthy = name, delay_s, healthy
        self.lock = threading.Lock()
        self.inflight = 0
        self.served = 0


def _handler(st: _State) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: Any) -> None:  # quiet
            pass

        def _json(self, code: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200 if st.healthy else 503, {"ok": st.healthy})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": st.name, "object": "model"}]})
            elif self.path == "/metrics":  # the SGLang gauges the drain waits on (--enable-metrics)
                with st.lock:
                    text = ("# TYPE sglang:num_running_reqs gauge\n"
                            f'sglang:num_running_reqs{{model_name="{st.name}"}} {st.inflight}\n'
                            "# TYPE sglang:num_queue_reqs gauge\n"
                            f'sglang:num_queue_reqs{{model_name="{st.name}"}} 0\n')
                data = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif self.path == "/_stats":
                with st.lock:
                    self._json(200, {"name": st.name, "inflight": st.inflight, "served": st.served})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/chat/completions":
                self._json(404, {"error": "not found"})
                return
            req = json.loads(body or b"{}")
            with st.lock:
                st.inflight += 1
            try:
                text = f"hello from {st.name}"
                if req.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    words = text.split()
                    for w in words:
                        time.sleep(st.delay_s / len(words))
                        ev = {"id": "c", "object": "chat.completion.chunk", "model": st.name,
                              "choices": [{"index": 0, "delta": {"content": w + " "}, "finish_reason": None}]}
                        self._chunk(b"data: " + json.dumps(ev).encode() + b"\n\n")
                    self._chunk(b"data: [DONE]\n\n")
                    self._chunk(b"")
                else:
                    time.sleep(st.delay_s)
                    self._json(200, {"id": "c", "object": "chat.completion", "model": st.name,
                                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                                  "finish_reason": "stop"}],
                                     "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}})
            finally:
                with st.lock:
                    st.inflight -= 1
                    st.served += 1

        def _chunk(self, payload: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            self.wfile.flush()

    return H


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.routerworker")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay-s", type=float, default=0.3)
    ap.add_argument("--name", default="worker")
    ap.add_argument("--unhealthy", action="store_true", help="answer /health with 503")
    a = ap.parse_args(argv)
    srv = ThreadingHTTPServer((a.host, a.port), _handler(_State(a.name, a.delay_s, not a.unhealthy)))
    srv.daemon_threads = True
    srv.serve_forever()
    return 0


class RouterWorker(ChildServer):
    """`with RouterWorker(port, delay_s=...) as w:` a worker process on 127.0.0.1:port."""

    label = "router test worker"

    def __init__(self, port: int, *, delay_s: float = 0.3, name: str | None = None) -> None:
        super().__init__(port)
        self.delay_s, self.name = delay_s, name or f"w{port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "testbed.routerworker", "--port", str(self.port), "--delay-s",
                str(self.delay_s), "--name", self.name]

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/_stats", timeout=5).json()


if __name__ == "__main__":
    sys.exit(main())
