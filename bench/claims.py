"""Numbers in prose, recomputed from their raw files: the claims manifest (docs/claims.yaml).

A claim is one line of the manifest:

    - {doc: README.md, text: "{} of {} garbled texts passed", raw: docs/results/gate-heldout-seed20261214.json,
       values: [summary.false_pass, summary.garbled]}

`text` is the phrase exactly as the doc says it, with a Python format field (`{}`, `{:.1f}`, `{:.1%}`,
`{:,}`) where each number goes; `values` gives one JSON path into `raw` per field. The check renders the
phrase from the raw file and fails when the doc does not contain it: an edited number, an edited raw
value and a renamed raw file all fail.

Paths: `a.b.c`, list indexes `a[0]`, keys with dots or slashes in quotes `per_class["bad/bad_bytes"].n`,
`[*]` for every element of a list (or every value of a mapping), then at most one aggregate at the end:
`|len`, `|sum`, `|min`, `|max`, `|mean`. `[?key=value]` keeps the elements whose `key` equals `value`
(compared as text); filters chain (`runs[?a=1][?b=x]|len`: both hold).

`unclaimed_numbers` is the other half: in the docs that promise it (README.md and docs/results.md), every
digit outside code, links, HTML comments, render blocks (bench/render_docs.py) and claimed phrases is an
error, so a number cannot be added to those pages without a raw file behind it.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.history import raw_text

REPO = Path(__file__).resolve().parent.parent
MANIFEST = "docs/claims.yaml"
# the pages where every number must be claimed or rendered (the other pages: their tables need a raw file)
STRICT_DOCS = ("README.md", "docs/results.md")
AGGREGATES = ("len", "sum", "min", "max", "mean")


class ClaimError(Exception):
    """A claim that cannot be checked: bad manifest line, missing raw file, a path that does not resolve."""


@dataclass(frozen=True)
class Claim:
    doc: str
    text: str
    raw: str
    values: tuple[str, ...]
    line: int

    def label(self) -> str:
        return f"{MANIFEST}:{self.line} ({self.doc}: {self.text!r})"


_TOKEN = re.compile(r"""\.?(?P<key>[A-Za-z_][\w-]*)|\[(?P<index>-?\d+)\]|\[(?P<q>"[^"]*"|'[^']*')\]|\[(?P<star>\*)\]"""
                    r"""|\[\?(?P<fk>[\w-]+)=(?P<fv>[^\]]*)\]""")


def _steps(path: str) -> tuple[list[tuple[str, Any]], str | None]:
    body, _, agg = path.partition("|")
    agg = agg.strip() or None
    if agg is not None and agg not in AGGREGATES:
        raise ClaimError(f"path {path!r}: unknown aggregate '{agg}' (known: {', '.join(AGGREGATES)})")
    steps: list[tuple[str, Any]] = []
    pos = 0
    body = body.strip()
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if not m or m.end() == pos:
            raise ClaimError(f"path {path!r}: cannot parse at {body[pos:]!r}")
        if m.group("key") is not None:
            steps.append(("key", m.group("key")))
        elif m.group("index") is not None:
            steps.append(("index", int(m.group("index"))))
        elif m.group("q") is not None:
            steps.append(("key", m.group("q")[1:-1]))
        elif m.group("star"):
            steps.append(("star", None))
        else:
            steps.append(("filter", (m.group("fk"), m.group("fv"))))
        pos = m.end()
    if not steps:
        raise ClaimError(f"path {path!r} is empty")
    return steps, agg


def resolve(data: Any, path: str) -> Any:
    """The value at `path` in `data` (see the module docstring for the syntax)."""
    steps, agg = _steps(path)
    items: list[Any] = [data]
    fanned = False
    for kind, arg in steps:
        if kind == "filter" and fanned:  # a filter after a fan-out keeps the selected elements that match too
            k, v = arg
            items = [e for e in items if isinstance(e, dict) and str(e.get(k)) == v]
            continue
        nxt: list[Any] = []
        for it in items:
            if kind == "key":
                if not isinstance(it, dict) or arg not in it:
                    raise ClaimError(f"path {path!r}: no key '{arg}'")
                nxt.append(it[arg])
            elif kind == "index":
                if not isinstance(it, list) or not -len(it) <= arg < len(it):
                    raise ClaimError(f"path {path!r}: no element [{arg}]")
                nxt.append(it[arg])
            elif kind == "star":
                if isinstance(it, dict):
                    nxt.extend(it.values())
                elif isinstance(it, list):
                    nxt.extend(it)
                else:
                    raise ClaimError(f"path {path!r}: [*] on a {type(it).__name__}")
                fanned = True
            else:
                if not isinstance(it, list):
                    raise ClaimError(f"path {path!r}: a filter on a {type(it).__name__}")
                k, v = arg
                nxt.extend(e for e in it if isinstance(e, dict) and str(e.get(k)) == v)
                fanned = True
        items = nxt
    if agg is None:
        if fanned:
            raise ClaimError(f"path {path!r} selects several values: end it with an aggregate (|len, |sum, ...)")
        return items[0]
    if agg == "len":
        return len(items[0]) if not fanned and isinstance(items[0], (list, dict)) else len(items)
    vals = items[0] if not fanned and isinstance(items[0], list) else items
    if not vals or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        raise ClaimError(f"path {path!r}: |{agg} needs numbers, got {vals!r:.80}")
    if agg == "sum":
        return sum(vals)
    if agg == "min":
        return min(vals)
    if agg == "max":
        return max(vals)
    return sum(vals) / len(vals)


