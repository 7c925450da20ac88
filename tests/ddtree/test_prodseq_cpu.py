"""tests/ddtree/prodseq.py and render_prodseq.py on CPU: the gate jobs' order and resumption, what a gate's
report.json (written by the gate's own writer, so its redaction applies) is reduced to, and the tables."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import prodseq
import pytest
import render_prodseq

from sglfleet.pipeline.reports import Case, write_json


def _servers() -> list[prodseq.Srv]:
    def s(name: str, role: str) -> prodseq.Srv:
        return prodseq.Srv(name, "patched", 16, 4, 1, ["x"], role)
    return [s("chain", "correct"), s("b16-k4", "correct"), s("fault-row_shift-b16-k4", "fault"),
            s("unpatched-b7-k4", "unpatched")]


def test_jobs_interleave_by_round_and_stop_the_broken_builds_at_fault_runs() -> None:
    jobs = prodseq.jobs_for(_servers(), runs=5, fault_runs=2, done=set())
    names = [f"{s.name}-r{r}" for s, r in jobs]
    assert names[:4] == ["chain-r1", "b16-k4-r1", "fault-row_shift-b16-k4-r1", "unpatched-b7-k4-r1"]
    assert names[4:8] == ["chain-r2", "b16-k4-r2", "fault-row_shift-b16-k4-r2", "unpatched-b7-k4-r2"]
    assert names[8:] == ["chain-r3", "b16-k4-r3", "chain-r4", "b16-k4-r4", "chain-r5", "b16-k4-r5"]


def test_a_later_call_runs_only_what_has_no_verdict(tmp_path: Path) -> None:
    ledger = prodseq.Ledger(tmp_path / "gates.jsonl")
    ledger.add({"server": "chain", "run": 1, "rc": 0})
    ledger.add({"server": "b16-k4", "run": 1, "rc": None, "timed_out": True})  # no verdict: run again
    ledger.add({"server": "fault-row_shift-b16-k4", "run": 1, "rc": 1})
    again = prodseq.Ledger(tmp_path / "gates.jsonl")  # the next call reads the file
    jobs = prodseq.jobs_for(_servers(), runs=2, fault_runs=1, done=again.done())
    assert [(s.name, r) for s, r in jobs] == [("b16-k4", 1), ("unpatched-b7-k4", 1), ("chain", 2), ("b16-k4", 2)]


def _report(tmp_path: Path) -> dict:
    """A report.json as the gate writes it: a failing likelihood case with its per-token test and trust, a lossless
    case with a forced re-anchoring."""
    per_token = {"ok": False, "n_candidate": 2400, "n_baseline": 4800, "ks_d": 0.08, "ks_p": 1e-9,
                 "baseline_ks_d": 0.01, "baseline_ks_p": 0.5, "noise_allowance": 0.0, "outside_candidate": 31,
                 "outside_baseline": 0, "outside_p": 1e-12, "alpha_ks": 0.0011, "alpha_outside": 0.00027,
                 "mean_u": 0.41, "approximate_share": 0.02, "reason": "KS p 1e-09", "mean_p": 1e-6,
                 "power": {"reps": 100, "target": 0.9, "n_tokens": 2400, "estimated": True,
                           "families": {"greedy": {"min_rate": 0.1}, "flat": {"min_rate": 0.05}},
                           "min_rate_all_families": 0.1}}
    trust = {"ok": True, "scorer": "sglang", "answers": 48, "tokens": 5000, "median_abs": 0.004, "p99_abs": 0.06,
             "max_abs": 0.2, "limits": {}, "reason": "reproduced"}
    lik = Case("likelihood@T0.8", "coherence", False, "per-token: KS p 1e-09",
               {"temperature": 0.8, "ok": False, "alpha": 0.0033, "p_value": 0.2, "n_candidate": 24, "n_baseline": 48,
                "statistic": {"mean_nll": {"z": 1.0, "p_value": 0.3}, "pit_lag1": {"z": 0.1, "p_value": 0.9},
                              "scorer_trust": trust},
                "support": {"impossible": [], "min_log_p_T": -9.0, "log_eps": -18.0, "n_tokens": 2400},
                "power": {"min_detectable_rate": 0.5}, "method": "m", "reason": "per-token: KS p 1e-09",
                "on_ids": {"candidate": 24, "baseline": 48}, "per_token": per_token})
    loss = Case("lossless_t0", "speculative", True, "7 of 8 identical",
                {"identical": 7, "near_ties": ["story: near-tie"], "diffs": [], "reanchored": 1, "basis": "b",
                 "reanchor": {"url": "the candidate, forced", "control": "ok", "off": None, "forced": True},
                 "per_prompt": {"story": {"verdict": "reanchored", "char": 40, "piece": " the", "gap_nats": 0.01,
                                          "reanchors": 2}}})
    path = write_json(tmp_path / "report.json", {"summary": {"verdict": "FAIL", "failed_checks": ["likelihood@T0.8"],
                                                             "request_errors": 0, "duration_s": 90.0},
                                                 "cases": [lik, loss], "samples": []})
    return json.loads(path.read_text())


def test_report_numbers_keep_the_per_token_test_trust_and_reanchoring(tmp_path: Path) -> None:
    rec = prodseq.report_numbers(_report(tmp_path))
    t = rec["likelihood"]["T0.8"]
    assert t["per_token_recorded"] is True  # not redacted as a secret ('per_token' ends in 'token')
    assert t["per_token"]["ks_p"] == pytest.approx(1e-9) and t["per_token"]["outside_candidate"] == 31
    assert t["per_token"]["power"]["families"] == {"greedy": 0.1, "flat": 0.05}
    assert t["scorer_trust"]["median_abs"] == 0.004 and t["statistics"]["mean_nll"]["p"] == 0.3
    assert rec["lossless"]["reanchored"] == 1 and rec["lossless"]["reanchor"]["forced"] == "True"
    assert rec["verdict"] == "FAIL" and [f["name"] for f in rec["failed"]] == ["likelihood@T0.8"]


def test_the_tables_render_from_a_raw_file(tmp_path: Path) -> None:
    rec = prodseq.report_numbers(_report(tmp_path))
    raw = {"date": "d", "machine": "m", "commit": "c", "calls": [{}],
           "servers": [{"name": "fault-row_shift-b16-k4", "role": "fault"}, {"name": "chain", "role": "correct"}],
           "baseline": {"rc": 0, "wall_s": 40.0, "stopped_at_s": 120.0, "port_refuses_after_stop": True,
                        "file": {"answers_t0": 8, "samples_by_temperature": {"0.6": 48}, "scores_answers": 144}},
           "gates": [{"server": "fault-row_shift-b16-k4", "role": "fault", "run": 1, "rc": 1, "wall_s": 95.0, **rec},
                     {"server": "chain", "role": "correct", "run": 1, "rc": None, "timed_out": True, "wall_s": 400.0}]}
    f = tmp_path / "raw.json.gz"
    f.write_bytes(gzip.compress(json.dumps(raw).encode()))
    out = render_prodseq.render(render_prodseq.load(f), "docs/results/raw.json.gz")
    assert "| chain | pass | 0 | 0 | 0 | 1 |  | none |" in out  # correct builds first; a timed-out run is no verdict
    assert "| fault-row_shift-b16-k4 | be refused | 1 | 0 | 1 | 0 | 1: 1 | likelihood@T0.8 (1) | 95 |" in out
    assert ("| fault-row_shift-b16-k4 | T0.8 | 1 | 1 | 0.080 | 1e-09 / 1e-09 | 0.410 | 1e-06 / 1e-06 | 0.000 | 31 / 0 "
            "| 10.0% |") in out
    assert "1 of 1 | 0.0040 | 0.060 | 0.200 | 5000 |" in out
    assert "Raw: docs/results/raw.json.gz" in out
    page = tmp_path / "page.md"
    page.write_text("x\n<!-- prodseq: RAW -->\nold\n<!-- /prodseq -->\n".replace("RAW", str(f)))
    assert render_prodseq.main(["--page", str(page), "--check"]) == 1
    assert render_prodseq.main(["--page", str(page)]) == 0 and "old" not in page.read_text()
    assert render_prodseq.main(["--page", str(page), "--check"]) == 0


def test_a_gate_refused_on_scorer_trust_is_read_again_without_it() -> None:
    """render_prodseq.own_failures: the checks a gate failed apart from the scorer-trust refusal (its likelihood
    statistics are computed and kept either way): the statistic against its alpha, the per-token test, the
    support check, and every other failed check."""
    trust = "the scorer is not trusted: code@T0.6/seed1: 55 tokens scored, 56 recorded: another tokenizer"

    def lik(p: float, tok_ok: bool = True, rest: str = "mean_nll p=0.4") -> dict:
        # as prodseq keeps a verdict: its reason, and the structured scorer_trust and support records
        return {"reason": f"{trust}; {rest}", "p_value": p, "alpha": 0.0033, "per_token": {"ok": tok_ok},
                "scorer_trust": {"ok": False}, "support": {"impossible": int("log p_T <" in rest)}}

    ok = {"summary": {"failed_checks": ["likelihood@T0.8"]}, "likelihood": {"T0.8": lik(0.4)}}
    assert render_prodseq.own_failures(ok) == []
    stat = {"summary": {"failed_checks": ["likelihood@T0.8", "spec_accept_length"]},
            "likelihood": {"T0.8": lik(0.001)}}
    assert render_prodseq.own_failures(stat) == ["spec_accept_length", "likelihood@T0.8"]
    tok = {"summary": {"failed_checks": ["likelihood@T1"]}, "likelihood": {"T1": lik(0.4, tok_ok=False)}}
    assert render_prodseq.own_failures(tok) == ["likelihood@T1"]
    support = {"summary": {"failed_checks": ["likelihood@T1"]},
               "likelihood": {"T1": lik(0.4, rest="1 candidate token(s) with log p_T < -27.80")}}
    assert render_prodseq.own_failures(support) == ["likelihood@T1"]


def test_the_overlap_candidate_is_the_grids_b16_k4_opted_into_the_overlap_scheduler() -> None:
    """--overlap adds DDTree b16/k4 under sglang's overlap scheduler: the grid's own command without
    --disable-overlap-schedule, the plugin's opt-in in its environment, a correct build (must pass); every other
    server keeps its command."""
    prodseq.sm.MODEL.update(path="/tmp/smollm2", draft="/tmp/smollm2-dflash", load=[], real=True)
    plain, over = prodseq.plan(), prodseq.plan(overlap=True)
    assert [s.name for s in over if s.name not in {x.name for x in plain}] == ["b16-k4-overlap"]
    ov = next(s for s in over if s.name == "b16-k4-overlap")
    twin = next(s for s in plain if s.name == "b16-k4")
    assert ov.role == "correct" and not ov.broken and ov.env == {"SGLANG_DDTREE_OVERLAP": "1"}
    assert "--disable-overlap-schedule" in twin.cmd() and "--disable-overlap-schedule" not in ov.cmd()
    ports = {str(twin.port): str(ov.port), str(twin.port + 1000): str(ov.port + 1000)}  # --port, --nccl-port
    assert ov.cmd() == [ports.get(x, x) for x in twin.cmd() if x != "--disable-overlap-schedule"]
    same = {s.name: s.cmd() for s in plain}
    assert all(s.cmd() == same[s.name] for s in over if s.name in same), "the other servers are unchanged"


def test_servers_capture_decode_graphs_only_up_to_the_gates_concurrency() -> None:
    cut = prodseq.graphs_up_to(["x", "--cuda-graph-bs-decode", "1", "2", "4", "8", "16", "64", "--y"], 8)
    assert cut == ["x", "--cuda-graph-bs-decode", "1", "2", "4", "8", "--y"]
    assert prodseq.graphs_up_to(["--cuda-graph-bs-decode", "16", "32"], 8) == ["--cuda-graph-bs-decode", "16"]
    assert prodseq.graphs_up_to(["--a", "1"], 8) == ["--a", "1"]
    prodseq.sm.MODEL.update(path="/tmp/smollm2", draft="/tmp/smollm2-dflash", load=[], real=True)
    most = prodseq.gate_concurrency()
    assert most >= 1
    for s in prodseq.plan(overlap=True):
        argv = s.cmd()
        i = argv.index("--cuda-graph-bs-decode") + 1
        first = []
        for x in argv[i:]:
            if not x.isdigit():
                break
            first.append(int(x))
        assert first and max(first) <= most and most in first, (s.name, first)


def test_the_answers_dispersion_is_kept_and_gets_its_column_only_where_a_run_has_it(tmp_path: Path) -> None:
    report = _report(tmp_path)
    lik = next(c for c in report["cases"] if c["name"] == "likelihood@T0.8")
    lik["details"]["per_token"].update({"answers": 24, "dispersion": 3.25, "dispersion_p": 2e-5,
                                        "baseline_dispersion": 0.9, "dispersion_inflation": 1.0,
                                        "alpha_dispersion": 2e-4})
    rec = prodseq.report_numbers(report)
    assert rec["likelihood"]["T0.8"]["per_token"]["dispersion_p"] == pytest.approx(2e-5)
    raw = {"date": "d", "machine": "m", "commit": "c", "calls": [{}],
           "servers": [{"name": "fault-step_replay_random-b16-k4", "role": "fault"}],
           "baseline": {"rc": 0, "wall_s": 40.0, "file": {}},
           "gates": [{"server": "fault-step_replay_random-b16-k4", "role": "fault", "run": 1, "rc": 1, "wall_s": 95.0,
                      **rec}]}
    out = "\n".join(render_prodseq.token_table(raw))
    assert "answers' dispersion (median), p min" in out and "| 3.250, 2e-05 |" in out
    old = prodseq.report_numbers(_report(tmp_path))  # a run from before the statistic: no column
    raw["gates"][0].update(old)
    assert "dispersion" not in "\n".join(render_prodseq.token_table(raw))


def test_the_pooled_statistics_are_kept_and_get_their_table_only_where_a_run_has_them(tmp_path: Path) -> None:
    """likelihood_pooled's numbers ride in each temperature's per-token test; the raw keeps them and the page
    gets the pooled table, with the verdict a run would have had with both."""
    report = _report(tmp_path)
    lik = next(c for c in report["cases"] if c["name"] == "likelihood@T0.8")
    pooled = {"ok": False, "temperatures": 3, "outside_candidate": 26, "outside_baseline": 14,
              "outside_expected": 13.6, "outside_p": 6.1e-05, "edge_candidate": 400, "edge_baseline": 800,
              "edge_expected": 410.0, "edge_p": 0.3, "serial_z": 0.3, "serial_p": 0.76,
              "alphas": {"outside": 2e-4, "edge": 1e-4, "serial": 2e-4}, "reason": "wider"}
    lik["details"]["per_token"]["pooled"] = pooled
    rec = prodseq.report_numbers(report)
    assert rec["likelihood"]["T0.8"]["per_token"]["pooled"]["outside_p"] == pytest.approx(6.1e-05)
    raw = {"date": "d", "machine": "m", "commit": "c", "calls": [{}],
           "servers": [{"name": "fault-min_p_on_t1-b16-k4", "role": "fault"}],
           "baseline": {"rc": 0, "wall_s": 40.0, "file": {}},
           "gates": [{"server": "fault-min_p_on_t1-b16-k4", "role": "fault", "run": 1, "rc": 0, "wall_s": 95.0,
                      **rec, "passed": True}]}
    out = "\n".join(render_prodseq.pooled_table(raw))
    assert ("| fault-min_p_on_t1-b16-k4 | be refused | 1 | 0 | 1 | 1 | 26 / 14, 6.1e-05 | not run | 400 / 410.0, "
            "0.30 |") in out
    # a gate with the counts by truncation: each cut's candidate count and least p, and the counts per temperature
    pooled["cuts"] = {"top_p": {"candidate": 9, "baseline": 12, "expected": 7.0, "p": 0.31},
                      "min_p": {"candidate": 14, "baseline": 1, "expected": 5.0, "p": 1.1e-05}}
    lik["details"]["per_token"]["cut_candidate"] = {"top_k": [900, 1], "top_p": [1500, 4], "min_p": [700, 8]}
    rec = prodseq.report_numbers(report)
    assert rec["likelihood"]["T0.8"]["per_token"]["cut_candidate"]["min_p"] == [700, 8]
    raw["gates"][0].update(rec)
    out = "\n".join(render_prodseq.pooled_table(raw))
    assert "| 26 / 14, 6.1e-05 | — / 9 (0.31) / 14 (1.1e-05) | 400 / 410.0, 0.30 |" in out, out
    assert "pooled over the T>0" in render_prodseq.render(raw, "r")
    raw["gates"][0].update(prodseq.report_numbers(_report(tmp_path)))  # a run from before the pooled test
    assert "pooled over the T>0" not in render_prodseq.render(raw, "r")


@pytest.mark.parametrize("raw_name", ["prodseq-h100-2026-12-06-s31.json.xz", "prodseq-h100-2026-12-06-s30.json.xz",
                                      "prodseq-h200-2026-12-04-s20.json.xz"])
def test_a_runs_margin_is_below_one_exactly_when_its_gate_refused_it_at_t_above_0(raw_name: str) -> None:
    """render_prodseq.margins (p / alpha of every T>0 statistic, the answer-level alpha rebuilt from the raw's
    profile) against the gate's own verdicts in real device runs; the support check (impossible tokens, no p) apart."""
    raw = render_prodseq.load(render_prodseq.REPO / "docs" / "results" / raw_name)
    judged = 0
    for g in render_prodseq._verdicts(raw["gates"]):
        m = render_prodseq.margins(raw, g)
        failed = [f for f in g.get("failed") or [] if isinstance(f, dict)]
        if not m or any("log p_T <" in (f.get("message") or "") for f in failed):
            continue
        refused = any(str(f.get("name", "")).startswith("likelihood") for f in failed)
        assert (min(m)[0] < 1) == refused, (g["name"], min(m), [f.get("name") for f in failed])
        judged += 1
    assert judged >= 20


