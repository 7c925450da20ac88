"""Where the tokens outside their request's law lie, per sampling-mix entry, in gate runs of the H200 production
sequence (tests/ddtree/prodseq.py): every T>0 suite answer a gate report holds (the ids SGLang said it sampled,
with the request's own temperature / top-p / top-k / min-p) placed again in the law by the embedded target's own
numpy forward pass (validation's ReferenceScorer: the same SmolLM2-135M-Instruct, from its GGUF file; the H200 ran
it in bf16, so a token at the law's very edge may fall either side). The baseline file's target-only answers are
the control.

Why: on the H200 the DFLASH chain (SGLang 0.5.23's own DFLASH worker) was refused in every run for tokens outside
the law, while the DDTree builds passed. SGLang 0.5.23's DFLASH verify builds its target probabilities from
temperature, top-k and top-p only (speculative/dflash_utils.py, build_speculative_verify_target_probs): if that is
the cause, the chain's outside tokens lie in the requests with min-p and nowhere else.

    python bench/prodseq_outside.py --reports DIR --baseline baseline.json.gz --gates chain-r01,b16-k4-r02 \
        --out docs/results/prodseq-outside-2026-12-04.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from bench.history import raw_header, write_raw  # noqa: E402
from sglfleet.validation.config import GateConfig  # noqa: E402
from sglfleet.validation.likelihood import pooled_alphas  # noqa: E402
from sglfleet.validation.scorers import ReferenceScorer  # noqa: E402
from sglfleet.validation.suite import load_suite  # noqa: E402
from sglfleet.validation.tokenlaw import CUTS, ORDERS, SamplingParams, cut_counts_p, pooled_counts_p  # noqa: E402

SUITE = REPO / "src" / "sglfleet" / "validation" / "prompts" / "suite-v1.yaml"


def entry_label(sampling: dict[str, Any]) -> str:
    """A mix entry's name: its SamplingParams label less the temperature."""
    return SamplingParams(1.0, **sampling).label.partition(", ")[2] or "untruncated"


def score_sample(scorer: ReferenceScorer, prompts: dict[str, Any], s: dict[str, Any], progress: str
                 ) -> tuple[SamplingParams, Any]:
    """One recorded T>0 sample scored on the ids the server drew, in its request's own law: (its parameters, its
    AnswerScore); a sample the scorer cannot score stops the run."""
    params = SamplingParams(s["temperature"], **s["sampling"])
    sc = scorer.score(prompts[s["prompt_id"]].messages(), s.get("text") or "", s["temperature"],
                      prompt_id=s["prompt_id"], seed=s.get("seed"), ids=tuple(s["output_ids"]), params=params)
    if sc.error:
        raise SystemExit(f"{progress}: {s['prompt_id']}@T{s['temperature']:g}: {sc.error}")
    return params, sc


def place(scorer: ReferenceScorer, prompts: dict[str, Any], samples: list[dict[str, Any]],
          progress: str) -> dict[str, dict[str, int]]:
    """Per mix entry: the tokens placed, those outside the law, and the answers (and the first two per
    temperature)."""
    out: dict[str, dict[str, int]] = {}
    hot = [s for s in samples if s["temperature"] > 0 and s.get("output_ids") and s.get("sampling")]
    for i, s in enumerate(hot, 1):
        _, sc = score_sample(scorer, prompts, s, progress)
        row = out.setdefault(entry_label(s["sampling"]), {"answers": 0, "tokens": 0, "outside": 0})
        row["answers"] += 1
        row["tokens"] += len(sc.tok_pit)
        row["outside"] += sum(p is None for p in sc.tok_pit)
        at = row.setdefault("by_temperature", {}).setdefault(f"T{s['temperature']:g}", {"tokens": 0, "outside": 0})
        at["tokens"] += len(sc.tok_pit)
        at["outside"] += sum(p is None for p in sc.tok_pit)
        # per truncation (tokenlaw.CUTS): the tokens of requests that turn it on, those it leaves outside
        for i, name in enumerate(CUTS):
            c = at.setdefault("cuts", {}).setdefault(name, [0, 0])
            c[0] += sc.cut_tokens[i]
            c[1] += sc.cut_outside[i]
        print(f"[{progress}] {i}/{len(hot)}", file=sys.stderr, flush=True)
    return out


def cuts_by_temperature(rows: dict[str, Any]) -> dict[str, dict[str, list[int]]]:
    """One build's per-entry rows summed into per temperature, per truncation [tokens, outside]."""
    out: dict[str, dict[str, list[int]]] = {}
    for r in rows.values():
        for t, at in r.get("by_temperature", {}).items():
            for name, (m, k) in at.get("cuts", {}).items():
                c = out.setdefault(t, {}).setdefault(name, [0, 0])
                c[0], c[1] = c[0] + m, c[1] + k
    return out