def load_manifest(repo: Path = REPO) -> list[Claim]:
    f = repo / MANIFEST
    if not f.is_file():
        return []
    lines = f.read_text(encoding="utf-8").splitlines()
    try:
        data = yaml.safe_load("\n".join(lines)) or []
    except yaml.YAMLError as exc:
        raise ClaimError(f"{MANIFEST}: not YAML ({exc})") from None
    if not isinstance(data, list):
        raise ClaimError(f"{MANIFEST}: must be a list of claims")
    entry_lines = [i + 1 for i, ln in enumerate(lines) if ln.startswith("- ")]
    claims = []
    for n, (entry, line) in enumerate(zip(data, entry_lines + [0] * len(data), strict=False)):
        where = f"{MANIFEST}:{line or n + 1}"
        if not isinstance(entry, dict) or set(entry) != {"doc", "text", "raw", "values"}:
            raise ClaimError(f"{where}: a claim has exactly the keys doc, text, raw, values")
        values = entry["values"]
        if isinstance(values, str):
            values = [values]
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ClaimError(f"{where}: values must be a list of JSON paths")
        if not all(isinstance(entry[k], str) for k in ("doc", "text", "raw")):
            raise ClaimError(f"{where}: doc, text and raw must be strings")
        claims.append(Claim(entry["doc"], entry["text"], entry["raw"], tuple(values), line or n + 1))
    return claims


def _load_raw(repo: Path, path: str) -> Any:
    f = repo / path
    if not f.is_file():
        raise ClaimError(f"raw file {path} does not exist")
    try:
        return json.loads(raw_text(f))
    except ValueError as exc:
        raise ClaimError(f"{path}: not JSON ({exc})") from None


def render_claim(claim: Claim, repo: Path = REPO) -> str:
    """The phrase as the raw file says it."""
    raw = _load_raw(repo, claim.raw)
    vals = [resolve(raw, p) for p in claim.values]
    try:
        text = claim.text.format(*vals)
    except (IndexError, ValueError, TypeError) as exc:
        raise ClaimError(f"{claim.label()}: cannot format {vals!r} ({exc})") from None
    if len(vals) != len(re.findall(r"(?<!\{)\{[^{}]*\}", claim.text)):
        raise ClaimError(f"{claim.label()}: {len(vals)} values for the fields of the text")
    return text


def tracked(path: str, repo: Path = REPO) -> bool:
    """A committed file (or, in an exported tree without .git, an existing one)."""
    if not (repo / path).is_file():
        return False
    if not (repo / ".git").exists():
        return True
    r = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=repo, capture_output=True, check=False)
    return r.returncode == 0


def check_claims(repo: Path = REPO, docs: dict[str, str] | None = None, *, need_tracked: bool = True) -> list[str]:
    """One line per claim that fails: its phrase is not in its doc, or its raw file/path is bad.
    `docs` (name -> text) replaces the files' text, for checking an edited copy."""
    errors = []
    for c in load_manifest(repo):
        try:
            phrase = render_claim(c, repo)
        except ClaimError as exc:
            errors.append(f"{c.label()}: {exc}")
            continue
        if need_tracked and not tracked(c.raw, repo):
            errors.append(f"{c.label()}: raw file {c.raw} is not committed")
        text = (docs or {}).get(c.doc)
        if text is None:
            f = repo / c.doc
            if not f.is_file():
                errors.append(f"{c.label()}: doc {c.doc} does not exist")
                continue
            text = f.read_text(encoding="utf-8")
        if phrase not in text:
            errors.append(f"{c.label()}: {c.raw} makes it {phrase!r}, which {c.doc} does not say")
    return errors


_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", re.S | re.M)
_COMMENTED = re.compile(r"<!--.*?-->", re.S)
_RENDER = re.compile(r"<!-- render: .*?<!-- /render -->", re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\([^)\s]*\)")


def unclaimed_numbers(doc: str, text: str, repo: Path = REPO) -> list[str]:
    """'doc:line: text' for every line of `text` with a digit that no claim or render block accounts for."""
    phrases = []
    for c in load_manifest(repo):
        if c.doc != doc:
            continue
        try:
            phrases.append(render_claim(c, repo))
        except ClaimError:
            continue  # reported by check_claims
    stripped = _RENDER.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    stripped = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), stripped)
    stripped = _COMMENTED.sub(lambda m: "\n" * m.group(0).count("\n"), stripped)
    for p in sorted(phrases, key=len, reverse=True):
        stripped = stripped.replace(p, " " * len(p.split("\n")[0]) + "\n" * p.count("\n"))
    stripped = _CODE.sub(" ", stripped)
    stripped = _LINK.sub("]", stripped)
    out = []
    for i, line in enumerate(stripped.splitlines(), 1):
        if re.search(r"\d", line):
            out.append(f"{doc}:{i}: {text.splitlines()[i - 1].strip()[:100]}")
    return out