def test_the_margin_table_counts_runs_refused_at_smaller_alphas() -> None:
    raw = render_prodseq.load(render_prodseq.REPO / "docs" / "results" / "prodseq-h100-2026-12-06-s31.json.xz")
    rows = {r.split(" | ")[0].lstrip("| "): r.split(" | ") for r in render_prodseq.margin_table(raw)[2:]}
    assert rows["b7-k4"][3].startswith("0.63 (T0.6 ks)") and rows["b7-k4"][6:9] == ["1", "0", "0 |"]
    assert rows["fault-min_p_on_t1-b16-k4"][6:8] == ["3", "3"]


def test_the_threshold_reach_is_kept_and_gets_its_table_only_where_a_run_ran_the_rule(tmp_path: Path) -> None:
    """The reach rule's numbers ride in each temperature's per-token test; the raw keeps them and the page gets a
    table of how far past a threshold cut each build's tokens lay against the baseline's margin."""
    report = _report(tmp_path)
    lik = next(c for c in report["cases"] if c["name"] == "likelihood@T0.8")
    lik["details"]["per_token"].update(past_reach=3, reach_margin=0.5, farthest_reach=0.92,
                                       baseline_farthest_reach=0.105)
    rec = prodseq.report_numbers(report)
    assert rec["likelihood"]["T0.8"]["per_token"]["farthest_reach"] == pytest.approx(0.92)
    raw = {"date": "d", "machine": "m", "commit": "c", "calls": [{}],
           "servers": [{"name": "fault-min_p_on_t1-b16-k4", "role": "fault"}, {"name": "chain", "role": "correct"}],
           "baseline": {"rc": 0, "wall_s": 40.0, "file": {}},
           "gates": [{"server": "fault-min_p_on_t1-b16-k4", "role": "fault", "run": 1, "rc": 1, "wall_s": 95.0,
                      **rec, "passed": False}]}
    ok = prodseq.report_numbers(_report(tmp_path))
    ok["likelihood"]["T0.8"]["per_token"].update(past_reach=0, reach_margin=0.5, farthest_reach=0.24,
                                                 baseline_farthest_reach=0.105)
    raw["gates"].append({"server": "chain", "role": "correct", "run": 1, "rc": 0, "wall_s": 90.0, **ok,
                         "passed": True})
    out = "\n".join(render_prodseq.reach_table(raw))
    assert "| fault-min_p_on_t1-b16-k4 | be refused | 1 | 1 | 3 | 0.920 / 0.920 / 0.920 | 0.105 | 0.500 |" in out, out
    assert "| chain | pass | 1 | 0 | 0 | 0.240 / 0.240 / 0.240 | 0.105 | 0.500 |" in out, out
    assert "numeric reach" in render_prodseq.render(raw, "r")
    for g in raw["gates"]:  # runs from before the rule (no margin, or the rule off: inf)
        g["likelihood"]["T0.8"]["per_token"]["reach_margin"] = float("inf")
    assert "numeric reach" not in render_prodseq.render(raw, "r")


