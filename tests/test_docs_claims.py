"""Every measurement table in README.md and docs/*.md points at a committed raw result file.

A table "claims a measurement" when most of its body cells (after the first column) are numbers with
units (`123.0`, `48 600 – 70 600`, `4.2 % (2)`, `PASS 0.00817`, `393 / 51`). Such a table is accepted
only when the paragraph just above or just below it names a raw result file (`.json`, `.jsonl`,
`.csv`) that exists in the repository and is tracked by git — e.g. a line `Raw: docs/results/x.json`.
Rendered blocks (`bench/render_docs.py`) must also be up to date with their raw files.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from bench.render_docs import DOCS, REPO, blocks, render_text

RAW_REF = re.compile(r"[\w./-]+\.(?:json|jsonl|csv)\b")
UNIT_WORDS = {"ms", "s", "tok/s", "req/s", "tok", "tokens", "mb", "gb", "kb", "pass", "fail", "x", "min", "h",
              "cores", "core"}
# Docs whose measurement tables do not name their raw files yet. Each entry must still be needed (the
# test below fails once the doc passes, so the exception is removed), and says whose it is and why.
PENDING: dict[str, str] = {}


def _numeric(cell: str) -> bool:
    text = re.sub(r"[*`]", "", cell).strip()
    if not re.search(r"\d", text):
        return False
    rest = re.sub(r"[\d.,%()<>≈~+\-–—/×:|\\\s]", " ", text)
    return all(w.lower() in UNIT_WORDS for w in rest.split())


def _tables(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line index of every Markdown table (header + |---| separator + rows)."""
    out, i = [], 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.match(r"^\|[\s:|-]+\|\s*$", lines[i + 1]):
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append((i, j - 1))
            i = j
        else:
            i += 1
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def claims_measurement(rows: list[str]) -> bool:
    body = [c for r in rows for c in _cells(r)[1:]]
    numeric = sum(_numeric(c) for c in body)
    return numeric >= 2 and numeric >= 0.4 * len(body)


def _paragraph(lines: list[str], start: int, step: int) -> list[str]:
    """The paragraph next to a table: skip one blank run, then take lines until the next blank."""
    i = start
    while 0 <= i < len(lines) and not lines[i].strip():
        i += step
    para = []
    while 0 <= i < len(lines) and lines[i].strip() and not lines[i].startswith("|"):
        para.append(lines[i])
        i += step
    return para


def _tracked(path: str) -> bool:
    if not (REPO / path).is_file():
        return False
    if not (REPO / ".git").exists():
        return True  # an exported tree: existence is all that can be checked
    r = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=REPO, capture_output=True, check=False)
    return r.returncode == 0


def unbacked_tables(doc: Path) -> list[str]:
    """Measurement tables of `doc` with no committed raw file named next to them: 'doc:line header'."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    bad = []
    for first, last in _tables(lines):
        if not claims_measurement(lines[first + 2 : last + 1]):
            continue
        near = _paragraph(lines, first - 1, -1) + _paragraph(lines, last + 1, 1)
        refs = [m.group(0) for line in near for m in RAW_REF.finditer(line)]
        if not any(_tracked(r) for r in refs):
            label = doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc.name
            bad.append(f"{label}:{first + 1} {lines[first][:80]}")
    return bad


def test_the_classifier_on_known_tables() -> None:
    assert claims_measurement(["| 2 | 123.0 | 102.1 | 42.1 |", "| 4 | 154.7 | 204.8 | 62.2 |"])
    assert claims_measurement(["| harness | 48 600 – 70 600 | 190 – 276 | 93 000 |"])
    assert claims_measurement(["| 1 (2) | PASS 0.00817 / PASS 0.00817 | PASS 0.00671 / **FAIL** 0.575 |"])
    assert claims_measurement(["| seed 1 | 48 | 48 | 4.2 % (2) | 14.6 % (7) |"])
    assert not claims_measurement(["| `empty@T` | empty or whitespace-only answers |",
                                   "| `char_run@T` | one character repeated beyond its class limit (`!!!!!!`) |"])
    assert not claims_measurement(["| `pcie` | 8x RTX PRO 6000 Blackwell, SM120 | `12.0f` |"])


def test_an_unbacked_table_is_found_and_a_raw_line_backs_it(tmp_path: Path) -> None:
    table = "| hosts | seconds |\n|---|---|\n| 2 | 123.0 |\n| 4 | 154.7 |\n"
    doc = tmp_path / "claims.md"
    doc.write_text(f"# t\n\nMeasured once.\n\n{table}")
    assert len(unbacked_tables(doc)) == 1
    doc.write_text(f"# t\n\nMeasured once.\n\n{table}\nRaw: docs/results/not-there.json\n")
    assert len(unbacked_tables(doc)) == 1  # a missing file backs nothing
    doc.write_text(f"# t\n\n{table}\nRaw: docs/results/loadtest-ceiling-2026-12-01.json\n")
    assert unbacked_tables(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_measurement_table_names_a_committed_raw_file(doc: Path) -> None:
    rel = str(doc.relative_to(REPO))
    bad = unbacked_tables(doc)
    if rel in PENDING:
        assert bad, f"{rel} now names its raw files: remove it from PENDING"
        pytest.skip(f"pending ({PENDING[rel]}): {len(bad)} table(s)")
    assert not bad, "measurement tables without a committed raw file:\n" + "\n".join(bad)


def test_rendered_tables_are_current_and_their_raw_files_committed() -> None:
    found = 0
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for _, path in blocks(text):
            found += 1
            assert _tracked(path), f"{doc.name}: render block names {path}, which is not a committed file"
        assert render_text(text) == text, f"{doc.name} is out of date: run python bench/render_docs.py"
    assert found >= 3  # docs/loadtests.md renders its ceiling, timing and scaling tables
