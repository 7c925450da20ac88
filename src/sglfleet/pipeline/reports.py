"""Report writers shared by every stage: JSON for machines, JUnit XML for CI, HTML for people.

Each stage builds a list of `Case` results plus free-form JSON data; these helpers write them in the
three formats into one run directory. Plots are matplotlib figures saved as PNG beside the HTML.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Secret-looking key names: hf_token, registry_password, api_key, Authorization, credentials...
# Counters such as max_tokens / completion_tokens are not secrets and stay readable.
_SECRET_KEYS = re.compile(r"(token|password|passwd|secret|api[_-]?key|authorization|credentials?)$", re.I)
# Names that end like a secret's but hold measurements: the likelihood verdict's per-token test ("per_token")
_PUBLIC_KEYS = frozenset({"per_token"})


@dataclass
class Case:
    """One named check: a JUnit testcase, a row in the HTML table."""

    name: str
    group: str
    ok: bool
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    time_s: float = 0.0
    skipped: bool = False
    not_run: bool = False  # it could not run (requests failed, nothing to judge): never a pass, listed with why


def redact(obj: Any) -> Any:
    """Copy of obj with values under secret-looking keys replaced by '***'."""
    if isinstance(obj, dict):
        return {k: ("***" if isinstance(k, str) and k not in _PUBLIC_KEYS and _SECRET_KEYS.search(k) and v
                    else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    return obj


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_dir(root: str | Path = "runs", label: str = "run") -> Path:
    """runs/<label>-<UTC timestamp>/, created."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")[:-4]
    path = Path(root) / f"{label}-{stamp}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Case):
        return asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def write_json(path: str | Path, obj: Any) -> Path:
    """Write obj as indented JSON (secrets redacted) atomically."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(redact(json.loads(json.dumps(obj, default=_jsonable))), indent=2) + "\n")
    tmp.replace(p)
    return p


def write_junit(path: str | Path, suite: str, cases: Sequence[Case]) -> Path:
    """JUnit XML: one <testsuite>, one <testcase> per Case; failures carry the message."""
    errors = sum(1 for c in cases if c.not_run)
    failures = sum(1 for c in cases if not c.ok and not c.skipped and not c.not_run)
    skipped = sum(1 for c in cases if c.skipped)
    root = ET.Element("testsuites")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)), failures=str(failures),
                       errors=str(errors), skipped=str(skipped), timestamp=utc_now(),
                       time=f"{sum(c.time_s for c in cases):.3f}")
    for c in cases:
        tc = ET.SubElement(ts, "testcase", name=c.name, classname=f"{suite}.{c.group}", time=f"{c.time_s:.3f}")
        if c.skipped:
            ET.SubElement(tc, "skipped", message=c.message[:500])
        elif c.not_run:
            ET.SubElement(tc, "error", message=f"not run: {c.message}"[:500])
        elif not c.ok:
            f = ET.SubElement(tc, "failure", message=c.message[:500])
            f.text = json.dumps(redact(c.details), indent=1, default=str)[:20000]
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(p, encoding="utf-8", xml_declaration=True)
    return p


def _row(c: Case) -> dict[str, str]:
    res, cls = ("skip", "skip") if c.skipped else (
        ("NOT RUN", "fail") if c.not_run else (("pass", "ok") if c.ok else ("FAIL", "fail")))
    return {"group": c.group, "name": c.name, "result": res, "cls": cls, "message": c.message}


def write_html(
    path: str | Path,
    title: str,
    verdict: str | None = None,
    summary: dict[str, Any] | None = None,
    cases: Sequence[Case] = (),
    images: Iterable[str | Path] = (),
    tables: Sequence[tuple[str, list[str], list[list[Any]]]] = (),
) -> Path:
    """A self-contained page from pipeline/templates/report.html.j2 (Jinja2, autoescaped): the verdict and the
    failed checks first, then the summary (nested values as lists, secrets redacted), extra tables, plots, and
    every check."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    rows = [_row(c) for c in cases]
    tally = [r["result"] for r in rows]
    counts = {"checks": len(rows), "passed": tally.count("pass"), "failed": tally.count("FAIL"),
              "not_run": tally.count("NOT RUN"), "skipped": tally.count("skip")} if rows else None
    page = env.get_template("report.html.j2").render(
        title=title, verdict=verdict, passed=verdict is not None and verdict.upper().startswith("PASS"),
        generated=utc_now(), counts=counts, failing=[r for r in rows if r["cls"] == "fail"],
        summary=redact(summary) if summary else None, tables=tables,
        images=[{"src": Path(i).name, "alt": Path(i).stem} for i in images], cases=rows)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(page, encoding="utf-8")
    return p