def test_overlap_trees_and_faults_are_served_under_the_overlap_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """PRODSEQ_OVERLAP_TREES / PRODSEQ_OVERLAP_FAULTS: each tree a correct build and each fault a build that must be
    refused, all on the overlap path (opt-in set, --disable-overlap-schedule left out), the fault's env beside the
    opt-in; the non-overlap servers keep their commands; a bad entry stops the plan with its name."""
    prodseq.sm.MODEL.update(path="/tmp/smollm2", draft="/tmp/smollm2-dflash", load=[], real=True)
    plain = {s.name: s.cmd() for s in prodseq.plan(overlap=True)}
    monkeypatch.setattr(prodseq, "OVERLAP_TREES", prodseq._overlap_trees("16:4,16:8,31:4"))
    monkeypatch.setattr(prodseq, "OVERLAP_FAULTS", ("row_shift",))
    over = prodseq.plan(overlap=True)
    added = [s for s in over if s.name not in plain]
    assert [s.name for s in added] == ["b16-k8-overlap", "b31-k4-overlap", "fault-row_shift-b16-k4-overlap"]
    for s in added + [x for x in over if x.name == "b16-k4-overlap"]:
        assert s.env["SGLANG_DDTREE_OVERLAP"] == "1" and "--disable-overlap-schedule" not in s.cmd(), s.name
    fault = added[-1]
    assert fault.broken and fault.env["SGLANG_DDTREE_TEST_FAULT"] == "row_shift"
    assert not any(s.broken for s in added[:-1])
    for s, (b, k) in zip(added, [("16", "8"), ("31", "4"), ("16", "4")], strict=True):
        argv = s.cmd()
        assert argv[argv.index("--speculative-ddtree-budget") + 1] == b, s.name
        assert argv[argv.index("--speculative-ddtree-topk") + 1] == k, s.name
    assert all(s.cmd() == plain[s.name] for s in over if s.name in plain and "overlap" not in s.name)
    with pytest.raises(SystemExit, match="BUDGET:TOPK"):
        prodseq._overlap_trees("16:4,31")
