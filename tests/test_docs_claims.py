"""Every measurement table in README.md and docs/*.md points at a committed raw result file.

A table "claims a measurement" when most of its body cells (after the first column) are numbers with
units (`123.0`, `48 600 – 70 600`, `4.2 % (2)`, `PASS 0.00817`, `393 / 51`). Such a table is accepted
only when the paragraph just above or just below it names a raw result file (`.json`, `.jsonl`,
`.csv`) that exists in the repository and is tracked by git — e.g. a line `Raw: docs/results/x.json`.
Rendered blocks (`bench/render_docs.py`) must also be up to date with their raw files, and every number in
the prose of README.md and docs/results.md must be a claim of docs/claims.yaml that its raw file still makes
(bench/claims.py); the tests below also show each check failing on an edited copy.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.claims import STRICT_DOCS, ClaimError, check_claims, load_manifest, resolve, unclaimed_numbers
from bench.render_docs import DOCS, REPO, blocks, render_text

RAW_REF = re.compile(r"[\w./-]+\.(?:json|jsonl|csv)(?:\.gz|\.xz)?\b")  # a large raw file: gzip or xz
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


# ------------------------------------------------------------------ claims: numbers in prose (docs/claims.yaml)
def test_every_claim_is_what_its_raw_file_says() -> None:
    claims = load_manifest()
    assert {c.doc for c in claims} >= {"README.md", "docs/results.md"}
    assert check_claims() == []


@pytest.mark.parametrize("doc", STRICT_DOCS)
def test_every_number_of_the_strict_pages_is_rendered_or_claimed(doc: str) -> None:
    assert unclaimed_numbers(doc, (REPO / doc).read_text(encoding="utf-8")) == []


def test_an_edited_number_in_a_copy_of_the_readme_fails(tmp_path: Path) -> None:
    repo = _copy_repo(tmp_path)
    assert check_claims(repo, need_tracked=False) == []
    readme = repo / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert "0 of 133" in text
    readme.write_text(text.replace("0 of 133", "0 of 999", 1), encoding="utf-8")
    errors = check_claims(repo, need_tracked=False)
    assert len(errors) == 1 and "'**0 of 133 garbled texts passed**" in errors[0] and "does not say" in errors[0]
    assert any("0 of 999" in u for u in unclaimed_numbers("README.md", readme.read_text(encoding="utf-8"), repo))
    # a number added to the page without a claim fails too
    assert unclaimed_numbers("README.md", text + "\nIt promotes in 42 seconds.\n", repo) == [
        f"README.md:{len(text.splitlines()) + 2}: It promotes in 42 seconds."]


def test_an_edited_count_in_a_rendered_table_fails(tmp_path: Path) -> None:
    repo = _copy_repo(tmp_path)
    page = repo / "docs" / "results.md"
    text = page.read_text(encoding="utf-8")
    assert render_text(text, repo) == text
    row = next(ln for ln in text.splitlines() if ln.startswith("| 20261214 | "))
    assert "| 8 of 245 (3.3%) |" in row
    page.write_text(text.replace(row, row.replace("| 8 of 245 (3.3%) |", "| 8 of 999 (3.3%) |")), encoding="utf-8")
    edited = page.read_text(encoding="utf-8")
    assert render_text(edited, repo) != edited and render_text(edited, repo) == text
    assert unclaimed_numbers("docs/results.md", edited, repo) == []  # inside a render block: the render check's


def test_the_seed_digest_matches_the_seed_files_and_names_real_blobs() -> None:
    """Rows of files in the tree are what the file says now; rows of removed files name a blob git holds."""
    from bench.gate_heldout_seeds import digest

    rows = json.loads((REPO / "docs/results/gate-heldout-seeds.json").read_text())["seeds"]
    assert [r["seed"] for r in rows] == sorted(r["seed"] for r in rows)
    for r in rows:
        src = r["source"]
        if (REPO / src["path"]).is_file():
            now = digest([src["path"]], None)["seeds"][0]
            assert (now["summary"], now["split"], now["source"]["blob"]) == (r["summary"], r["split"], src["blob"])
        else:
            got = subprocess.run(["git", "rev-parse", f"{src['commit']}:{src['path']}"], cwd=REPO,
                                 capture_output=True, text=True, check=False)
            assert got.returncode == 0 and got.stdout.strip() == src["blob"], src


def _copy_repo(tmp_path: Path) -> Path:
    """README, results page, manifest and every raw file they name, in a scratch tree (not a git checkout)."""
    for rel in ("README.md", "docs/results.md", "docs/claims.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tmp_path / rel)
    raws = {c.raw for c in load_manifest()} | {p for rel in ("README.md", "docs/results.md")
                                                 for _, p in blocks((REPO / rel).read_text(encoding="utf-8"))}
    for rel in raws:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tmp_path / rel)
    return tmp_path


def test_an_edited_raw_value_fails_the_claim_and_the_table(tmp_path: Path) -> None:
    repo = _copy_repo(tmp_path)
    assert check_claims(repo) == []
    results = (repo / "docs" / "results.md").read_text(encoding="utf-8")
    assert render_text(results, repo) == results
    latest = json.loads((repo / "docs/results/gate-heldout-seeds.json").read_text())["seeds"][-1]["source"]["path"]
    raw = repo / latest  # the seed README and results.md quote, kept gzip-compressed
    assert raw.name.endswith(".json.gz")
    data = json.loads(gzip.decompress(raw.read_bytes()))
    data["summary"]["false_pass"] = 1
    data["summary"]["per_class"]["bad/token_soup"]["flagged"] = 5
    raw.write_bytes(gzip.compress(json.dumps(data).encode()))
    errors = check_claims(repo)
    assert len(errors) == 2 and all(f"{raw.name} makes it" in e for e in errors)
    assert any("'**1 of 133 garbled texts passed**" in e for e in errors)
    assert render_text(results, repo) != results  # the latest seed's per-class table


def test_a_renamed_raw_file_fails(tmp_path: Path) -> None:
    repo = _copy_repo(tmp_path)
    (repo / "docs" / "results" / "judge-engine.json").rename(repo / "docs" / "results" / "judge-engine-old.json")
    errors = check_claims(repo)
    assert len(errors) == 2 and all("raw file docs/results/judge-engine.json does not exist" in e for e in errors)


def test_claim_paths() -> None:
    data = {"a": {"b": [1, 2, 3], "c/d": {"n": 4}}, "rows": [{"k": "x", "v": 1}, {"k": "y", "v": 5},
                                                             {"k": "x", "v": 7}]}
    assert resolve(data, "a.b[0]") == 1 and resolve(data, "a.b[-1]") == 3
    assert resolve(data, 'a["c/d"].n') == 4
    assert resolve(data, "a.b|len") == 3 and resolve(data, "a.b|sum") == 6 and resolve(data, "a.b|mean") == 2
    assert resolve(data, "rows[*].v|max") == 7 and resolve(data, "rows[?k=x]|len") == 2
    assert resolve(data, "rows[?k=x].v|sum") == 8 and resolve(data, "a|len") == 2
    assert resolve(data, "rows[?k=x][?v=7]|len") == 1 and resolve(data, "rows[?k=x][?v=5]|len") == 0
    for bad, message in (("a.x", "no key 'x'"), ("a.b[9]", r"no element \[9\]"), ("rows[*].v", "several values"),
                         ("a.b|median", "unknown aggregate"), ("rows[*].k|sum", "needs numbers"), ("a..b", "parse")):
        with pytest.raises(ClaimError, match=message):
            resolve(data, bad)


def test_a_bad_manifest_line_is_named(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "claims.yaml").write_text(
        '- {doc: README.md, text: "{} x", raw: r.json, values: [a]}\n- {doc: README.md, text: "{} y", raw: r.json}\n')
    with pytest.raises(ClaimError, match=r"docs/claims.yaml:2: a claim has exactly the keys"):
        load_manifest(tmp_path)
    (tmp_path / "docs" / "claims.yaml").write_text('- {doc: README.md, text: "{} and {}", raw: r.json, values: [a]}\n')
    (tmp_path / "r.json").write_text('{"a": 1}')
    (tmp_path / "README.md").write_text("1 and 1\n")
    assert "cannot format" in check_claims(tmp_path, need_tracked=False)[0]


def test_code_links_comments_and_render_blocks_hold_no_claims() -> None:
    text = ("Run `make deploy RC=7` ([page](docs/x2.md)).\n<!-- note 3 -->\n```bash\nmake image RC=7\n```\n"
            "<!-- render: ci-run docs/results/x.json -->\n| a | 1 |\n<!-- /render -->\nPlain words.\n")
    assert unclaimed_numbers("README.md", text) == []
    assert unclaimed_numbers("README.md", text + "Took 91 s.\n") == ["README.md:10: Took 91 s."]
