"""Per-stage timing of the DDTree decode step, off unless ``SGLANG_DDTREE_PROFILE_DIR`` is set.

Each stage boundary records a CUDA event on the current stream and the host clock. Events are
read only once the GPU has passed them (``Event.query()``), so profiling adds no host sync; the
GPU time of a stage is the time between its two events on the stream, which includes any time
the GPU waited for the host inside that stage. The gap between one step's last event and the next
step's first (same key, under 50 ms apart) is the time outside the worker (scheduler, output
processing). Totals per key are written, atomically, to ``<dir>/ddtree-profile-<pid>.json``
every 32 steps and whenever the key changes. Used by bench/ddtree_step.py.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any

ENV = "SGLANG_DDTREE_PROFILE_DIR"
GAP_LIMIT_MS = 50.0
DUMP_EVERY = 32


class StepProfiler:
    def __init__(self, out_dir: str) -> None:
        import torch

        self._torch = torch
        self.path = os.path.join(out_dir, f"ddtree-profile-{os.getpid()}.json")
        os.makedirs(out_dir, exist_ok=True)
        self.totals: dict[str, dict[str, Any]] = {}
        self._pending: list[tuple[str, list[tuple[str, Any, float]]]] = []
        self._last_end: tuple[str, Any] | None = None
        self._marks: list[tuple[str, Any, float]] | None = None
        self._key = ""
        self._steps = 0

    @classmethod
    def from_env(cls) -> StepProfiler | None:
        d = os.environ.get(ENV)
        if not d:
            return None
        import torch

        return cls(d) if torch.cuda.is_available() else None

    def begin(self, key: str) -> None:
        if key != self._key and self._steps:
            self._harvest()
            self.dump()  # a new kind of step: what came before is complete on disk
        self._key = key
        self._marks = []
        self.mark("begin")

    def mark(self, name: str) -> None:
        if self._marks is None:
            return
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        self._marks.append((name, ev, time.perf_counter()))

    def end(self) -> None:
        if self._marks is None:
            return
        self.mark("end")
        self._pending.append((self._key, self._marks))
        self._marks = None
        self._harvest()
        self._steps += 1
        if self._steps % DUMP_EVERY == 0:
            self.dump()

    def _harvest(self) -> None:
        done = 0
        for key, marks in self._pending:
            if not marks[-1][1].query():
                break  # the stream is in order: later steps are not done either
            done += 1
            t = self.totals.setdefault(key, {"steps": 0, "gpu_ms": {}, "host_ms": {}, "gap_ms": 0.0, "gaps": 0})
            t["steps"] += 1
            for (_, e0, h0), (name, e1, h1) in itertools.pairwise(marks):
                t["gpu_ms"][name] = t["gpu_ms"].get(name, 0.0) + e0.elapsed_time(e1)
                t["host_ms"][name] = t["host_ms"].get(name, 0.0) + (h1 - h0) * 1e3
            if self._last_end is not None and self._last_end[0] == key:
                gap = self._last_end[1].elapsed_time(marks[0][1])
                if 0 <= gap < GAP_LIMIT_MS:
                    t["gap_ms"] += gap
                    t["gaps"] += 1
            self._last_end = (key, marks[-1][1])
        self._pending = self._pending[done:]

    def dump(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "totals": self.totals}, f)
        os.replace(tmp, self.path)
