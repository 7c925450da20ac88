"""DDTree server arguments: the rules (sglang_ddtree.config) and sglang 0.5.23's own parser on
the command the rollout renders for every host of the example inventory (CPU; the sglang wheel
comes from PyPI through `patches`, the series is applied as in the image)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import functions_from, series_tree
from sglang_ddtree.config import DDTreeArgError, max_tree_nodes, resolve

ROOT = Path(__file__).resolve().parents[2]

GOOD = dict(budget=16, topk=4, block_size=8, algorithm="DFLASH", draft_model_path="/m/d",
            attention_backend="triton", page_size=1, disable_overlap_schedule=True)


def test_good_arguments_resolve_and_the_verify_width_is_derived() -> None:
    r = resolve(**GOOD)
    assert (r.budget, r.topk, r.verify_width, r.max_depth) == (16, 4, 17, 7)
    assert resolve(**{**GOOD, "topk": None}).topk == 4
    assert resolve(**{**GOOD, "verify_num_tokens": 17}).verify_width == 17
    assert resolve(**{**GOOD, "attention_backend": "flashinfer"}).budget == 16
    assert max_tree_nodes(8, 1) == 7 and max_tree_nodes(3, 2) == 6


@pytest.mark.parametrize(
    "change,message",
    [
        ({"budget": 0}, "must be in 1..255"),
        ({"budget": "x"}, "must be an integer"),
        ({"budget": 8, "topk": 1}, "exceeds the largest tree a block of 8 holds with top-k 1 (7 nodes"),
        ({"topk": 0}, "--speculative-ddtree-topk must be in 1..64"),
        ({"attention_backend": "trtllm_mha"}, "--attention-backend trtllm_mha has no tree-mask target verify"),
        ({"attention_backend": None}, "set --attention-backend to one of triton, flashinfer"),
        ({"decode_attention_backend": "fa3"}, "--decode-attention-backend fa3"),
        ({"page_size": 16}, "--page-size must be 1"),
        ({"disable_overlap_schedule": False}, "add --disable-overlap-schedule"),
        ({"draft_model_path": None}, "--speculative-draft-model-path"),
        ({"algorithm": "EAGLE"}, "set --speculative-algorithm DFLASH"),
        ({"verify_num_tokens": 8}, "contradicts --speculative-ddtree-budget 16"),
        ({"block_size": 1}, "at least 2"),
    ],
)
def test_bad_arguments_are_one_clear_error(change: dict, message: str) -> None:
    with pytest.raises(DDTreeArgError) as e:
        resolve(**{**GOOD, **change})
    assert message in str(e.value)


def test_the_overlap_scheduler_is_refused_unless_opted_into(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overlap path is an opt-in per server (gated exact at b16/k4 on an H100): refused by default, run with
    SGLANG_DDTREE_OVERLAP=1 in the server's environment (or an explicit opt-in), and an explicit refusal wins."""
    on = {**GOOD, "disable_overlap_schedule": False}
    monkeypatch.delenv("SGLANG_DDTREE_OVERLAP", raising=False)
    with pytest.raises(DDTreeArgError, match="SGLANG_DDTREE_OVERLAP=1"):
        resolve(**on)
    for v in ("0", "yes", ""):
        monkeypatch.setenv("SGLANG_DDTREE_OVERLAP", v)
        with pytest.raises(DDTreeArgError):
            resolve(**on)
    monkeypatch.setenv("SGLANG_DDTREE_OVERLAP", "1")
    assert resolve(**on).verify_width == 17
    with pytest.raises(DDTreeArgError):
        resolve(**on, overlap_opt_in=False)
    monkeypatch.delenv("SGLANG_DDTREE_OVERLAP")
    assert resolve(**on, overlap_opt_in=True).verify_width == 17


# ----------------------------------------------------------------------------- real parser

