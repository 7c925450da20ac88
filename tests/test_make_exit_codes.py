"""Exit codes through make: 0 pass, 1 a check failed, 2 bad input (mk/exit-code.inc). `make validate` and
`make loadtest` keep their tool's 0 / 1 / 2 apart, `make deploy` and the other targets say bad input with 2 and
one line, and `make render` refuses DDTree settings outside the rules with exit 2 and one line, as deploy does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglfleet.pipeline.procs import free_port
from testbed.simserver import SimServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[1]
DETECTORS = ["empty", "char_run", "ngram_loop", "token_soup", "bad_chars", "script_salad", "collapse",
             "subword_repeat", "mojibake", "word_order", "near_repeat"]


def make(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=500, check=False, env=env)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(free_port(), "--tokens", "8", "--itl-ms", "1") as srv:
        yield srv


def _profile(tmp_path: Path, disabled: list[str]) -> Path:
    p = tmp_path / f"gate-{len(disabled)}.yaml"
    p.write_text(json.dumps({"gate": {
        "temperatures": [0], "max_tokens": 8, "judge": {"enabled": False}, "determinism": {"enabled": False},
        "variation": {"enabled": False}, "quality": {"enabled": False}, "long_copy": {"enabled": False},
        "thresholds": {"disabled": disabled}}}))
    return p


def test_make_validate_keeps_pass_fail_and_bad_input_apart(sim: SimServer, tmp_path: Path) -> None:
    # every detector off: the simulator's answers pass; detectors on: its " tok0 tok1 ..." fails them
    ok = make("validate", f"TARGET={sim.url}", f"CONFIG={_profile(tmp_path, DETECTORS)}", f"OUT={tmp_path / 'p'}")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout.strip().splitlines()[-1])["verdict"] == "PASS"
    bad = make("validate", f"TARGET={sim.url}", f"CONFIG={_profile(tmp_path, [])}", f"OUT={tmp_path / 'f'}")
    assert bad.returncode == 1, bad.stderr[-2000:]
    assert json.loads(bad.stdout.strip().splitlines()[-1])["verdict"] == "FAIL"
    assert "make validate: FAILED (exit 1)" in bad.stderr
    unreachable = make("validate", "TARGET=http://127.0.0.1:9", f"OUT={tmp_path / 'u'}")
    assert unreachable.returncode == 2 and "error: cannot reach" in unreachable.stderr
    missing = make("validate")
    assert missing.returncode == 2 and "TARGET=http://host:port is required" in missing.stderr


def test_make_dry_run_does_not_run_the_gate() -> None:
    p = make("-n", "validate", "TARGET=http://127.0.0.1:9")
    assert p.returncode == 0 and "-m sglfleet.validation run --target http://127.0.0.1:9" in p.stdout


def _inventory(tmp_path: Path, budget: str) -> Path:
    inv = tmp_path / f"inv-{budget}"
    shutil.copytree(REPO / "src" / "sglfleet" / "ansible" / "inventories" / "example", inv)
    gv = inv / "group_vars" / "all.yml"
    text = gv.read_text()
    assert "serve_spec_ddtree_budget: 16" in text
    gv.write_text(text.replace("serve_spec_ddtree_budget: 16", f"serve_spec_ddtree_budget: {budget}"))
    return inv


def test_make_render_refuses_a_budget_outside_the_ddtree_rules(tmp_path: Path) -> None:
    good = make("render", "HOST=all", f"INVENTORY={_inventory(tmp_path, '16')}")
    assert good.returncode == 0, good.stderr[-2000:]
    bad = make("render", "HOST=all", f"INVENTORY={_inventory(tmp_path, '0')}")
    assert bad.returncode == 2, bad.stderr[-2000:]
    errors = [ln for ln in bad.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "DDTree settings cannot start" in errors[0] and "1..255" in errors[0], bad.stderr
    assert "Traceback" not in bad.stderr and "{" not in bad.stdout  # nothing rendered is printed


# ----------------------------------------------------------------------------- every target that runs a tool
KEPT = {"validate", "check-text", "record-baseline", "docs-check", "demo", "demo-light", "deploy",
        "deploy-target-only", "rollback", "status", "loadtest", "capacity"}


def test_every_target_that_runs_a_check_keeps_its_exit_code() -> None:
    db = make("-p", "-n", "help").stdout
    goals = next(ln for ln in db.splitlines() if ln.startswith("KEEP_RC_GOALS := ")).split(" := ")[1].split()
    assert set(goals) >= KEPT, KEPT - set(goals)


def test_make_loadtest_keeps_a_missed_slo_apart_from_bad_input(tmp_path: Path) -> None:
    with SimServer(free_port(), "--ttft-ms", "50", "--tokens", "4") as slow:
        missed = make("loadtest", f"TARGET={slow.url}", "USERS=1", "DURATION=3", "SLO_TTFT_MS=1",
                      f"OUT={tmp_path / 'slo'}")
    assert missed.returncode == 1, missed.stderr[-2000:]
    assert "SLO NOT met" in missed.stdout and "make loadtest: FAILED (exit 1)" in missed.stderr
    unreachable = make("loadtest", "TARGET=http://127.0.0.1:9", "USERS=1", "DURATION=2", f"OUT={tmp_path / 'u'}")
    assert unreachable.returncode == 2 and "error: cannot reach http://127.0.0.1:9" in unreachable.stderr
    missing = make("loadtest")
    assert missing.returncode == 2 and "error: TARGET is required" in missing.stderr


def _errors(p: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]


@pytest.mark.parametrize(("args", "says"), [
    (("deploy", "HOST=no-such-host", "IMAGE=reg.example/x:1"), "unknown HOST 'no-such-host'"),
    (("deploy", "HOST=all"), "set IMAGE="),
    (("deploy-target-only", "IMAGE=reg.example/x:1"), "set HOST="),
    (("rollback",), "set HOST="),
    (("status",), "set HOST="),
    (("capacity",), "TARGET is required"),
    (("check-text",), "FILE=texts.jsonl is required"),
    (("record-baseline", "TARGET=http://127.0.0.1:9"), "TARGET=... and OUT=baseline.json are required"),
])
def test_bad_input_is_2_with_one_error_line(args: tuple[str, ...], says: str) -> None:
    p = make(*args)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    errors = _errors(p)
    assert len(errors) == 1 and says in errors[0], p.stderr[-2000:]
    assert "Traceback" not in p.stderr


def test_a_dry_run_only_prints_and_check_mode_still_refuses_bad_input() -> None:
    dry = make("-n", "deploy", "HOST=all", "IMAGE=reg.example/x:1")
    assert dry.returncode == 0 and "-m sglfleet.flow deploy --hosts \"all\"" in dry.stdout
    p = make("deploy", "HOST=no-such-host", "IMAGE=reg.example/x:1", "CHECK=1")
    assert p.returncode == 2 and "make deploy: FAILED" not in p.stderr
