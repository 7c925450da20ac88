"""Latency metrics collected beside Locust's request statistics, never inside them.

Locust's request stats count every `events.request` as a request: firing TTFT, ITL, TPOT or tokens/s
through it inflates the "Aggregated" request count and rate and puts tokens/s in millisecond columns.
So the locustfile records one chat request as one Locust request (`POST chat`) and puts the latency
metrics (definitions and units: `pipeline.metrics.METRICS`) into a `MetricRegistry`:

* each worker sends its registry's delta with every stats report (`report_to_master`) and resets it;
  the master merges what arrives (`worker_report`), so master and local runs hold the same totals;
* percentiles come from buckets of 3 significant digits (like Locust's own rounded response times,
  but fine enough for sub-millisecond gaps), count / mean / min / max are exact.

No Locust import here: the registry is plain data, unit-tested without gevent.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sglfleet.pipeline.metrics import METRICS

PERCENTILES = (0.5, 0.9, 0.95, 0.99)
CSV_HEADER = ["Name", "Unit", "Count", "Mean", "Min", "Max", *(f"p{round(p * 100)}" for p in PERCENTILES)]


def bucket(value: float) -> float:
    """`value` rounded to 3 significant digits (the percentile resolution)."""
    if value == 0 or not math.isfinite(value):
        return 0.0
    return round(value, 2 - math.floor(math.log10(abs(value))))


class MetricSeries:
    """Count, sum, min, max and a bucketed histogram of one metric's samples."""

    __slots__ = ("buckets", "count", "max", "min", "name", "total", "unit")

    def __init__(self, name: str, unit: str) -> None:
        self.name, self.unit = name, unit
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.buckets: dict[float, int] = {}

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        b = bucket(value)
        self.buckets[b] = self.buckets.get(b, 0) + 1

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def percentile(self, q: float) -> float | None:
        """The smallest bucket value with at least q of the samples at or below it."""
        if not self.count:
            return None
        need = q * self.count
        seen = 0
        for value in sorted(self.buckets):
            seen += self.buckets[value]
            if seen >= need:
                return value
        return self.max

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "count": self.count, "total": self.total,
                "min": self.min if self.count else None, "max": self.max if self.count else None,
                "buckets": [[k, v] for k, v in self.buckets.items()]}

    def merge(self, data: dict[str, Any]) -> None:
        if not data.get("count"):
            return
        self.count += int(data["count"])
        self.total += float(data["total"])
        self.min = min(self.min, float(data["min"]))
        self.max = max(self.max, float(data["max"]))
        for k, v in data["buckets"]:
            self.buckets[float(k)] = self.buckets.get(float(k), 0) + int(v)

    def row(self) -> dict[str, Any]:
        """One table row: name, unit, count, mean, min, max, percentiles (None when empty)."""
        r: dict[str, Any] = {"name": self.name, "unit": self.unit, "count": self.count,
                             "mean": _r(self.mean), "min": _r(self.min if self.count else None),
                             "max": _r(self.max if self.count else None)}
        for q in PERCENTILES:
            r[f"p{round(q * 100)}"] = _r(self.percentile(q))
        return r


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


class MetricRegistry:
    """One series per metric of `pipeline.metrics.METRICS`, in that order."""

    def __init__(self, metrics: dict[str, str] | None = None) -> None:
        self.metrics = dict(metrics or METRICS)
        self.reset()

    def reset(self) -> None:
        self.series = {name: MetricSeries(name, unit) for name, unit in self.metrics.items()}

    def add(self, name: str, value: float | None) -> None:
        if value is not None:
            self.series[name].add(value)

    def add_many(self, name: str, values: Iterable[float]) -> None:
        s = self.series[name]
        for v in values:
            s.add(v)

    def get(self, name: str) -> MetricSeries:
        return self.series[name]

    def serialize(self) -> dict[str, Any]:
        return {name: s.to_dict() for name, s in self.series.items() if s.count}

    def merge(self, data: dict[str, Any] | None) -> None:
        for name, d in (data or {}).items():
            if name not in self.series:
                self.series[name] = MetricSeries(name, str(d.get("unit", "")))
            self.series[name].merge(d)

    def rows(self) -> list[dict[str, Any]]:
        return [s.row() for s in self.series.values()]

    def write_csv(self, path: Path) -> Path:
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(CSV_HEADER)
            for r in self.rows():
                w.writerow(["" if r[k] is None else r[k] for k in
                            ("name", "unit", "count", "mean", "min", "max",
                             *(f"p{round(q * 100)}" for q in PERCENTILES))])
        return path


def html_table(rows: list[dict[str, Any]]) -> str:
    """The metrics as a static HTML section (appended to Locust's HTML report)."""
    import html

    cols = ["name", "unit", "count", "mean", "min", "max", *(f"p{round(q * 100)}" for q in PERCENTILES)]
    head = "".join(f"<th style='border:1px solid #ccc;padding:4px 8px'>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td style='border:1px solid #ccc;padding:4px 8px'>"
                                    f"{html.escape('-' if r[c] is None else str(r[c]))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return ("<section id='lt-latency-metrics' style='font-family:sans-serif;margin:2em'>"
            "<h2>Latency metrics (per chat request; not counted as requests)</h2>"
            f"<table style='border-collapse:collapse'><tr>{head}</tr>{body}</table></section>")
