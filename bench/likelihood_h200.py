"""The likelihood test on the stored H200 gate runs: every build's T>0 suite answers against the target-only
server's, scored under the target model by the in-process reference model.

    OPENBLAS_NUM_THREADS=1 python bench/likelihood_h200.py \
        --gates docs/results/incident-gated-gates-2026-12-02.tgz \
        --baseline docs/results/incident-gated-baseline-2026-12-02.json \
        --out docs/results/likelihood-h200-run4-2026-12-03.json

The H200 target was SmolLM2-135M-Instruct in bf16 converted from the same GGUF file the reference model
reads (docs/incident.md), so the numpy forward pass scores its answers under (nearly) the same model. The
stored baseline keeps texts only, no finish reason, so the end-of-turn token is scored on neither side.
Its seeds are the candidates' seeds (1234, 2345, 3456: recorded before the likelihood test made them
disjoint); answers identical to the baseline's at the same seed are counted in the result.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.likelihood_common import ScoreCache, provenance  # noqa: E402
from sglfleet.pipeline.errors import UsageError, cli_main  # noqa: E402
from sglfleet.validation.config import load_gate_config  # noqa: E402
from sglfleet.validation.likelihood import likelihood_test  # noqa: E402
from sglfleet.validation.scorers import AnswerScore, make_scorer  # noqa: E402
from sglfleet.validation.suite import load_suite  # noqa: E402

TEMPS = (0.6, 0.8, 1.0)


def verdict_row(v) -> dict:
    return {"temperature": v.temperature, "ok": v.ok, "p_mean_nll": v.statistic.get("mean_nll", {}).get("p_value"),
            "p_worst_window_nll": v.statistic.get("worst_window_nll", {}).get("p_value"),
            "z_mean_nll": v.statistic.get("mean_nll", {}).get("z"),
            "z_worst_window_nll": v.statistic.get("worst_window_nll", {}).get("z"),
            "alpha_per_statistic": v.statistic.get("alpha_per_statistic"),
            "impossible_tokens": len(v.support.get("impossible") or []), "support": {
                k: v.support[k] for k in ("log_eps", "bound", "n_tokens", "min_log_p_T")},
            "n_candidate": v.n_candidate, "n_baseline": v.n_baseline, "reason": v.reason,
            "power": v.power, "evidence": v.evidence[:8]}


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/likelihood_h200.py")
    ap.add_argument("--gates", required=True, help="tgz of gates/<build>/samples.jsonl")
    ap.add_argument("--baseline", required=True, help="record-baseline JSON of the target-only server, or its gate "
                    "report (report.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default="/tmp/lik/scores-h200.jsonl")
    ap.add_argument("--config", default=str(REPO / "src/sglfleet/validation/profiles/sglang-smollm2.yaml"))
    ap.add_argument("--power-reps", type=int, default=None)
    a = ap.parse_args(argv)
    cfg = load_gate_config(a.config)
    if a.power_reps is not None:
        cfg = cfg.model_copy(update={"likelihood": cfg.likelihood.model_copy(update={"power_reps": a.power_reps})})
    suite = load_suite(cfg.suite)
    try:
        base_doc = json.loads(Path(a.baseline).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read baseline {a.baseline}: {exc}") from None
    t0 = time.time()
    model = base_doc.get("model") or (base_doc.get("summary") or {}).get("model")
    scorer = make_scorer("reference", cfg, model=model)
    cache = ScoreCache(a.cache, scorer, suite)
    # a record-baseline file (T>0 texts) or a gate report of the target-only server (its suite answers)
    base_rows = [s for s in base_doc.get("samples") or [] if float(s["temperature"]) > 0
                 and s.get("purpose", "suite") == "suite" and not s.get("error")]
    base_by = {(s["prompt_id"], float(s["temperature"]), s["seed"]): s["text"] for s in base_rows}
    base: dict[float, list[AnswerScore]] = {t: [] for t in TEMPS}
    for s in base_rows:
        base[float(s["temperature"])].append(cache.score(s["prompt_id"], float(s["temperature"]), s["seed"],
                                                         s["text"], False))
    from sglfleet.validation.likelihood import make_variants

    variants = {t: make_variants([(b, suite.get(b.prompt_id).messages(), base_by[(b.prompt_id, t, b.seed)])
                                  for b in base[t]], _Cached(cache), cfg.likelihood) for t in TEMPS}
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(a.gates) as tf:
            tf.extractall(tmp, filter="data")
        builds = {}
        for d in sorted(Path(tmp).glob("gates/*")):
            f = d / "samples.jsonl"
            if not f.is_file():
                continue
            rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
            hot = [r for r in rows if r.get("purpose") == "suite" and float(r["temperature"]) > 0]
            ok_rows = [r for r in hot if not r.get("error")]
            out = {"answers": len(hot), "request_errors": len(hot) - len(ok_rows),
                   "identical_to_baseline_at_same_seed": sum(
                       1 for r in ok_rows if base_by.get((r["prompt_id"], float(r["temperature"]), r["seed"]))
                       == r["text"]), "temperatures": []}
            for t in TEMPS:
                cand = [cache.score(r["prompt_id"], t, r["seed"], r["text"] or "", False)
                        for r in ok_rows if float(r["temperature"]) == t]
                v = likelihood_test(cand, base[t], cfg, n_temperatures=len(TEMPS), variants=variants[t])
                out["temperatures"].append(verdict_row(v))
            out["passed"] = all(x["ok"] for x in out["temperatures"])
            builds[d.name] = out
            print(f"{d.name}: {'PASS' if out['passed'] else 'FAIL'} "
                  + " ".join(f"T{x['temperature']:g}:{'ok' if x['ok'] else 'FAIL'}(p={x['p_mean_nll']},"
                             f"{x['p_worst_window_nll']}; imp={x['impossible_tokens']})" for x in out["temperatures"]),
                  flush=True)
    scorer.close()
    doc = {**provenance(sys.argv), "gates": a.gates, "baseline": a.baseline, "config": a.config,
           "scorer": scorer.method, "likelihood_config": cfg.likelihood.model_dump(),
           "top_p": cfg.sampling.top_p, "wall_s": round(time.time() - t0, 1), "builds": builds}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


class _Cached:
    """A Scorer view of the cache (make_variants scores through it, so variants are scored once)."""

    def __init__(self, cache: ScoreCache) -> None:
        self.cache = cache
        self.name = cache.scorer.name
        self.method = cache.scorer.method

    def score(self, messages, answer, temperature, *, prompt_id="", seed=None, stop=False):
        return self.cache.score(prompt_id, temperature, seed, answer, stop)

    def close(self) -> None:
        pass


if __name__ == "__main__":
    sys.exit(main())
