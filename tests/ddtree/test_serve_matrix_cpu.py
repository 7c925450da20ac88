"""The CPU half of the GPU serve matrix (tests/ddtree/serve_matrix.py): the three sglang variants
it builds from the series, the prompts it sends to the real SmolLM2 target, and its server commands
through sglang's own parser."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from test_ddtree_args import patched_sglang  # noqa: F401 - the module-scoped fixture

HERE = Path(__file__).resolve().parent


@pytest.fixture()
def sm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from sglfleet.patches import DEFAULT_CACHE, fetch_sglang

    monkeypatch.setenv("SITE", str(fetch_sglang("0.5.23", DEFAULT_CACHE)))
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("serve_matrix", None)
    mod = importlib.import_module("serve_matrix")
    monkeypatch.setattr(mod, "VAR", tmp_path / "var")
    return mod


@pytest.mark.integration
def test_variants_apply_and_differ_where_they_should(sm) -> None:
    roots = {v: sm.build_variant(v) for v in ("patched", "unpatched", "mutant")}
    tb = "sglang/srt/layers/attention/triton_backend.py"
    spec = "sglang/srt/arg_groups/fields/spec.py"
    for root in roots.values():  # every variant knows the DDTree arguments
        assert "speculative_ddtree_budget" in (root / spec).read_text()
    assert "tree_verify" in (roots["patched"] / tb).read_text()
    assert "tree_verify" not in (roots["unpatched"] / tb).read_text(), "0011-0014 are left out"
    assert (roots["mutant"] / tb).read_text().count("MUTANT seeds") >= 3


@pytest.mark.network  # the sm fixture fetches the sglang wheel (cached after the first run)
def test_plan_covers_the_matrix(sm) -> None:
    names = [s.name for s in sm.plan("full")]
    assert len(names) == len(set(names))
    for b in (1, 3, 7, 8, 15, 16, 31, 63):
        assert f"patched-b{b}-graph" in names and f"patched-b{b}-eager" in names
    over = sm.plan("overlap")
    assert {s.name for s in over if s.overlap} == {"patched-b7-graph-overlap", "patched-b16-graph-overlap",
                                                   "patched-b31-graph-overlap", "mutant-b16-graph-overlap"}
    assert all(("--disable-overlap-schedule" in s.cmd()) is (not s.overlap) for s in over if s.budget)
    ports = [s.port for s in sm.plan("full")]
    assert len(set(ports)) == len(ports)
    cmd = sm.plan("full")[2].cmd()
    assert cmd[cmd.index("--speculative-ddtree-budget") + 1] == "1"
    assert "--disable-overlap-schedule" in cmd and "--nccl-port" in cmd


@pytest.mark.slow
def test_real_prompts_are_token_lists_of_the_chat_template(sm, tmp_path: Path) -> None:
    from testbed.models import gguf_to_hf

    out = tmp_path / "smollm2"
    gguf_to_hf.convert(gguf_to_hf.smollm2_gguf(), out)
    sm.MODEL.update(path=str(out), real=True)
    ps = sm.prompts()
    assert len(ps) == 4 and all(isinstance(t, int) for p in ps for t in p)
    lens = [len(p) for p in ps]
    assert lens == sorted(lens) and lens[0] > 20 and lens[-1] > 300


@pytest.mark.integration
def test_every_matrix_command_passes_sglangs_parser(sm, patched_sglang: Path) -> None:  # noqa: F811
    """The serve matrix builds its own server commands: every one goes through sglang 0.5.23's parser
    and DFLASH/DDTree resolution with the series (the harness of test_ddtree_args.py), so a flag
    sglang would reject at startup fails here, not on the GPU machine."""
    from test_ddtree_args import parse

    servers = sm.plan("full")
    argvs = [s.cmd() for s in servers]
    results = parse(patched_sglang, [a[a.index("sglang.launch_server") + 1:] for a in argvs])
    for s, argv, res in zip(servers, argvs, results, strict=True):
        assert res["rc"] == 0, f"sglang rejects {s.name}: {' '.join(argv)}\n{res['stderr']}"
        if s.budget is None:
            assert res["ddtree"] is None, s.name
        else:
            assert res["ddtree"] == {"budget": s.budget, "topk": sm.SERVER_TOPK, "verify_width": s.budget + 1}
    nccl = [int(a[a.index("--nccl-port") + 1]) for a in argvs]
    assert max(nccl) < 32768 and len(set(nccl)) == len(nccl)


@pytest.mark.integration
def test_overlap_servers_start_only_opted_in(sm, patched_sglang: Path) -> None:  # noqa: F811
    """bench/ddtree_real.py's servers under the overlap scheduler: their commands leave --disable-overlap-schedule
    out and pass sglang 0.5.23's parser and DDTree resolution only with the plugin's opt-in in the environment
    (the server's start puts it there); their non-overlap twins keep the flag."""
    from test_ddtree_args import parse

    sys.modules.pop("ddtree_real", None)
    sys.path.insert(0, str(HERE.parents[1] / "bench"))
    real = importlib.import_module("ddtree_real")
    servers = [real.RealServer("ddtree-b16-overlap", "ddtree", 16, 31500, 0.1, overlap=True),
               real.RealServer("chain-b8-overlap", "chain", None, 31501, 0.1, overlap=True),
               real.RealServer("ddtree-b16", "ddtree", 16, 31502, 0.1),
               real.RealServer("chain-b8", "chain", None, 31503, 0.1)]
    argvs = [s.cmd() for s in servers]
    for s, a in zip(servers, argvs, strict=True):
        assert ("--disable-overlap-schedule" in a) is (not s.overlap), s.name
    tails = [a[a.index("sglang.launch_server") + 1:] for a in argvs]
    refused = parse(patched_sglang, tails[:1])[0]
    assert "SGLANG_DDTREE_OVERLAP=1" in refused["ddtree"]["error"], refused
    ok = parse(patched_sglang, tails, SGLANG_DDTREE_OVERLAP="1")
    for s, res in zip(servers, ok, strict=True):
        assert res["rc"] == 0, (s.name, res["stderr"][-2000:])
        if s.kind == "ddtree":
            assert res["ddtree"] == {"budget": 16, "topk": sm.SERVER_TOPK, "verify_width": 17}, (s.name, res)
