"""The gate asks for top_logprobs on every T=0 answer validation/determinism.py judges: the determinism
prompts' suite answer and their sequential and concurrent repeats (a real HTTP server records the requests)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglfleet.validation.config import GateConfig
from sglfleet.validation.gate import Gate


def test_determinism_answers_are_asked_with_logprobs() -> None:
    bodies: list[dict] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            data = b'{"object":"list","data":[{"id":"m"}]}' if self.path == "/v1/models" else b"{}"
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            chunk = {"choices": [{"index": 0, "delta": {"content": "hello there"}, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
            out = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        # no greedy companions: their T=0 requests of the same prompts are load, asked without alternatives
        # (test_gate_clients.py tests them)
        cfg = GateConfig.model_validate({"temperatures": [0.0, 0.8], "judge": {"enabled": False},
                                         "sampling": {"companions": 0},
                                         "variation": {"enabled": False}, "quality": {"enabled": False},
                                         "long_copy": {"enabled": False}, "max_tokens": 4})
        Gate(f"http://127.0.0.1:{srv.server_address[1]}", cfg).run()
    finally:
        srv.shutdown()
    det = set(cfg.determinism.prompt_ids)
    user = {json.dumps(b["messages"]): b for b in bodies}
    assert user
    for b in bodies:
        t0 = b["temperature"] == 0
        asked = b.get("top_logprobs")
        # which prompt: match the suite's messages
        is_det = any(pid_text in json.dumps(b["messages"]) for pid_text in _det_texts(cfg, det))
        if t0 and is_det:
            assert asked == cfg.determinism.top_logprobs and b["logprobs"] is True, b
        else:
            assert asked is None, b
    n_det = sum(1 for b in bodies if b["temperature"] == 0 and b.get("top_logprobs"))
    assert n_det == len(det) * (1 + cfg.determinism.repeats + cfg.determinism.concurrent)


def _det_texts(cfg: GateConfig, det: set[str]) -> list[str]:
    from sglfleet.validation.suite import load_suite

    return [json.dumps(load_suite(cfg.suite).get(pid).messages())[1:-1] for pid in det]
