"""Report writers shared by every stage: JSON for machines, JUnit XML for CI, HTML for people.

Each stage builds a list of `Case` results plus free-form JSON data; these helpers write them in the
three formats into one run directory. Plots are matplotlib figures saved as PNG beside the HTML.
"""

from __future__ import annotations

import datetime as _dt
import html
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


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;width:100%;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:left;vertical-align:top;font-size:13px}th{background:#f4f4f4}.ok{color:#137333}.fail{color:#b3261e;
font-weight:bold}.skip{color:#777}pre{white-space:pre-wrap;margin:0;max-height:12em;overflow:auto}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}.verdict{font-size:1.6em}"""


def write_html(
    path: str | Path,
    title: str,
    verdict: str | None = None,
    summary: dict[str, Any] | None = None,
    cases: Sequence[Case] = (),
    images: Iterable[str | Path] = (),
    tables: Sequence[tuple[str, list[str], list[list[Any]]]] = (),
) -> Path:
    """A self-contained page: verdict, key/value summary, extra tables, plots, then every check."""
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
           f"<style>{_CSS}</style></head><body><h1>{e(title)}</h1><p>generated {utc_now()}</p>"]
    if verdict is not None:
        cls = "ok" if verdict.upper().startswith("PASS") else "fail"
        out.append(f"<p class='verdict {cls}'>{e(verdict)}</p>")
    if summary:
        out.append("<table>")
        for k, v in redact(summary).items():
            out.append(f"<tr><th>{e(str(k))}</th><td>{e(str(v))}</td></tr>")
        out.append("</table>")
    for caption, header, rows in tables:
        out.append(f"<h2>{e(caption)}</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
        for row in rows:
            out.append("<tr>" + "".join(f"<td>{e(str(x))}</td>" for x in row) + "</tr>")
        out.append("</table>")
    for img in images:
        out.append(f"<img src='{e(Path(img).name)}' alt='{e(Path(img).stem)}'>")
    if cases:
        out.append("<h2>Checks</h2><table><tr><th>group</th><th>check</th><th>result</th><th>message</th></tr>")
        for c in cases:
            res, cls = ("skip", "skip") if c.skipped else (
                ("NOT RUN", "fail") if c.not_run else (("pass", "ok") if c.ok else ("FAIL", "fail")))
            out.append(f"<tr><td>{e(c.group)}</td><td>{e(c.name)}</td><td class='{cls}'>{res}</td>"
                       f"<td><pre>{e(c.message)}</pre></td></tr>")
        out.append("</table>")
    out.append("</body></html>")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(out), encoding="utf-8")
    return p
