"""Errors that every stage maps to the same exit codes.

Exit codes across the project: 0 success / gate passed, 1 gate or check failed, 2 usage error,
bad input or unreachable target. CLIs print one line for these, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import TypeVar

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2


class PipelineError(Exception):
    """Base class for errors with a one-line message and an exit code."""

    exit_code = EXIT_USAGE


class UsageError(PipelineError):
    """Bad input: malformed config, missing file, nonsense values."""


class TargetError(PipelineError):
    """The target cannot be reached or does not speak the OpenAI API."""


F = TypeVar("F", bound=Callable[..., int])


def cli_main(func: F) -> F:
    """Wrap a CLI entry point: PipelineError -> one line on stderr and its exit code."""

    @wraps(func)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return func(*args, **kwargs)
        except PipelineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130

    return wrapper  # type: ignore[return-value]
