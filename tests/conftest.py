"""Fixtures shared by every stage's tests."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.embedded import EmbeddedConfig, EmbeddedServer

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def embedded_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """The real embedded model (SmolLM2-135M on llama.cpp), started once per test session."""
    run_dir = tmp_path_factory.mktemp("embedded")
    with EmbeddedServer(EmbeddedConfig(port=free_port()), run_dir) as srv:
        yield srv


@dataclass
class HttpPeer:
    """A real local HTTP server answering GETs from `routes`: path -> (status, content type, body)."""

    url: str
    routes: dict[str, tuple[int, str, bytes]] = field(default_factory=dict)


@pytest.fixture
def http_peer() -> Iterator[HttpPeer]:
    """Stand-in for servers that cannot run here (a non-OpenAI server, SGLang's info routes)."""
    peer = HttpPeer("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, ctype, body = peer.routes.get(self.path, (404, "text/plain", b"not found"))
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    peer.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield peer
    srv.shutdown()
