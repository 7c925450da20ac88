"""One report for a flow run: report.json, junit.xml and index.html, the page linking every stage's report."""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sglfleet.pipeline.reports import Case, redact, utc_now, write_json, write_junit


@dataclass
class Stage:
    """One stage's typed result: ok / failed / skipped, a one-line summary, the stage's own reports."""

    name: str
    ok: bool
    summary: str
    seconds: float = 0.0
    skipped: bool = False
    links: dict[str, str] = field(default_factory=dict)  # label -> path of the stage's own report
    data: dict[str, Any] = field(default_factory=dict)

    def case(self) -> Case:
        return Case(name=self.name, group="flow", ok=self.ok or self.skipped, message=self.summary[:1500],
                    time_s=self.seconds, skipped=self.skipped)


def _rel(path: str, base: Path) -> str:
    try:
        return os.path.relpath(path, base)
    except ValueError:
        return path


def write(run_dir: Path, title: str, verdict: str, headline: dict[str, Any], stages: Sequence[Stage],
          report: dict[str, Any], extra_cases: Sequence[Case] = ()) -> Path:
    """report.json (everything), junit.xml (one case per stage + extras), index.html (headline, stages, links)."""
    report = {**report, "verdict": verdict, "headline": headline, "stages": [asdict(s) for s in stages]}
    write_json(run_dir / "report.json", report)
    write_junit(run_dir / "junit.xml", "flow", [s.case() for s in stages] + list(extra_cases))
    e = html.escape
    cls = "ok" if verdict.upper().startswith(("PASS", "PROMOTED", "UNCHANGED", "DEPLOYED", "CHECK")) else "fail"
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>"
           "body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
           "margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top;"
           "font-size:14px}th{background:#f4f4f4}.ok{color:#137333}.fail{color:#b3261e;font-weight:bold}"
           ".skip{color:#777}.verdict{font-size:1.8em}pre{white-space:pre-wrap;margin:0}</style></head><body>",
           f"<h1>{e(title)}</h1><p>generated {utc_now()}</p><p class='verdict {cls}'>{e(verdict)}</p><table>"]
    for k, v in redact(headline).items():
        out.append(f"<tr><th>{e(str(k))}</th><td>{e('' if v is None else str(v))}</td></tr>")
    out.append("</table><h2>Stages</h2><table><tr><th>stage</th><th>result</th><th>seconds</th><th>summary</th>"
               "<th>reports</th></tr>")
    for s in stages:
        res, c = ("skipped", "skip") if s.skipped else (("pass", "ok") if s.ok else ("FAIL", "fail"))
        links = " ".join(f"<a href='{e(_rel(p, run_dir))}'>{e(label)}</a>" for label, p in s.links.items())
        out.append(f"<tr><td>{e(s.name)}</td><td class='{c}'>{res}</td><td>{s.seconds:.1f}</td>"
                   f"<td><pre>{e(s.summary)}</pre></td><td>{links}</td></tr>")
    out.append("</table><p><a href='report.json'>report.json</a> · <a href='junit.xml'>junit.xml</a></p>"
               "</body></html>")
    (run_dir / "index.html").write_text("\n".join(out), encoding="utf-8")
    return run_dir / "index.html"