@pytest.fixture(scope="module")
def patched_sglang(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return series_tree(tmp_path_factory.mktemp("sglang-patched"))


def parse(root: Path, argvs: list[list[str]], **extra_env: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{ROOT / 'patches' / 'ddtree'}", **extra_env)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "ddtree" / "sglang_parse.py")],
                          input=json.dumps(argvs), capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def rendered() -> dict[str, tuple[list[str], dict[str, str]]]:
    """Every example host's server command and container env, rendered by the rollout (real Ansible, no SSH)."""
    proc = subprocess.run([sys.executable, "-m", "sglfleet.rollout", "render", "--hosts", "all",
                           "--inventory", str(ROOT / "src" / "sglfleet" / "ansible" / "inventories" / "example"),
                           "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    hosts = data.get("hosts", data)
    specs = {h: v for h, v in hosts.items() if isinstance(v, dict) and v.get("command")}
    assert specs, f"render gave no commands: {proc.stdout[:1000]}"
    return {h: (v["command"], {k: str(x) for k, x in (v.get("env") or {}).items()}) for h, v in specs.items()}


@pytest.mark.integration
def test_every_rendered_command_passes_sglangs_parser(patched_sglang: Path,
                                                      rendered: dict[str, tuple[list[str], dict[str, str]]]) -> None:
    """Each host's command under its own rendered overlap opt-in (SGLANG_DDTREE_OVERLAP from its container env,
    never this process's): the example inventory runs DDTree under the overlap scheduler (serve_spec_ddtree_overlap)."""
    by_opt_in: dict[str, list[str]] = {}
    for host, (argv, env) in rendered.items():
        assert "--disable-overlap-schedule" not in argv and env.get("SGLANG_DDTREE_OVERLAP") == "1", (host, env)
        by_opt_in.setdefault(env.get("SGLANG_DDTREE_OVERLAP", ""), []).append(host)
    import yaml

    gv = yaml.safe_load((ROOT / "src/sglfleet/ansible/inventories/example/group_vars/all.yml").read_text())
    budget, topk = int(gv["serve_spec_ddtree_budget"]), int(gv["serve_spec_topk"])  # what the inventory serves
    for opt_in, hosts in by_opt_in.items():
        results = parse(patched_sglang, [rendered[h][0] for h in hosts], SGLANG_DDTREE_OVERLAP=opt_in)
        for host, res in zip(hosts, results, strict=True):
            argv = rendered[host][0]
            assert res["rc"] == 0, f"{host}: sglang rejects {' '.join(argv)}\n{res['stderr']}"
            assert res["ddtree"] == {"budget": budget, "topk": topk, "verify_width": budget + 1}, (host, res)
            # sglang's own resolution (patch 0015) derives the same width from the same rules
            assert res["resolved"] == {"verify_width": budget + 1, "topk": topk, "block": 8}, (host, res)


def _decode_reserve(root: Path):
    """sglang's own DFLASH v2 decode reserve (patch 0016), read from the patched source: the helper
    function, and the expression prepare_for_decode assigns to ``reserve``."""
    src = (root / "sglang" / "srt" / "speculative" / "dflash_info_v2.py").read_text()
    mod = ast.parse(src)
    ns = functions_from(src, ("dflash_decode_reserve",), {"Optional": __import__("typing").Optional})
    cls = next(n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == "DFlashDraftInputV2")
    prep = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "prepare_for_decode")
    assigned = [ast.get_source_segment(src, a.value) for a in ast.walk(prep)
                if isinstance(a, ast.Assign) and any(getattr(t, "id", None) == "reserve" for t in a.targets)]
    return ns["dflash_decode_reserve"], assigned


@pytest.mark.integration
def test_the_decode_kv_reserve_covers_every_verify_window(patched_sglang: Path) -> None:
    """DFLASH v2 reserves KV past the committed length each step; a tree verify writes budget + 1
    slots there. With 2 x block (8) only, budgets >= 16 wrote into req_to_token entries never
    allocated to the request (seen on the H200: structural divergence from budget 16 up)."""
    reserve, assigned = _decode_reserve(patched_sglang)
    assert assigned == ["dflash_decode_reserve(block_size, max_speculative_num_draft_tokens())"], assigned
    base = ["--model-path", "/models/m", "--attention-backend", "triton", "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", "/models/d", "--speculative-num-draft-tokens", "8",
            "--disable-overlap-schedule"]
    budgets = (1, 3, 7, 8, 15, 16, 31, 63)
    res = parse(patched_sglang, [[*base, "--speculative-ddtree-budget", str(b), "--speculative-ddtree-topk", "8"]
                                 for b in budgets] + [base])
    for b, r in zip(budgets, res, strict=False):
        width = r["resolved"]["verify_width"]
        assert width == b + 1 and r["max_draft_width"] == max(8, b + 1), (b, r)
        assert reserve(8, r["max_draft_width"]) >= width + 8, (b, r)  # the window, past a block of lag
    assert reserve(8, res[-1]["max_draft_width"]) == 16, "DFLASH's chain keeps its reserve"


@pytest.mark.integration
def test_the_parser_rejects_what_the_old_render_passed(patched_sglang: Path) -> None:
    base = ["--model-path", "/models/m", "--attention-backend", "triton", "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", "/models/d", "--speculative-num-draft-tokens", "8"]
    old = parse(patched_sglang, [
        [*base, "--cuda-graph-max-bs", "64"],  # ambiguous in 0.5.23
        [*base, "--speculative-ddtree-budget", "16", "--speculative-ddtree-topk", "4"],  # overlap left on
        ["--model-path", "/models/m", "--speculative-algorithm", "DDTREE"],  # not an algorithm
    ])
    assert old[0]["rc"] == 2 and "ambiguous" in old[0]["stderr"]
    assert "--disable-overlap-schedule" in old[1]["ddtree"]["error"]
    assert "--disable-overlap-schedule" in old[1]["resolved"]["error"], "sglang's startup refuses it too"
    assert "Unknown speculative algorithm" in old[2].get("algorithm_error", ""), old[2]
    # the overlap scheduler opted into in the server's environment: sglang's own startup resolves it
    opted = parse(patched_sglang, [old_argv := [*base, "--speculative-ddtree-budget", "16",
                                                 "--speculative-ddtree-topk", "4"]], SGLANG_DDTREE_OVERLAP="1")
    assert opted[0]["rc"] == 0 and opted[0]["resolved"] == {"verify_width": 17, "topk": 4, "block": 8}, \
        (old_argv, opted[0])


@pytest.mark.integration
def test_sglang_startup_refuses_bad_ddtree_arguments_with_the_rule_message(patched_sglang: Path) -> None:
    base = ["--model-path", "/models/m", "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
            "/models/d", "--speculative-num-draft-tokens", "8", "--disable-overlap-schedule"]
    cases = {
        "no tree-mask backend": ([*base, "--attention-backend", "fa3", "--speculative-ddtree-budget", "16"],
                                 "has no tree-mask target verify"),
        "budget 0": ([*base, "--attention-backend", "triton", "--speculative-ddtree-budget", "0"], "1..255"),
        "too big for the block": ([*base, "--attention-backend", "triton", "--speculative-ddtree-budget", "8",
                                   "--speculative-ddtree-topk", "1"], "exceeds the largest tree"),
        "top-k alone": ([*base, "--attention-backend", "triton", "--speculative-ddtree-topk", "4"],
                        "needs --speculative-ddtree-budget"),
        "a contradicting width": ([*base, "--attention-backend", "triton", "--speculative-ddtree-budget", "16",
                                   "--speculative-verify-num-tokens", "8"], "contradicts"),
    }
    results = parse(patched_sglang, [argv for argv, _ in cases.values()])
    for (name, (_, message)), res in zip(cases.items(), results, strict=True):
        assert res["rc"] == 0, (name, res["stderr"])
        assert message in res["resolved"].get("error", ""), (name, res["resolved"])
    chain = parse(patched_sglang, [[*base, "--attention-backend", "triton"]])[0]
    assert chain["resolved"] == {"verify_width": None, "topk": None, "block": 8}, "DFLASH alone is unchanged"


@pytest.mark.integration
def test_unpatched_sglang_does_not_know_the_ddtree_flags(tmp_path: Path) -> None:
    from sglfleet.patches import DEFAULT_CACHE, fetch_sglang

    upstream = fetch_sglang("0.5.23", DEFAULT_CACHE)
    res = parse(upstream, [["--model-path", "/m", "--speculative-ddtree-budget", "16"]])
    assert res[0]["rc"] == 2 and "unrecognized arguments" in res[0]["stderr"]
