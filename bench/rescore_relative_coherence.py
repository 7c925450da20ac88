"""Re-judge the real SGLang gates of 2026-12-01 with baseline-relative coherence (validation/coherence.py).

    python bench/rescore_relative_coherence.py [--profile P] [--out FILE.json]

(default out: docs/results/relative-coherence-rescore-2026-12-01.json)

Reads the committed raw files: every gated server's `samples.jsonl` from
docs/results/incident-gates-samples-2026-12-01.tgz and, as the baseline, the T>0 suite answers of the
target-only server's gate report docs/results/incident-gate-base-2026-12-01.json (same model, seed 1234).
Every text (candidate and baseline) is scored again with the profile's current detectors; the candidate's
T>0 suite answers are judged against the baseline with `relative_coherence_cases` — the function the gate
runs — and, for contrast, with today's zero tolerance (any flagged T>0 answer fails). The run has one seed
per prompt (8 answers per temperature); a gate with the profile's `coherence.seeds` samples 3x as many.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from validation.coherence import baseline_from_report, relative_coherence_cases, rescored_sample  # noqa: E402
from validation.config import load_gate_config  # noqa: E402

SAMPLES = "docs/results/incident-gates-samples-2026-12-01.tgz"
BASELINE = "docs/results/incident-gate-base-2026-12-01.json"
PROFILE = "validation/profiles/sglang-smollm2.yaml"
OUT = "docs/results/relative-coherence-rescore-2026-12-01.json"


def role(server: str) -> str:
    if server.startswith("mutant"):
        return "known bad (the incident bug)"
    if server.startswith("unpatched"):
        return "suspect (unpatched build)"
    return "correct"


def rescore(samples_tgz: Path, baseline_report: Path, profile: str) -> dict[str, Any]:
    cfg = load_gate_config(REPO / profile)
    base = baseline_from_report(json.loads(baseline_report.read_text()))
    servers = []
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(samples_tgz) as tf:
            tf.extractall(tmp, filter="data")
        for d in sorted((Path(tmp) / "gates").iterdir()):
            rows = [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines() if x.strip()]
            cand = [rescored_sample(r, cfg) for r in rows if r.get("purpose") == "suite"]
            verdicts = [c for c in relative_coherence_cases(cand, base, cfg)
                        if c.name.startswith("coherence_vs_baseline@")]
            per_t = [{"temperature": float(c.name.rsplit("@T", 1)[1]),
                      **{k: c.details.get(k) for k in ("candidate_flagged", "candidate_n", "baseline_flagged",
                                                       "baseline_n", "p_value", "significant", "over_max_rate")},
                      "ok": c.ok, "flagged": [o["sample"] + ": " + ",".join(o["checks"])
                                              for o in c.details.get("offending", [])]}
                     for c in verdicts]
            hot = [s for s in cand if s.temperature > 0]
            flagged = sum(1 for s in hot if any(f.check != "fluency" for f in s.findings))
            servers.append({"server": d.name, "role": role(d.name), "per_temperature": per_t,
                            "flagged_t_gt_0": flagged, "n_t_gt_0": len(hot),
                            "zero_tolerance": "FAIL" if flagged else "PASS",
                            "relative": "PASS" if all(c.ok for c in verdicts) else "FAIL"})
    temps = sorted({t for t in cfg.temperatures if t > 0})
    c = cfg.coherence
    return {
        "command": "python bench/rescore_relative_coherence.py"
                   + (f" --profile {profile}" if profile != PROFILE else ""),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "samples": SAMPLES, "baseline": BASELINE, "profile": profile,
        "parameters": {"alpha": c.alpha, "max_rate": c.max_rate, "temperatures": temps,
                       "p_threshold": c.alpha / len(temps), "test": "one-sided Fisher exact (candidate worse), "
                       "Bonferroni over the T>0 temperatures; or candidate rate > max_rate"},
        # the baseline's counts are the same in every server's row (one baseline, scored once per row)
        "baseline_flagged": {f"{r['temperature']:g}": r["baseline_flagged"] for r in servers[0]["per_temperature"]},
        "baseline_n": {f"{r['temperature']:g}": r["baseline_n"] for r in servers[0]["per_temperature"]},
        "servers": servers,
        "summary": {
            "correct_pass_relative": sum(1 for s in servers if s["role"] == "correct" and s["relative"] == "PASS"),
            "correct_pass_zero_tolerance": sum(1 for s in servers if s["role"] == "correct"
                                               and s["zero_tolerance"] == "PASS"),
            "correct": sum(1 for s in servers if s["role"] == "correct"),
            "mutant_relative": next((s["relative"] for s in servers if s["server"].startswith("mutant")), None),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=PROFILE, help="gate profile (thresholds and coherence parameters)")
    ap.add_argument("--out", default=OUT, help="result JSON (relative to the repository)")
    args = ap.parse_args(argv)
    out = rescore(REPO / SAMPLES, REPO / BASELINE, args.profile)
    (REPO / args.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    for s in out["servers"]:
        cells = "  ".join(f"T{r['temperature']:g} {r['candidate_flagged']}/{r['candidate_n']} p={r['p_value']:.3g}"
                          for r in s["per_temperature"])
        print(f"{s['server']:18} {s['role']:30} {cells}  zero-tolerance {s['zero_tolerance']}  "
              f"relative {s['relative']}")
    print(json.dumps(out["summary"]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
