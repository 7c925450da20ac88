"""Where SGLang puts per-request speculative stats (shapes from sglang 0.5.23's protocol.py)."""

from pipeline.client import _extract_spec


def test_sglext_on_response() -> None:
    obj = {"choices": [{"message": {"content": "x"}}],
           "sglext": {"spec_tokens_details": {"spec_accept_length": 4.8, "spec_verify_ct": 25}}}
    assert _extract_spec(obj) == (4.8, 25)


def test_sglext_list_on_choice() -> None:
    obj = {"choices": [{"sglext": {"spec_tokens_details": [{"spec_accept_length": 2.0, "spec_verify_ct": 3}]}}]}
    assert _extract_spec(obj) == (2.0, 3)


def test_meta_info_and_absent() -> None:
    assert _extract_spec({"meta_info": {"spec_verify_ct": 7}}) == (None, 7)
    assert _extract_spec({"choices": [{"message": {"content": "x"}}]}) == (None, None)
