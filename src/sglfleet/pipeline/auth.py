"""API keys of a target: read from an environment variable or a file, never from the command line.

Every stage that talks to a target (the gate, record-baseline, the load test, the flow) names where its
key is (`api_key_env: NAME` or `api_key_file: PATH` in its config, `--api-key-file` / `--api-key-env` on
its command line) and resolves it here once, before the first request. The key itself is never put into a
config dump, report, log line or error message: configs hold only the variable's name or the file's path.
"""

from __future__ import annotations

import os
from pathlib import Path

from sglfleet.pipeline.errors import UsageError

MAX_KEY_BYTES = 4096


def _checked(key: str, where: str) -> str:
    key = key.strip()
    if not key:
        raise UsageError(f"the API key from {where} is empty")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise UsageError(f"the API key from {where} is longer than {MAX_KEY_BYTES} bytes")
    if any(c.isspace() or ord(c) < 0x21 or ord(c) > 0x7E for c in key):
        raise UsageError(f"the API key from {where} has whitespace or non-printable characters (one key, one line)")
    return key


def resolve_api_key(env: str | None = None, file: str | Path | None = None) -> str | None:
    """The bearer token named by `env` (an environment variable) or `file` (its first line), None when
    neither is given. UsageError (exit 2) for both at once, an unset/empty variable, a missing or empty
    file; the message names the variable or the file, never the key."""
    if env and file:
        raise UsageError("give the API key one way: api_key_env or api_key_file, not both")
    if env:
        if env not in os.environ:
            raise UsageError(f"api_key_env names ${env}, which is not set")
        return _checked(os.environ[env], f"${env}")
    if file:
        p = Path(file).expanduser()
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"API key file not found: {p}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the API key file {p}: {type(exc).__name__}") from None
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) > 1:
            raise UsageError(f"the API key file {p} has {len(lines)} non-blank lines: one key, one line")
        return _checked(lines[0] if lines else "", f"file {p}")
    return None


__all__ = ["resolve_api_key"]
