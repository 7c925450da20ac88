"""The ids llama.cpp's server sampled, read from its log-prob entries (pipeline.client.ids_from_logprobs).

Shapes as the real server (xllamacpp 2026.10) sends them: each `logprobs.content` entry has `id`, `token`,
`bytes`, `logprob`; a character the sampler drew as several tokens (an emoji, 2 tokens in SmolLM2) is ONE entry
with the last token's id and the whole character's bytes; completion_tokens counts every token drawn, the
end-of-turn token of a stopped answer included. The live test asks the real embedded server."""

from __future__ import annotations

import pytest

from sglfleet.pipeline.client import OpenAIClient, ids_from_logprobs
from sglfleet.pipeline.embedded import EmbeddedServer


def _e(i: object, text: str) -> dict:
    return {"id": i, "token": text, "bytes": list(text.encode()), "logprob": -0.5, "top_logprobs": []}


HI = [_e(4590, "Here"), _e(359, " are"), _e(198, "\n")]


def test_every_entry_named_and_counted_gives_the_ids() -> None:
    assert ids_from_logprobs(HI, "Here are\n", 3, stopped=False) == [4590, 359, 198]
    # a stopped answer: completion_tokens counts the end-of-turn token, which has no entry
    assert ids_from_logprobs(HI, "Here are\n", 4, stopped=True) == [4590, 359, 198]


def test_a_folded_multi_token_character_gives_no_ids() -> None:
    # "🍻" drawn as two tokens: one entry (the last id, four bytes); the bytes still join to the text
    folded = [*HI, _e(136, "🍻")]
    assert b"".join(bytes(e["bytes"]) for e in folded) == "Here are\n🍻".encode()
    assert ids_from_logprobs(folded, "Here are\n🍻", 5, stopped=False) is None
    assert ids_from_logprobs(folded, "Here are\n🍻", 6, stopped=True) is None


@pytest.mark.parametrize("entries, text, n", [
    (HI, "Here are\n", None),                     # no count: a fold could not be seen
    (HI, "Here were\n", 3),                       # bytes do not join to the text (a chunk lost)
    (HI[:2], "Here are\n", 3),                    # an entry missing
    ([*HI[:2], _e(True, "\n")], "Here are\n", 3),  # not an int id
    ([*HI[:2], {"id": 198, "token": "\n"}], "Here are\n", 3),  # no bytes
    ([], "", 0),
])
def test_anything_short_of_all_ids_gives_none(entries: list, text: str, n: int | None) -> None:
    assert ids_from_logprobs(entries, text, n, stopped=False) is None


@pytest.mark.integration
def test_the_real_server_names_the_ids_it_sampled(embedded_target: EmbeddedServer) -> None:
    """At T=0.8 with one alternative asked: the ids decode to exactly the text, one per token drawn; the same
    seed without log-probs samples the same text (asking for them does not change the sampler)."""
    from sglfleet.validation.config import GateConfig
    from sglfleet.validation.scorers import make_scorer

    client = OpenAIClient(embedded_target.url)
    msgs = [{"role": "user", "content": "Name three rivers of Europe, one line each."}]
    got = client.chat(msgs, max_tokens=40, temperature=0.8, top_p=0.95, seed=7, stream=True, top_logprobs=1)
    plain = client.chat(msgs, max_tokens=40, temperature=0.8, top_p=0.95, seed=7, stream=True)
    client.close()
    assert got.text == plain.text and plain.output_ids is None
    assert got.output_ids is not None, got.text
    assert len(got.output_ids) == got.completion_tokens - (got.finish_reason == "stop")
    ref = make_scorer("reference", GateConfig(), model="smollm2-135m-instruct")
    try:
        assert "".join(ref._judge.pieces(got.output_ids)) == got.text
        scored = ref.score(msgs, got.text, 0.8, ids=tuple(got.output_ids), stop=got.finish_reason == "stop")
        assert scored.error is None and scored.n_tokens == got.completion_tokens
        assert min(scored.support_logprobs) > -18  # a drawn token is never "impossible" under its own model
    finally:
        ref.close()
