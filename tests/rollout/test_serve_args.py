"""The DDTree rules on rendered commands (rollout/serve_args.py): unit cases; the example
inventory's real render is parsed by sglang itself in tests/ddtree/test_ddtree_args.py."""

from __future__ import annotations

import pytest

from sglfleet.pipeline.errors import UsageError
from sglfleet.rollout.serve_args import check_serve_command, ddtree_args_of

GOOD = ["--model-path", "/models/k", "--attention-backend", "triton", "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", "/models/d", "--speculative-num-draft-tokens", "8",
        "--speculative-ddtree-budget", "16", "--speculative-ddtree-topk", "4", "--disable-overlap-schedule"]


def test_a_good_command_resolves() -> None:
    r = check_serve_command("b300-01", GOOD)
    assert (r.budget, r.topk, r.verify_width) == (16, 4, 17)
    assert check_serve_command("h", ["--model-path", "/m", "--speculative-algorithm", "DFLASH"]) is None
    assert ddtree_args_of(["--speculative-ddtree-budget=7", "--page-size=1"]) == {"budget": "7", "page_size": "1"}


@pytest.mark.parametrize("edit,message", [
    (lambda c: [x for x in c if x != "--disable-overlap-schedule"],
     "b300-01: DDTree settings cannot start: DDTree under the overlap scheduler is built but not yet shown exact"),
    (lambda c: [("trtllm_mha" if x == "triton" else x) for x in c], "--attention-backend trtllm_mha has no tree-mask"),
    (lambda c: [("0" if x == "16" else x) for x in c], "must be in 1..255"),
    (lambda c: [*c, "--page-size", "64"], "--page-size must be 1"),
    (lambda c: [x for x in c if x not in ("--speculative-ddtree-budget", "16")],
     "topk without --speculative-ddtree-budget"),
])
def test_bad_settings_are_one_clear_error_naming_the_host(edit, message: str) -> None:
    with pytest.raises(UsageError) as e:
        check_serve_command("b300-01", edit(list(GOOD)))
    assert message in str(e.value)


def test_the_controllers_overlap_opt_in_is_not_a_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLANG_DDTREE_OVERLAP=1 opts a server process into the overlap scheduler; set on the controller it must not
    let a host's command without --disable-overlap-schedule through (the host's server would refuse it)."""
    monkeypatch.setenv("SGLANG_DDTREE_OVERLAP", "1")
    with pytest.raises(UsageError, match="add --disable-overlap-schedule"):
        check_serve_command("b300-01", [x for x in GOOD if x != "--disable-overlap-schedule"])
