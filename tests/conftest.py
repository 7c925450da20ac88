"""Fixtures shared by every stage's tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
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
