"""A constant light client load through the router for the whole rollout: what "no dropped requests" is
measured with. Real HTTP requests (`/v1/chat/completions`, short answers) from a background thread at a fixed
rate, each one counted under the rollout stage that was running when it was SENT; a request fails on a
transport error, a status other than 200, or an answer without choices."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx


@dataclass
class StageTraffic:
    stage: str
    sent: int = 0
    ok: int = 0
    failed: int = 0
    errors: Counter = field(default_factory=Counter)  # short reason -> count


class ClientLoad:
    """`with ClientLoad(router_url, rate_per_s=2) as load: ...; load.set_stage("drain h1")`."""

    def __init__(self, url: str, *, rate_per_s: float = 2.0, model: str = "default", max_tokens: int = 4,
                 timeout_s: float = 120.0, concurrency: int = 8) -> None:
        self.url = url.rstrip("/") + "/v1/chat/completions"
        self.period = 1.0 / rate_per_s
        self.body = {"model": model, "max_tokens": max_tokens, "temperature": 0,
                     "messages": [{"role": "user", "content": "Say hi."}]}
        self.timeout_s = timeout_s
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="client-load")
        self.http = httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=concurrency))
        self.lock = threading.Lock()
        self.stages: dict[str, StageTraffic] = {}
        self.stage = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="client-load", daemon=True)

    def set_stage(self, name: str) -> None:
        with self.lock:
            self.stage = name
            self.stages.setdefault(name, StageTraffic(name))

    def _one(self, stage: str) -> None:
        why = None
        try:
            r = self.http.post(self.url, json=self.body)
            if r.status_code != 200:
                why = f"HTTP {r.status_code}"
            elif not r.json().get("choices"):
                why = "no choices"
        except httpx.HTTPError as exc:
            why = type(exc).__name__
        except ValueError:
            why = "not JSON"
        with self.lock:
            st = self.stages[stage]
            if why:
                st.failed += 1
                st.errors[why] += 1
            else:
                st.ok += 1

    def _loop(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            with self.lock:
                stage = self.stage
                self.stages.setdefault(stage, StageTraffic(stage)).sent += 1
            self.pool.submit(self._one, stage)
            nxt += self.period
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def start(self) -> ClientLoad:
        self.set_stage(self.stage)
        self._thread.start()
        return self

    def stop(self) -> list[StageTraffic]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.pool.shutdown(wait=True)
        self.http.close()
        return self.result()

    def result(self) -> list[StageTraffic]:
        with self.lock:
            return [StageTraffic(s.stage, s.sent, s.ok, s.failed, Counter(s.errors)) for s in self.stages.values()]

    @property
    def failed(self) -> int:
        with self.lock:
            return sum(s.failed for s in self.stages.values())

    def __enter__(self) -> ClientLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