def by_cut(cand: dict[str, Any], base: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The gate's pooled outside counts by truncation (tokenlaw.cut_counts_p) and of every cut together ("all":
    tokenlaw.pooled_counts_p), this re-score's tokens on both sides: the candidate's answers against the
    baseline file's."""
    c, b = cuts_by_temperature(cand), cuts_by_temperature(base)
    temps = [t for t in sorted(c) if t in b]
    out = cut_counts_p([{"cut_candidate": c[t], "cut_baseline": b[t]} for t in temps])

    def at(rows: dict[str, Any], t: str) -> tuple[int, int]:
        got = [r["by_temperature"][t] for r in rows.values() if t in r.get("by_temperature", {})]
        return sum(x["tokens"] for x in got), sum(x["outside"] for x in got)
    strata = [(*at(cand, t), *at(base, t)) for t in temps]
    p_all, expected, _, _ = pooled_counts_p(strata, [])
    out["all"] = {"candidate": sum(s[1] for s in strata), "baseline": sum(s[3] for s in strata),
                  "expected": round(expected, 3), "p": p_all}
    return out


def gate_alphas() -> dict[str, float]:
    """The shipped gate's alphas of these tests (validation.likelihood.pooled_alphas of the default config): each
    cut's count and the all-cuts count."""
    pa = pooled_alphas(GateConfig().likelihood)
    return {"cut": pa.cut, "all": pa.outside}


def reference_setup(baseline: str) -> tuple[dict[str, Any], ReferenceScorer, dict[str, Any]]:
    """The suite's prompts by id, the reference scorer placing tokens in SGLang's order (close it after), and the
    baseline file (.json or .json.gz)."""
    prompts = {p.id: p for p in load_suite(SUITE).prompts}
    cfg = GateConfig()
    scorer = ReferenceScorer(cfg.judge, cfg.likelihood.window)
    scorer.order = ORDERS["sglang"]
    raw = Path(baseline).read_bytes()
    return prompts, scorer, json.loads(gzip.decompress(raw) if baseline.endswith(".gz") else raw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recompute", help="a raw file this script wrote: recompute its by-cut tests, no scoring")
    ap.add_argument("--reports", help="the gates/ folder of prodseq-reports.tgz")
    ap.add_argument("--baseline", help="the baseline file the gates ran against (.json or .json.gz)")
    ap.add_argument("--gates", help="comma-separated gate run names (folders under --reports)")
    ap.add_argument("--baseline-seeds", type=int, default=0, help="only the baseline answers of its first N seeds "
                    "(0: all)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.recompute:
        if not Path(a.recompute).is_file():
            print(f"error: no {a.recompute}", file=sys.stderr)
            return 2
        raw = Path(a.recompute).read_bytes()
        result = json.loads(gzip.decompress(raw) if a.recompute.endswith(".gz") else raw)
        base_rows = result["builds"]["target-only (baseline file)"]
        result["by_cut"] = {n: by_cut(r, base_rows) for n, r in result["builds"].items() if r is not base_rows}
        result["alphas"] = gate_alphas()
        result["recomputed"] = {k: v for k, v in raw_header("bench/prodseq_outside.py", argv).items()
                                if k in ("command", "date", "commit")}
        write_raw(Path(a.out), result)
        show(result)
        return 0
    if not (a.reports and a.baseline and a.gates):
        print("error: --reports, --baseline and --gates are needed (or --recompute)", file=sys.stderr)
        return 2
    reports = Path(a.reports)
    names = [n for n in a.gates.split(",") if n]
    missing = [n for n in names if not (reports / n / "report.json").is_file()]
    if missing or not Path(a.baseline).is_file():
        print(f"error: no report.json for {missing} under {reports}" if missing else f"error: no {a.baseline}",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    prompts, scorer, base = reference_setup(a.baseline)
    result: dict[str, Any] = {**raw_header("bench/prodseq_outside.py", argv), "reports": str(reports),
                              "baseline_file": a.baseline, "order": "sglang", "scorer": "reference (numpy, GGUF)",
                              "builds": {}}
    try:
        seeds = sorted({s["seed"] for s in base["samples"]})[:a.baseline_seeds or None]
        result["baseline_seeds"] = seeds
        result["builds"]["target-only (baseline file)"] = place(
            scorer, prompts, [s for s in base["samples"] if s["seed"] in seeds], "baseline")
        for n in names:
            rep = json.loads((reports / n / "report.json").read_text())
            result["builds"][n] = place(scorer, prompts, [s for s in rep["samples"] if s.get("purpose") == "suite"], n)
    finally:
        scorer.close()
    base_rows = result["builds"]["target-only (baseline file)"]
    result["by_cut"] = {n: by_cut(result["builds"][n], base_rows) for n in names}
    result["alphas"] = gate_alphas()
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_raw(Path(a.out), result)
    show(result)
    return 0




def show(result: dict[str, Any]) -> None:
    for build, cuts in result["by_cut"].items():
        print(build, " ".join(f"{k} {int(v['candidate'])}/{int(v['baseline'])} p {v['p']:.2g}"
                              for k, v in cuts.items()))
    for build, rows in result["builds"].items():
        print(build)
        for label, r in sorted(rows.items()):
            print(f"  {label:28s} {r['answers']:3d} answers {r['tokens']:5d} tokens {r['outside']:4d} outside")


if __name__ == "__main__":
    raise SystemExit(main())
