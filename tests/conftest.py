"""Fixtures shared by every stage's tests."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer
from sglfleet.pipeline.procs import free_port
from testbed.simserver import SimServer

REPO = Path(__file__).resolve().parent.parent

# Fixtures that start a server: every test using one is an integration test (not in `make test-fast`).
SERVER_FIXTURES = {"sim", "http_peer", "embedded_target"}
# Commands `make test-fast` must never run (servers, network downloads, compilers, containers).
_FAST_FORBIDDEN = ("nvcc", "ptxas", "pip", "locust", "sglfleet.loadtests", "simserver", "sglfleet.pipeline.embedded",
                   "docker", "ansible", "dockerd", "mmdebstrap", "debootstrap", "sshd")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


def _fast_guard_violation(argv: object) -> str | None:
    words = argv.split() if isinstance(argv, str) else [str(a) for a in argv]  # type: ignore[union-attr]
    for w in words:
        base = Path(w).name
        for bad in _FAST_FORBIDDEN:
            if base == bad or base.startswith(bad + ".") or w == bad or w.startswith(bad + "."):
                return bad
    return None


@pytest.fixture(autouse=True)
def _test_fast_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `make test-fast` (PIPELINE_TEST_FAST=1): a test that opens a TCP socket or starts a server,
    a download, a compiler or a container fails at once, so "no servers, no network, no nvcc" holds."""
    import os

    if os.environ.get("PIPELINE_TEST_FAST") != "1":
        return
    import subprocess

    def refuse_socket(self: socket.socket, *a: object, **k: object) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError("make test-fast: this test opens a TCP socket; mark it integration or network")
        return orig_connect(self, *a, **k)  # type: ignore[arg-type]

    def refuse_bind(self: socket.socket, *a: object, **k: object) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError("make test-fast: this test starts a server; mark it integration")
        return orig_bind(self, *a, **k)  # type: ignore[arg-type]

    orig_connect, orig_bind = socket.socket.connect, socket.socket.bind
    orig_init = subprocess.Popen.__init__

    def guarded_popen(self: subprocess.Popen, args: object, *a: object, **k: object) -> None:  # type: ignore[type-arg]
        bad = _fast_guard_violation(args)
        if bad is not None:
            raise AssertionError(f"make test-fast: this test runs {bad!r} ({args}); mark it integration/network/nvcc")
        orig_init(self, args, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", refuse_socket)
    monkeypatch.setattr(socket.socket, "bind", refuse_bind)
    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_popen)


@pytest.fixture(scope="session")
def embedded_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """The real embedded model (SmolLM2-135M on llama.cpp), started once per test session."""
    run_dir = tmp_path_factory.mktemp("embedded")
    with EmbeddedServer(EmbeddedConfig(port=free_port()), run_dir) as srv:
        yield srv


@pytest.fixture
def sim() -> Iterator[Callable[..., SimServer]]:
    """Factory: sim("--ttft-ms", "20", ...) starts a simulator on a free port; all stopped at teardown."""
    started: list[SimServer] = []

    def start(*args: str) -> SimServer:
        srv = SimServer(free_port(), *args).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@dataclass
class HttpPeer:
    """A real local HTTP server answering GETs from `routes`: path -> (status, content type, body); every POST
    is answered 404 and its path kept in `posts`."""

    url: str
    routes: dict[str, tuple[int, str, bytes]] = field(default_factory=dict)
    posts: list[str] = field(default_factory=list)
    # when set, answers every POST: (path, JSON body) -> (status, content type, body)
    on_post: Callable[[str, dict], tuple[int, str, bytes]] | None = None


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

        def do_POST(self) -> None:
            peer.posts.append(self.path)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if peer.on_post is None:
                self.send_response(404)
                self.end_headers()
                return
            status, ctype, body = peer.on_post(self.path, json.loads(raw or b"{}"))
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
