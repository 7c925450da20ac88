"""Where SGLang puts per-request speculative stats: the shapes a real server did not show in the
recorded fixtures (tests/validation/test_sglang_recorded_shapes.py covers the recorded ones: one
``sglext.spec_tokens_details`` object on the response and on a choice-less stream chunk), taken
from sglang 0.5.23's protocol.py (a list per choice when n > 1) and /generate's meta_info."""

from sglfleet.pipeline.client import _extract_spec


def test_sglext_list_on_choice() -> None:
    obj = {"choices": [{"sglext": {"spec_tokens_details": [{"spec_accept_length": 2.0, "spec_verify_ct": 3}]}}]}
    assert _extract_spec(obj) == (2.0, 3)


def test_meta_info_and_absent() -> None:
    assert _extract_spec({"meta_info": {"spec_verify_ct": 7}}) == (None, 7)
    assert _extract_spec({"choices": [{"message": {"content": "x"}}]}) == (None, None)


def test_sampled_output_ids_from_sglext() -> None:
    """`return_output_ids_in_sglext: true` (sglang 0.5.23 serving_chat.py): the stream's choice-less last chunk, or
    the response, carries sglext.output_ids, one list per choice; the first choice's ids are the answer's."""
    import pytest

    from sglfleet.pipeline.client import TargetError, _extract_output_ids

    chunk = {"id": "x", "choices": [], "sglext": {"output_ids": [[17, 4, 2]]}}
    assert _extract_output_ids(chunk) == [17, 4, 2]
    assert _extract_output_ids({"choices": [{"sglext": {"output_ids": [5, 6]}}]}) == [5, 6]
    assert _extract_output_ids({"choices": [{"delta": {"content": "a"}}]}) is None
    assert _extract_output_ids({"sglext": {"spec_tokens_details": {"spec_verify_ct": 1}}}) is None
    with pytest.raises(TargetError, match="output_ids"):
        _extract_output_ids({"sglext": {"output_ids": [["a"]]}})
