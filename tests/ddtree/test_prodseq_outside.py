"""bench/prodseq_outside.py's arithmetic on a raw file (no scoring): the per-temperature counts by truncation
summed over mix entries, the pooled p by cut and of all cuts, --recompute, and its bad input."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
import render_prodseq

from bench import prodseq_outside as po
from sglfleet.validation.tokenlaw import binomial_sum_tail


def _entry(t: str, tokens: int, outside: int, cuts: dict[str, list[int]]) -> dict:
    return {"answers": 3, "tokens": tokens, "outside": outside,
            "by_temperature": {t: {"tokens": tokens, "outside": outside, "cuts": cuts}}}


def _raw() -> dict:
    zero = {"top_k": [0, 0], "top_p": [0, 0], "min_p": [0, 0]}
    base = {"min_p 0.1": _entry("T0.6", 2000, 1, {**zero, "min_p": [2000, 1]}),
            "top_p 0.95": _entry("T0.6", 2000, 4, {**zero, "top_p": [2000, 4]})}
    cand = {"min_p 0.1": _entry("T0.6", 1000, 12, {**zero, "min_p": [1000, 12]}),
            "top_p 0.95": _entry("T0.6", 1000, 2, {**zero, "top_p": [1000, 2]})}
    return {"command": "c", "date": "d", "machine": "m", "commit": "x",
            "builds": {"target-only (baseline file)": base, "fault-r01": cand}}


def test_the_counts_by_cut_are_the_gates_pooled_test_on_the_re_scored_tokens() -> None:
    raw = _raw()
    got = po.by_cut(raw["builds"]["fault-r01"], raw["builds"]["target-only (baseline file)"])
    assert set(got) == {"min_p", "top_p", "all"}  # top-k: no request turned it on
    assert (got["min_p"]["candidate"], got["min_p"]["baseline"]) == (12, 1)
    assert got["min_p"]["p"] == pytest.approx(binomial_sum_tail(12, [(13, 1 / 3)]))
    assert got["all"]["p"] == pytest.approx(binomial_sum_tail(14, [(19, 2000 / 6000)]))
    assert got["min_p"]["p"] < 1e-4 < got["top_p"]["p"]


def test_recompute_reads_a_gzipped_raw_and_writes_the_by_cut_table(tmp_path: Path) -> None:
    src = tmp_path / "raw.json.gz"
    src.write_bytes(gzip.compress(json.dumps(_raw()).encode()))
    out = tmp_path / "out.json"
    assert po.main(["--recompute", str(src), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["by_cut"]["fault-r01"]["min_p"]["candidate"] == 12 and "--recompute" in doc["recomputed"]["command"]
    text = render_prodseq.render_outside(doc, "raw")
    assert doc["alphas"] == {"cut": pytest.approx(0.01 * 0.05 / 4 / 3), "all": pytest.approx(0.01 * 0.05 / 4)}
    # the shipped alphas, recorded in the raw, mark the refused cells: min-p's count, not top-p's
    assert "| gate | top-p | min-p | all |" in text and "| fault-r01 | 2 / 4, 0.65 | **12 / 1, 1.7e-05** | " in text
    assert "as recorded: 4.17e-05 a cut, 0.000125 all" in text, text
    assert "By cut: `python bench/prodseq_outside.py --recompute" in text, text


def test_bad_input_is_refused_with_exit_2(tmp_path: Path) -> None:
    assert po.main(["--out", str(tmp_path / "o.json")]) == 2
    assert po.main(["--recompute", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o.json")]) == 2
    assert not (tmp_path / "o.json").exists()


def test_cut_reach_takes_only_threshold_cut_answers_and_counts_past_each_grid_value(tmp_path: Path) -> None:
    """bench/cut_reach.py without scoring: which recorded samples it places (T>0, sampled ids, top-k or min-p on),
    its per-build summary over the outside tokens' reaches (None: outside top-p only), and its bad input."""
    from bench import cut_reach as cr

    def s(t: float, **sm: float) -> dict:
        return {"temperature": t, "output_ids": [1, 2], "sampling": {"top_p": 1.0, "top_k": 0, "min_p": 0.0, **sm}}
    assert [cr.threshold_sampled(x) for x in (s(0.6, min_p=0.1), s(0.8, top_k=40), s(0.6, top_p=0.9),
                                              s(0.0, top_k=40), {**s(0.6, min_p=0.1), "output_ids": []})] == [
        True, True, False, False, False]
    got = cr.summary({"answers": 3, "tokens": 300, "outside": [{"reach": 0.04}, {"reach": None}, {"reach": 0.6},
                                                              {"reach": 0.25}]})
    assert got["outside"] == 4 and got["threshold_outside"] == 3 and got["max_reach"] == 0.6
    assert got["past"] == {"0": 3, "0.05": 2, "0.1": 2, "0.2": 2, "0.3": 1, "0.5": 1}
    assert cr.summary({"answers": 0, "tokens": 0, "outside": []})["max_reach"] is None
    assert cr.main(["--reports", str(tmp_path), "--baseline", str(tmp_path / "b.json"), "--gates", "x",
                    "--out", str(tmp_path / "o.json")]) == 2 and not (tmp_path / "o.json").exists()


