"""How far past the request's threshold cuts (top-k, min-p) the tokens outside the law lie, in logits, for the
baseline file and gate runs of a device series (tests/ddtree/prodseq.py's report.json files): the data for the
gate's zero-tolerance rule on threshold cuts (validation/tokenlaw.py threshold_reach).

A correct sampler's tokens fall outside the scorer's law only where the scorer's log-probabilities and the
sampler's differ enough to move the token across the cut: their reach is at most twice that numeric difference.
A sampler that computes a cut on the wrong law or with the wrong parameter (min-p on the T=1 law, a top-k lost)
draws tokens spread over the whole region the right cut removes. This script places every T>0 suite answer
whose request has a threshold cut again, with the embedded target's own numpy forward pass (the reference
scorer: float32 against the device's bf16, so its numeric reach is larger than the candidate's own prefill), and
lists each outside token's reach by build and cut.

    python bench/cut_reach.py --reports DIR --baseline baseline.json.gz --gates fault-min_p_on_t1-b16-k4-r01,... \
        --out docs/results/cut-reach-2026-12-06.json.gz

With --own (no --baseline) nothing is scored again: the reaches come from the reports themselves, as each gate's
own scorer (the candidate's prefill) placed them, so any model a gate ran on can be measured this way, a
production target's included: how far its correct builds' and its baseline's tokens lie past a cut is what its
profile's likelihood.reach_floor must clear.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from bench.history import raw_header, write_raw  # noqa: E402
from bench.prodseq_outside import reference_setup, score_sample  # noqa: E402
from sglfleet.validation.scorers import ReferenceScorer  # noqa: E402

GRID = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)  # logits: the reach thresholds the summary counts past


def threshold_sampled(s: dict[str, Any]) -> bool:
    """A T>0 answer with its sampled ids whose request turns a threshold cut (top-k or min-p) on."""
    sm = s.get("sampling") or {}
    return s["temperature"] > 0 and bool(s.get("output_ids")) and (sm.get("top_k", 0) > 0 or sm.get("min_p", 0) > 0)


def place(scorer: ReferenceScorer, prompts: dict[str, Any], samples: list[dict[str, Any]],
          progress: str) -> dict[str, Any]:
    """The threshold-cut answers' tokens and each outside token's reach (None: outside top-p only)."""
    out: dict[str, Any] = {"answers": 0, "tokens": 0, "outside": []}
    hot = [s for s in samples if threshold_sampled(s)]
    for i, s in enumerate(hot, 1):
        params, sc = score_sample(scorer, prompts, s, progress)
        out["answers"] += 1
        out["tokens"] += len(sc.tok_pit or ())
        for r in sc.tok_reach:
            out["outside"].append({"T": s["temperature"], "prompt": s["prompt_id"], "params": params.label,
                                   "reach": None if r is None else round(r, 4)})
        print(f"[{progress}] {i}/{len(hot)}", file=sys.stderr, flush=True)
    return out


def own_scorer(report: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the candidate's, the baseline's) outside tokens past a threshold cut as the gate's own scorer placed them:
    the per-cut reach lists its likelihood@T cases keep (TokenVerdict cut_reach_candidate / cut_reach_baseline,
    since cacd8b0), one entry per token and cut; tokens: every T>0 token the per-token test placed. Any model a
    gate can score, not only the embedded one the reference scorer runs."""
    sides: tuple[dict[str, Any], dict[str, Any]] = ({"answers": 0, "tokens": 0, "outside": []},
                                                    {"answers": 0, "tokens": 0, "outside": []})
    for case in report.get("cases") or []:
        tok = (case.get("details") or {}).get("per_token")
        if not str(case.get("name", "")).startswith("likelihood@T") or not isinstance(tok, dict):
            continue
        if "cut_reach_candidate" not in tok:
            raise ValueError(f"{case['name']}: the report keeps no per-cut reaches (a gate before cacd8b0)")
        t = float(str(case["name"]).removeprefix("likelihood@T"))
        for side, key, n in ((sides[0], "cut_reach_candidate", "candidate"), (sides[1], "cut_reach_baseline",
                                                                                "baseline")):
            side["answers"] += int((case.get("details") or {}).get(f"n_{n}") or 0)
            side["tokens"] += int(tok.get(f"n_{n}") or 0) + int(tok.get(f"outside_{n}") or 0)
            side["outside"] += [{"T": t, "cut": cut, "reach": r} for cut, rs in tok[key].items() for r in rs]
    return sides


