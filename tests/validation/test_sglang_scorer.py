"""sglfleet.validation.scorers.SGLangScorer against a peer that speaks SGLang 0.5.23's scoring protocol, backed by
the embedded target's reference model (real SGLang needs a GPU: the scorer ran on the H200, docs/gpu-runs.md).

The peer follows sglang/srt/managers/scheduler_components/logprob_result_processor.py: input log-probs start
at `logprob_start_len`, the first row is None and each later row is log p(token | everything before it),
top alternatives likewise; `/tokenize` takes `prompt` or chat `messages`; `/detokenize` takes a list of lists.
So SGLang's answer to the scorer is the reference model's own, and the scores must agree."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from sglfleet.pipeline.errors import UsageError
from sglfleet.validation.config import GateConfig
from sglfleet.validation.scorers import ScoreRequest, SGLangScorer, make_scorer, render_chat, score_all

MSG = [{"role": "user", "content": "Write a short poem about the ocean."}]
ANSWER = "The ocean hums a song of blue,\nof tides that come and go."


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    m = rows.max(axis=1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=1, keepdims=True))


@pytest.fixture(scope="module")
def reference() -> Iterator:
    s = make_scorer("reference", GateConfig(), model="smollm2-135m-instruct")
    yield s
    s.close()


def _peer(ref, *, shift: bool = True) -> tuple[ThreadingHTTPServer, str]:
    """shift=False: a server whose rows are not aligned to their tokens (the first row dropped, not None)."""
    j = ref._judge

    calls: dict[str, int] = {}

    def generate(body: dict) -> dict | list:
        ids_in = body["input_ids"]
        if ids_in and isinstance(ids_in[0], list):  # a batch: per-input logprob_start_len (a list or one int)
            starts = body.get("logprob_start_len", -1)
            starts = starts if isinstance(starts, list) else [starts] * len(ids_in)
            return [generate({**body, "input_ids": x, "logprob_start_len": st})
                    for x, st in zip(ids_in, starts, strict=True)]
        ids = [int(x) for x in ids_in]
        start = int(body.get("logprob_start_len", -1))
        k = int(body.get("top_logprobs_num") or 0)
        if start < 0 or start >= len(ids):
            raise ValueError("logprob_start_len out of range")
        lsm = _log_softmax(np.asarray(j.logits(ids[: start + 1], ids[start + 1:]), dtype=np.float64))
        vals = [(float(lsm[r, t]), t, None) for r, t in enumerate(ids[start + 1:])]
        tops = [[(float(lsm[r, i]), int(i), None) for i in np.argsort(-lsm[r])[:k]] for r in range(lsm.shape[0])]
        if shift:
            vals, tops = [(None, ids[start], None), *vals], [None, *tops]
        return {"text": "", "meta_info": {"input_token_logprobs": vals, "input_top_logprobs": tops if k else None,
                                          "completion_tokens": 0, "finish_reason": {"type": "length", "length": 0}}}

    def tokenize(body: dict) -> dict:
        if body.get("messages") is not None:
            text = render_chat(ref.template, body["messages"], ref._bos, ref._eos,
                               add_generation_prompt=body.get("add_generation_prompt") is not False)
        elif isinstance(body["prompt"], list):  # sglang's list form: one token list per prompt
            toks = [ref.tokenize(t) for t in body["prompt"]]
            return {"tokens": toks, "count": [len(t) for t in toks], "max_model_len": 8192}
        else:
            text = body["prompt"]
        toks = ref.tokenize(text)
        return {"tokens": toks, "count": len(toks), "max_model_len": 8192}

    def detokenize(body: dict) -> dict:
        tk = j._tk._tok
        lists = body["tokens"]
        return {"text": [tk.decode(x, skip_special_tokens=False) for x in lists] if lists and
                isinstance(lists[0], list) else tk.decode(lists)}

    posts = {"/generate": generate, "/tokenize": tokenize, "/detokenize": detokenize}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, obj: object) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "smollm2-135m-instruct", "object": "model"}]})
            elif self.path == "/server_info":
                self._send(200, {"version": "0.5.23"})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            fn = posts.get(self.path)
            calls[self.path] = calls.get(self.path, 0) + 1
            if fn is None:
                self._send(404, {"error": "not found"})
                return
            try:
                self._send(200, fn(body))
            except (ValueError, KeyError) as exc:
                self._send(400, {"error": str(exc)})

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.calls = calls  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def test_the_sglang_scorer_gives_the_models_own_scores(reference) -> None:
    srv, url = _peer(reference)
    try:
        s = make_scorer(url, GateConfig(), model="smollm2-135m-instruct")
        assert isinstance(s, SGLangScorer) and s.eos_id == reference.eos_id   # learnt from the chat template
        for t in (1.0, 0.8):
            mine, ref = s.score(MSG, ANSWER, t, stop=True), reference.score(MSG, ANSWER, t, stop=True)
            assert mine.error is None and mine.n_tokens == ref.n_tokens > 10
            np.testing.assert_allclose(mine.token_logprobs, ref.token_logprobs, atol=1e-4)  # log p_1: exact
            # log p_T from the top-k only over-estimates p_T (conservative), never under-estimates it
            assert np.all(np.asarray(mine.support_logprobs) >= np.asarray(ref.support_logprobs) - 1e-4)
        assert mine.pieces[-1] == "<|im_end|>" and "".join(mine.pieces[:-1]) == ANSWER
        s.close()
    finally:
        srv.shutdown()


def test_a_server_whose_rows_miss_their_tokens_cannot_score(reference) -> None:
    srv, url = _peer(reference, shift=False)
    try:
        with pytest.raises(UsageError, match="cannot return input log-probs"):
            make_scorer(url, GateConfig(), model="smollm2-135m-instruct")
    finally:
        srv.shutdown()


def test_a_scorer_serving_another_model_is_refused(reference) -> None:
    srv, url = _peer(reference)
    try:
        with pytest.raises(UsageError, match="not the candidate's model"):
            make_scorer(url, GateConfig(), model="llama-3-8b")
    finally:
        srv.shutdown()


def test_batched_scores_equal_one_by_one_in_a_few_requests(reference) -> None:
    """score_many (what the gate uses: 20 gates at once sent about 15 000 scoring requests to one H200 server,
    2026-12-03) gives every answer the numbers score gives it, in five requests for five answers of two
    prompts; an empty answer keeps its own error, and one that stopped is scored on its end token, as score does."""
    srv, url = _peer(reference)
    try:
        s = make_scorer(url, GateConfig(), model="smollm2-135m-instruct")
        msgs2 = [{"role": "user", "content": "Name three colours."}]
        reqs = [ScoreRequest(MSG, ANSWER, 0.8, "poem", 1, True), ScoreRequest(msgs2, "Red, green and blue.", 1.0,
                                                                             "colours", 2, False),
                ScoreRequest(MSG, "", 0.6, "poem", 3), ScoreRequest(MSG, ANSWER[:20], 1.0, "poem", 4, True),
                ScoreRequest(msgs2, "", 0.8, "colours", 5, True)]  # empty but stopped: its end token is scored
        srv.calls.clear()
        many = score_all(s, reqs)
        assert srv.calls == {"/tokenize": 3, "/generate": 1, "/detokenize": 1}  # answers, 2 prompts; 1; 1
        assert many[2].error == "empty answer" and many[4].error is None and many[4].n_tokens == 1
        for r, got in zip(reqs, many, strict=True):
            if not r.answer and not r.stop:
                continue
            one = s.score(r.messages, r.answer, r.temperature, prompt_id=r.prompt_id, seed=r.seed, stop=r.stop)
            assert got.error is None and (got.prompt_id, got.seed) == (r.prompt_id, r.seed)
            np.testing.assert_allclose(got.token_logprobs, one.token_logprobs, atol=1e-9)
            np.testing.assert_allclose(got.support_logprobs, one.support_logprobs, atol=1e-9)
            assert got.pieces == one.pieces
        with pytest.raises(ValueError, match="T>0"):
            s.score_many([ScoreRequest(MSG, ANSWER, 0.0)])
        s.close()
    finally:
        srv.shutdown()


def test_a_batch_the_server_refuses_is_scored_one_by_one(reference) -> None:
    """A server that answers batches with an error (an older sglang, a proxy): every answer is still scored, one
    by one, with the same numbers."""
    srv, url = _peer(reference)
    try:
        s = make_scorer(url, GateConfig(), model="smollm2-135m-instruct")
        real = s._post

        def no_batches(path: str, body: dict):
            if isinstance(body.get("prompt"), list):
                raise ValueError(f"{url}{path} answered HTTP 400: batch")
            return real(path, body)

        s._post = no_batches
        reqs = [ScoreRequest(MSG, ANSWER, 0.8, "poem", 1, True), ScoreRequest(MSG, ANSWER[:30], 1.0, "poem", 2)]
        got = score_all(s, reqs)
        assert [g.error for g in got] == [None, None]
        one = s.score(MSG, ANSWER, 0.8, prompt_id="poem", seed=1, stop=True)
        np.testing.assert_allclose(got[0].token_logprobs, one.token_logprobs, atol=1e-9)
        s.close()
    finally:
        srv.shutdown()


LIST_MSG = [{"role": "user", "content": "List five fruits as a markdown bullet list, one per line."}]
LIST_TEXT = "#1: Apples\n#2: Grapes\n#3: Bananas\n#4: Oranges\n#5: Orterolle\n\nInclude markdown bullet points."


def test_sampled_ids_are_scored_not_the_text_re_tokenized(reference) -> None:
    """The H200 case (2026-12-03, a correct DDTree build refused at T=0.8): the sampler drew " Or" "ter" "ol" "le";
    the text re-tokenized reads " Or" "terol" "le", and "terol" there has log p -23.8 under the target, a token
    no correct sampler emits. Given the sampled ids the scorer scores those (one by one and batched, with no
    /tokenize of the answer), and the likelihood test sees no impossible token; given the text alone it does."""
    srv, url = _peer(reference)
    try:
        s = make_scorer(url, GateConfig(), model="smollm2-135m-instruct")
        canon = s.tokenize(LIST_TEXT)
        at = canon.index(s.tokenize("terol")[0])
        pieces = ["ter", "ol", "le"]
        drawn = tuple(canon[:at] + [s.tokenize(p)[0] for p in pieces] + canon[at + 2:])  # "terol" "le" -> 3 ids
        assert reference._judge._tk._tok.decode(list(drawn)) == LIST_TEXT and list(drawn) != canon
        text_score = s.score(LIST_MSG, LIST_TEXT, 0.8, stop=True)
        srv.calls.clear()
        id_score = s.score(LIST_MSG, LIST_TEXT, 0.8, stop=True, ids=drawn)
        assert "/tokenize" in srv.calls and srv.calls["/tokenize"] == 1  # the prompt only, not the answer
        assert min(text_score.token_logprobs) < -20 < min(id_score.token_logprobs)
        assert id_score.n_tokens == len(drawn) + 1 and id_score.pieces[-1] == "<|im_end|>"
        srv.calls.clear()
        (batched,) = score_all(s, [ScoreRequest(LIST_MSG, LIST_TEXT, 0.8, "list", 1, True, drawn)])
        assert srv.calls.get("/tokenize") == 1 and srv.calls.get("/generate") == 1
        np.testing.assert_allclose(batched.token_logprobs, id_score.token_logprobs, atol=1e-9)
        # ids that already end with the end-of-turn token (SGLang's output_ids hold the stop token) get it once
        again = s.score(LIST_MSG, LIST_TEXT, 0.8, stop=True, ids=(*drawn, s.eos_id))
        assert again.n_tokens == id_score.n_tokens
        s.close()
    finally:
        srv.shutdown()


def test_ids_are_used_only_when_both_sides_have_them(reference) -> None:
    """likelihood_verdicts scores the two sides alike: ids only when both sides have them somewhere (a side with
    none, e.g. a baseline recorded before ids were kept, puts both on text); then each answer on its own ids, an
    answer without ids (llama.cpp folds a multi-token character) on its text. The verdict counts them."""
    from sglfleet.validation.likelihood import Answer, likelihood_verdicts

    seen: list[tuple[int, ...] | None] = []

    class Recorder:
        name = "recorder"
        scores_ids = True

        def score(self, messages, answer, temperature, *, prompt_id="", seed=None, stop=False, ids=None):
            seen.append(ids)
            return reference.score(messages, answer, temperature, prompt_id=prompt_id, seed=seed, stop=stop)

        def close(self) -> None:
            pass

    cfg = GateConfig(likelihood={"power_reps": 0})
    ids = tuple(reference.tokenize(ANSWER))
    cand = [Answer("poem", 0.8, 1, ANSWER, True, ids), Answer("poem", 0.8, 3, ANSWER, True, None)]
    for base_ids, want, counts in ((ids, [ids, ids, None], {"candidate": 1, "baseline": 1}),
                                   (None, [None, None, None], {"candidate": 0, "baseline": 0})):
        seen.clear()
        (v,) = likelihood_verdicts(cand, [Answer("poem", 0.8, 2, ANSWER, True, base_ids)], Recorder(), cfg,
                                   lambda _p: MSG, [0.8])
        assert seen == want
        assert v.on_ids == counts and v.as_dict()["on_ids"] == counts


def _recorded_rows(reference) -> list:
    """Baseline rows as record-baseline keeps them (real ids of the reference tokenizer): an answer that ended on
    the end-of-turn token, one that stopped on a stop string, one cut at its token budget."""
    from sglfleet.validation.samples import Sample

    plain = {"top_p": 1.0, "top_k": 0, "min_p": 0.0}
    rows = [("poem", 0.8, 11, ANSWER, "stop", plain),
            ("poem", 1.0, 12, "The ocean hums a song of blue", "stop", {**plain, "top_p": 0.95, "stop": [". ", "\n"]}),
            ("poem", 0.6, 13, "The ocean hums a song", "length", plain)]
    out = []
    for pid, t, seed, text, fin, sampling in rows:
        s = Sample(pid, t, seed, "suite", 64, text=text, finish_reason=fin, sampling=sampling)
        s.output_ids = list(reference.tokenize(text))
        out.append(s)
    return out


def test_record_baseline_scores_stop_string_answers_as_the_gate_does(reference) -> None:
    """The recorded target-only scores follow the gate's end-of-turn rule (scorers.ended_at_end_of_turn): an answer
    that stopped on a stop string is scored without an end. Recorded with one (2026-12-05, H200), every
    production-sequence gate refused its scorer ("55 tokens scored, 56 recorded"), correct builds included."""
    from sglfleet.validation.baseline import BaselineSample
    from sglfleet.validation.likelihood import Answer, check_trust
    from sglfleet.validation.scorers import check_recorded_scores, ended_at_end_of_turn, record_scores

    samples = _recorded_rows(reference)
    srv, url = _peer(reference)
    try:
        cfg = GateConfig()
        rec = record_scores(url, cfg, "smollm2-135m-instruct", None, samples, {"poem": MSG})
        lens = [len(rec["logprobs"][f"poem@T{s.temperature:g}/seed{s.seed}"]) for s in samples]
        assert lens == [len(samples[0].output_ids) + 1, len(samples[1].output_ids), len(samples[2].output_ids)]
        rows = [BaselineSample(s.prompt_id, s.temperature, s.seed, s.text, s.finish_reason, tuple(s.output_ids),
                               s.sampling) for s in samples]
        check_recorded_scores(rec, rows, "b.json")  # consistent: no error
        # the gate's side: the same answers as the gate builds them, scored by the candidate (here the same peer)
        scorer = make_scorer(url, cfg, model="smollm2-135m-instruct")
        answers = [Answer(r.prompt_id, r.temperature, r.seed, r.text, ended_at_end_of_turn(r.finish_reason, r.sampling),
                          r.output_ids, r.params()) for r in rows]
        got = score_all(scorer, [ScoreRequest(MSG, a.text, a.temperature, a.prompt_id, a.seed, bool(a.stopped), a.ids,
                                              a.params) for a in answers])
        scorer.close()
        trust = check_trust(rec["logprobs"], got, "candidate", cfg.likelihood)
        assert trust.ok and trust.answers == 3, trust.reason
        # a file recorded the old way (an end scored after the stop-string answer) is refused at load, naming it
        old = {**rec, "logprobs": {**rec["logprobs"], "poem@T1/seed12": [*rec["logprobs"]["poem@T1/seed12"], -0.1]}}
        with pytest.raises(UsageError, match=r"poem@T1/seed12: .*stopped on a stop string.*re-record"):
            check_recorded_scores(old, rows, "b.json")
    finally:
        srv.shutdown()


def test_the_next_token_row_is_the_prefills_row_after_the_text(reference) -> None:
    """lossless_t0's placer (Gate._placer) on SGLang: the row of one more input position after the assistant text,
    from the prefill's input log-probs, is the model's next-token law there; the same tokens and log-probs as the
    reference model's own row, in one /generate call."""
    srv, url = _peer(reference)
    try:
        s = make_scorer(url, GateConfig(), model="smollm2-135m-instruct")
        before = dict(srv.calls)  # type: ignore[attr-defined]
        for prefix in ("The ocean hums a", ""):
            mine, ref = s.next_token_row(MSG, prefix, 32), reference.next_token_row(MSG, prefix, 32)
            assert [a for a, _ in mine] == [a for a, _ in ref] and len(mine) == 32
            np.testing.assert_allclose([lp for _, lp in mine], [lp for _, lp in ref], atol=1e-4)
        assert srv.calls["/generate"] - before.get("/generate", 0) == 2  # type: ignore[attr-defined]
        s.close()
    finally:
        srv.shutdown()
