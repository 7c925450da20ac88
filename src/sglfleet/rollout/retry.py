"""Retries of transient failures through tenacity, each retry recorded for the run's report.

What is retried: a registry HTTP call that could not connect, timed out, or was answered 429 / 5xx; the
preflight playbook when hosts were unreachable (ansible-runner rc 4) and none failed a check. What never is:
a gate or load-test verdict, a 4xx (bad credentials, a missing tag), a host that failed a preflight check, any
playbook that may have changed a host.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import tenacity

T = TypeVar("T")
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Retry:
    what: str  # registry | ssh
    call: str  # e.g. "GET /v2/x/manifests/rc1" or "preflight playbook"
    attempt: int  # the attempt that failed (1 = the first try)
    reason: str
    wait_s: float  # the back-off before the next attempt
    at: float  # unix time of the failure

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RetryLog:
    """Every retry of a run, in order; `entries` is the list that goes into the report as it is."""

    def __init__(self, entries: list[dict[str, Any]] | None = None) -> None:
        self.entries: list[dict[str, Any]] = entries if entries is not None else []
        self._lock = threading.Lock()

    def add(self, r: Retry) -> None:
        with self._lock:
            self.entries.append(r.to_dict())

    def __len__(self) -> int:
        return len(self.entries)


@dataclass(frozen=True)
class Policy:
    attempts: int = 4
    wait_s: float = 0.5
    max_wait_s: float = 8.0


def call(fn: Callable[[], T], *, what: str, name: str, policy: Policy, log: RetryLog | None,
         retry_exc: Callable[[BaseException], bool] | None = None,
         retry_result: Callable[[T], str | None] | None = None, sleep: Callable[[float], None] = time.sleep) -> T:
    """fn() until it neither raises an exception retry_exc accepts nor returns a result retry_result names a
    reason for,
    at most policy.attempts times with exponential back-off. The last exception is re-raised; the last result
    is returned as it is (the caller turns it into its usual error)."""

    def reason_of(rs: tenacity.RetryCallState) -> str:
        if rs.outcome is None:
            return "unknown"
        if rs.outcome.failed:
            exc = rs.outcome.exception()
            return f"{type(exc).__name__}: {exc}"[:200]
        return (retry_result(rs.outcome.result()) if retry_result else None) or "retried"

    def before_sleep(rs: tenacity.RetryCallState) -> None:
        if log is not None:
            wait = rs.next_action.sleep if rs.next_action else 0.0
            log.add(Retry(what, name, rs.attempt_number, reason_of(rs), round(wait, 3), time.time()))

    def last(rs: tenacity.RetryCallState) -> Any:  # attempts used up: the last outcome, as it was
        assert rs.outcome is not None
        return rs.outcome.result()  # re-raises the last exception

    cond: Any = tenacity.retry_if_exception(retry_exc) if retry_exc else tenacity.retry_never
    if retry_result is not None:
        cond = cond | tenacity.retry_if_result(lambda r: retry_result(r) is not None)
    r = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts),
        wait=tenacity.wait_exponential(multiplier=policy.wait_s, min=policy.wait_s, max=policy.max_wait_s),
        retry=cond, before_sleep=before_sleep, sleep=sleep, retry_error_callback=last,
    )
    return r(fn)


def http_status_reason(resp: Any) -> str | None:
    """A response worth retrying (429, 5xx): its reason; else None."""
    code = getattr(resp, "status_code", None)
    return f"HTTP {code}" if code in RETRY_STATUS else None
