"""The DDTree rules on rendered commands (rollout/serve_args.py): unit cases; the example
inventory's real render is parsed by sglang itself in tests/ddtree/test_ddtree_args.py."""

from __future__ import annotations

import pytest

from sglfleet.pipeline.errors import UsageError
from sglfleet.rollout.serve_args import _ddtree_rules, check_serve_command, ddtree_args_of

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
     "b300-01: DDTree settings cannot start: DDTree runs under the overlap scheduler only when the server opts in"),
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


OVERLAP = [x for x in GOOD if x != "--disable-overlap-schedule"]  # DDTree under sglang's overlap scheduler
HOST_ENV = {"SGLANG_TIMEOUT_KEEP_ALIVE": "120", "NCCL_P2P_LEVEL": "PHB"}  # what a host's rendered env carries


def test_the_hosts_own_opt_in_lets_the_overlap_scheduler_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve_spec_ddtree_overlap renders SGLANG_DDTREE_OVERLAP=1 into the host's container env and leaves
    --disable-overlap-schedule out: that host's command resolves, whatever the controller's environment says."""
    for controller in ("0", None):
        if controller is None:
            monkeypatch.delenv("SGLANG_DDTREE_OVERLAP", raising=False)
        else:
            monkeypatch.setenv("SGLANG_DDTREE_OVERLAP", controller)
        r = check_serve_command("b300-01", OVERLAP, {**HOST_ENV, "SGLANG_DDTREE_OVERLAP": "1"})
        assert (r.budget, r.topk, r.verify_width) == (16, 4, 17)
    # an opt-in beside the flag: the flag wins, the server runs without the overlap scheduler
    assert check_serve_command("b300-01", GOOD, {"SGLANG_DDTREE_OVERLAP": "1"}).verify_width == 17


@pytest.mark.parametrize("env", [None, {}, HOST_ENV])
def test_no_opt_in_and_no_flag_is_refused_as_before(env: dict[str, str] | None) -> None:
    with pytest.raises(UsageError, match=r"b300-01: DDTree settings cannot start: .*add --disable-overlap-schedule"):
        check_serve_command("b300-01", OVERLAP, env)
    assert check_serve_command("b300-01", GOOD, env).verify_width == 17  # with the flag: as today


@pytest.mark.parametrize("value", ["1", " 1 ", "0", "true", "yes", "on", "", "01", 1])
def test_an_opt_in_counts_exactly_as_the_plugin_reads_it(value: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what sglang_ddtree.config.overlap_opted_in takes for the opt-in (the value 1, stripped) lets the overlap
    scheduler through; any other value is refused like no opt-in at all, as the host's server would refuse it."""
    monkeypatch.setenv("SGLANG_DDTREE_OVERLAP", "1")  # the controller's own opt-in never counts
    rules = _ddtree_rules()
    env = {**HOST_ENV, rules.OVERLAP_ENV: value}
    if rules.overlap_opted_in(env):
        assert value in ("1", " 1 ", 1)
        assert check_serve_command("b300-01", OVERLAP, env).verify_width == 17
    else:
        with pytest.raises(UsageError, match="add --disable-overlap-schedule, or set SGLANG_DDTREE_OVERLAP=1"):
            check_serve_command("b300-01", OVERLAP, env)


@pytest.mark.parametrize("command", [
    ["--model-path", "/models/k", "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/d",
     "--speculative-num-draft-tokens", "8"],
    ["--model-path", "/models/k", "--attention-backend", "triton"],
])
def test_an_opt_in_without_ddtree_is_bad_input(command: list[str]) -> None:
    """serve_spec_ddtree_overlap: true on a host that runs no DDTree (DFLASH's chain, the target alone) is one
    clear error naming the setting; without the opt-in the same command passes as before."""
    with pytest.raises(UsageError) as e:
        check_serve_command("b300-01", command, {**HOST_ENV, "SGLANG_DDTREE_OVERLAP": "1"})
    msg = str(e.value)
    assert msg.startswith("b300-01: SGLANG_DDTREE_OVERLAP=1") and "runs no DDTree" in msg
    assert "serve_spec_ddtree_overlap" in msg and "\n" not in msg
    assert check_serve_command("b300-01", command, HOST_ENV) is None
    assert check_serve_command("b300-01", command, {"SGLANG_DDTREE_OVERLAP": "0"}) is None
