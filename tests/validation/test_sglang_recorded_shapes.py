"""The gate's SGLang readers against responses recorded from a real sglang 0.5.23 server on the H200
(tests/fixtures/sglang-0.5.23/*.json, written by tests/ddtree/incident.py's fixtures(): a base server,
DFLASH's chain and DDTree at budget 16 / top-k 4, SmolLM2-135M; the file says when and how)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglfleet.pipeline.client import _extract_spec
from sglfleet.validation.gate import seeds_ignored_reason
from sglfleet.validation.spec import parse_prometheus

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.23"
SPEC = ("chain", "patched-b16-k4")


def load(name: str) -> dict:
    return json.loads((FIX / f"{name}.json").read_text())


@pytest.mark.parametrize("name", SPEC)
def test_chat_completion_spec_details_are_read_from_sglext(name: str) -> None:
    doc = load(name)
    det = doc["chat"]["sglext"]["spec_tokens_details"]
    assert isinstance(det, dict)  # 0.5.23 gives one object, not a list
    assert _extract_spec(doc["chat"]) == (pytest.approx(det["spec_accept_length"]), det["spec_verify_ct"])
    assert det["spec_accept_length"] > 1.0  # a real multi-token commit was recorded


@pytest.mark.parametrize("name", SPEC)
def test_streamed_spec_details_arrive_in_a_chunk_without_choices(name: str) -> None:
    chunks = [json.loads(ln[len("data: "):]) for ln in load(name)["chat_stream_lines"]
              if ln.startswith("data: {")]
    found = [_extract_spec(c) for c in chunks if _extract_spec(c) != (None, None)]
    assert found, "no chunk carried spec_tokens_details"
    holder = next(c for c in chunks if "sglext" in c)
    assert holder["choices"] == []  # the details ride a chunk of their own, at the top level
    acc, ct = found[-1]
    assert acc == pytest.approx(holder["sglext"]["spec_tokens_details"]["spec_accept_length"]) and ct > 0


@pytest.mark.parametrize("name", SPEC)
def test_generate_meta_info_and_server_info_and_prometheus(name: str) -> None:
    doc = load(name)
    meta = doc["generate"]["meta_info"]
    assert _extract_spec(doc["generate"]) == (pytest.approx(meta["spec_accept_length"]), meta["spec_verify_ct"])
    states = doc["server_info"]["internal_states"]
    assert isinstance(states, list) and states[0]["avg_spec_accept_length"] > 1.0
    reading = parse_prometheus("\n".join(doc["metrics_spec_lines"]))
    assert reading is not None and reading.accept_length > 1.0


def test_the_base_server_reports_no_speculation() -> None:
    doc = load("base")
    assert _extract_spec(doc["chat"]) == (None, None)
    assert "avg_spec_accept_length" not in doc["server_info"]["internal_states"][0] or \
        not doc["server_info"]["internal_states"][0]["avg_spec_accept_length"]


def test_seed_check_is_not_applicable_where_sglang_ignores_seeds() -> None:
    info = load("base")["server_info"]
    assert info["internal_states"][0]["enable_deterministic_inference"] is False
    assert "enable-deterministic-inference" in seeds_ignored_reason("sglang", info)
    on = json.loads(json.dumps(info))
    on["internal_states"][0]["enable_deterministic_inference"] = True
    assert seeds_ignored_reason("sglang", on) is None
    assert seeds_ignored_reason("llama.cpp", info) is None
    assert seeds_ignored_reason("sglang", None) is None


@pytest.mark.parametrize("name", ["base", *SPEC])
def test_continue_final_message_continues_the_prefix_with_byte_exact_logprobs(name: str) -> None:
    """What the lossless check's re-anchoring sends and reads (validation/gate.py Gate._reanchor_fn):
    sglang returns only the continuation of the assistant prefix 'Red, green', and the log-prob tokens'
    bytes spell exactly that content, so the continuation can be compared byte for byte."""
    from sglfleet.pipeline.client import _extract_logprobs
    from sglfleet.validation.lossless import spelled

    resp = load(name)["chat_continue"]
    choice = resp["choices"][0]
    content = choice["message"]["content"]
    assert not content.startswith("Red") and content.startswith(",")  # the prefix is not repeated
    rows = _extract_logprobs(choice)
    assert rows and all(len(top) == 5 and top[0][1] >= top[-1][1] for _, _, top in rows)
    mine = spelled(rows, content)
    assert mine is not None
    if choice["finish_reason"] == "stop":  # the end-of-turn token is listed after the content
        assert len(mine) == len(rows) - 1 and rows[-1][0] == b"<|im_end|>"
    else:
        assert mine == rows