def test_cut_reach_own_reads_the_gates_own_placements_from_its_reports(tmp_path: Path) -> None:
    """bench/cut_reach.py --own: no scoring; each report's per-cut reach lists (the gate's own TokenVerdict, made
    here by the gate's code from a min-p-on-T=1 candidate and a correct baseline) give the summary, and its
    counts past 0.1 are the gate's own counts by cut; a report from before the lists is bad input."""
    import numpy as np

    from bench import cut_reach as cr
    from bench.history import raw_text
    from sglfleet.validation.config import LikelihoodConfig
    from sglfleet.validation.likelihood import token_verdict
    from sglfleet.validation.scorers import AnswerScore, per_token
    from sglfleet.validation.tokenlaw import CUT_REACH, ORDERS, SamplingParams, law_of, row_from_logits

    rng = np.random.default_rng(4)
    p = SamplingParams(0.6, min_p=0.1)

    def answers(wrong: bool, tag: str) -> list[AnswerScore]:
        rows, seq = [], []
        for _ in range(400):
            row = row_from_logits(rng.normal(0, 2.5, 64), p.temperature)
            law = law_of(row, SamplingParams(1.0, min_p=0.1) if wrong else p, ORDERS["sglang"])
            q = np.exp(row.lp[:law.n] / p.temperature)  # the kept candidates (T=1's bar when wrong) at p_T
            rows.append(row)
            seq.append(int(row.ids[rng.choice(law.n, p=q / q.sum())]))
        tok = per_token(tag, p.temperature, rows, seq, p, ORDERS["sglang"])
        return [AnswerScore(tag, p.temperature, 1, (-1.0,) * len(seq), None, **tok)]

    tv = token_verdict(answers(True, "c"), answers(False, "b"), LikelihoodConfig(token_power_reps=0), 3)
    assert tv is not None
    gates = tmp_path / "gates"
    report = {"cases": [{"name": "likelihood@T0.6", "details": {"n_candidate": 1, "n_baseline": 1,
                                                                "per_token": tv.as_dict()}},
                        {"name": "lossless_t0", "details": {}}]}
    (gates / "fault-r01").mkdir(parents=True)
    (gates / "fault-r01" / "report.json").write_text(json.dumps(report))
    out = tmp_path / "own.json.gz"
    assert cr.main(["--own", "--reports", str(gates), "--gates", "fault-r01", "--out", str(out)]) == 0
    got = json.loads(raw_text(out))
    cand, base = got["summary"]["fault-r01"], got["summary"]["target-only (baseline file, scored by fault-r01)"]
    assert cand["past"]["0.1"] == tv.cut_candidate["min_p"][1] > 10 and base["past"]["0.1"] == tv.cut_baseline[
        "min_p"][1] and CUT_REACH == 0.1
    assert cand["tokens"] == tv.n_candidate + tv.outside_candidate and cand["max_reach"] > 0.5
    assert base["threshold_outside"] == 0  # the baseline drew from the law the scorer places: nothing outside
    del report["cases"][0]["details"]["per_token"]["cut_reach_candidate"]
    (gates / "fault-r01" / "report.json").write_text(json.dumps(report))
    assert cr.main(["--own", "--reports", str(gates), "--gates", "fault-r01", "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def _gate(server: str, per_t: dict[str, tuple[int, int, int, int, dict[str, list[int]], dict[str, list[int]]]]
          ) -> dict:
    """A gate record as prodseq keeps it: per temperature (n_cand, out_cand, n_base, out_base, cuts, base cuts)."""
    return {"server": server, "likelihood": {t: {"per_token": {
        "n_candidate": n, "outside_candidate": k, "n_baseline": n0, "outside_baseline": k0,
        "cut_candidate": cc, "cut_baseline": cb}} for t, (n, k, n0, k0, cc, cb) in per_t.items()}}


def test_prodseq_rates_counts_and_test(tmp_path: Path) -> None:
    """bench/prodseq_rates.py: a build's counts summed over its gates and temperatures, the baseline's once per
    series (every gate repeats it), per cut; the conditional test worked by hand; a file with no per-token counts
    is bad input (exit 2)."""
    from bench import prodseq_rates as pr

    cuts0 = {"top_k": [100, 1]}
    raw = {"commit": "x", "gates": [
        _gate("chain", {"T0.6": (1000, 6, 500, 1, {"top_k": [400, 4]}, cuts0),
                        "T1": (800, 2, 300, 1, {"top_k": [100, 0]}, {"top_k": [50, 0]})}),
        _gate("chain", {"T0.6": (1000, 4, 500, 1, {"top_k": [400, 2]}, cuts0)}),
        _gate("b16-k4", {"T0.6": (900, 1, 500, 1, {"top_k": [300, 0]}, cuts0)}),
    ]}
    builds, base = pr.series_counts(raw)
    assert builds["chain"] == {"gates": 2, "tokens": 2800, "outside": 12, "top_k:tokens": 900, "top_k:outside": 6}
    assert base == {"tokens": 800, "outside": 2, "top_k:tokens": 150, "top_k:outside": 1}
    # equal rates: k = 12 of the 14 outside tokens, share 2800 / 3600 = 7/9; two-sided = 2 * min(tails)
    share = 2800 / 3600
    lower = sum(math.comb(14, j) * share ** j * (1 - share) ** (14 - j) for j in range(13))
    upper = 1 - lower + math.comb(14, 12) * share ** 12 * (1 - share) ** 2
    assert pr.two_rates_p([(12, 2800, 2, 800)]) == pytest.approx(min(1.0, 2 * min(lower, upper)), rel=1e-9)
    # a build far above its baseline is told apart; strata keep two series' rates apart
    assert pr.two_rates_p([(60, 1000, 1, 1000)]) < 1e-12
    assert pr.two_rates_p([(10, 1000, 10, 1000), (1, 1000, 1, 1000)]) == pytest.approx(1.0)
    f = tmp_path / "s.json.gz"
    f.write_bytes(gzip.compress(json.dumps(raw).encode()))
    out = tmp_path / "rates.json"
    assert pr.main([str(f), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    chain = next(r for r in res["series"][0]["builds"] if r["build"] == "chain")
    assert (chain["outside"], chain["baseline_outside"], chain["cuts"]["top_k"]["outside"]) == (12, 2, 6)
    assert res["chain_vs_b16"]["outside"] == 12 and res["chain_vs_b16"]["baseline_tokens"] == 900
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"gates": [{"server": "chain", "likelihood": {}}]}))
    assert pr.main([str(empty)]) == 2
    assert pr.main([str(tmp_path / "missing.json")]) == 2