def summary(rows: dict[str, Any]) -> dict[str, Any]:
    """Per build: the outside tokens with a threshold reach, how many lie past each GRID value, the largest."""
    reach = sorted(o["reach"] for o in rows["outside"] if o["reach"] is not None)
    return {"answers": rows["answers"], "tokens": rows["tokens"], "outside": len(rows["outside"]),
            "threshold_outside": len(reach), "max_reach": reach[-1] if reach else None,
            "past": {f"{g:g}": sum(1 for r in reach if r > g) for g in GRID}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reports", required=True, help="a gates/ folder of prodseq-reports.tgz (several: comma)")
    ap.add_argument("--baseline", help="the baseline file the gates ran against (.json or .json.gz; the reference "
                    "scorer's mode)")
    ap.add_argument("--own", action="store_true", help="no scoring: the reaches the gates' own scorer placed, read "
                    "from each report (any model; reports of gates since cacd8b0)")
    ap.add_argument("--gates", required=True, help="comma-separated gate run names (folders under --reports)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    folders = [Path(x) for x in a.reports.split(",") if x]
    names = [n for n in a.gates.split(",") if n]
    where: dict[str, Path] = {}
    for n in names:
        hits = [f / n / "report.json" for f in folders if (f / n / "report.json").is_file()]
        if hits:
            where[n] = hits[0]
    missing = [n for n in names if n not in where]
    if not names or missing or not (a.own or (a.baseline and Path(a.baseline).is_file())):
        print(f"error: no report.json for {missing or 'any gate'} under {a.reports}" if missing or not names
              else f"error: no baseline file {a.baseline!r} (or --own)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if a.own:
        return _own(a, argv, names, where, t0)
    prompts, scorer, base = reference_setup(a.baseline)
    result: dict[str, Any] = {**raw_header("bench/cut_reach.py", argv), "baseline_file": a.baseline,
                              "order": "sglang", "scorer": "reference (numpy float32, GGUF)", "builds": {}}
    try:
        result["builds"]["target-only (baseline file)"] = place(scorer, prompts, base["samples"], "baseline")
        for n in names:
            rep = json.loads(where[n].read_text())
            result["builds"][n] = place(scorer, prompts, [s for s in rep["samples"] if s.get("purpose") == "suite"],
                                        n)
    finally:
        scorer.close()
    return _finish(a.out, result, t0)


def _finish(out: str, result: dict[str, Any], t0: float) -> int:
    """Both modes' end: the per-build summary, the raw file, a line per build."""
    result["summary"] = {n: summary(r) for n, r in result["builds"].items()}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_raw(Path(out), result)
    for n, s in result["summary"].items():
        print(f"{n:40s} {s['tokens']:6d} tokens {s['outside']:4d} outside, {s['threshold_outside']:4d} past a "
              f"threshold cut, max reach {s['max_reach']}, past {s['past']}")
    return 0


def _own(a: argparse.Namespace, argv: list[str] | None, names: list[str], where: dict[str, Path], t0: float) -> int:
    """--own: every gate's reaches as its own scorer placed them; the baseline's from the first gate's report (each
    gate scores the same baseline file with its own candidate)."""
    result: dict[str, Any] = {**raw_header("bench/cut_reach.py", argv), "baseline_file": None, "order": "the gates'",
                              "scorer": "each gate's own (its report's per-cut reach lists)", "builds": {}}
    try:
        placed = {n: own_scorer(json.loads(where[n].read_text())) for n in names}
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result["builds"][f"target-only (baseline file, scored by {names[0]})"] = placed[names[0]][1]
    result["builds"].update({n: placed[n][0] for n in names})
    return _finish(a.out, result, t0)


if __name__ == "__main__":
    raise SystemExit(main())
