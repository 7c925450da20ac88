"""How often each build's T>0 tokens fall outside their request's law, per token, against the target-only
baseline's own rate, in the production-sequence series on the GPU (tests/ddtree/prodseq.py raw files).

Each gate's per-token test counts its candidate's tokens outside the request's law (top-p nucleus, top-k, min-p)
as the candidate's own scorer places them, and the baseline file's tokens the same way: a correct sampler's rate
is the baseline's (the scorer's numeric flips at the cuts, nothing else). A series shares one baseline file, so
its baseline is counted once; a build's count is summed over its gates and the three temperatures. The test is
the exact conditional one for two Poisson rates: given k_b + k_0 outside tokens, k_b is binomial with
p = n_b / (n_b + n_0) when the rates are equal (two-sided: twice the smaller tail).

Why: the DFLASH chain's count per run was higher than the DDTree builds' in every series (docs/production-gate.md,
"What is left"); per token and against the baseline, is it?

    python bench/prodseq_rates.py docs/results/prodseq-h100-2026-12-06-s3[123].json.gz \
        --out docs/results/prodseq-rates-2026-12-07.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/ is the lab, not an installed package
    sys.path.insert(0, str(REPO))

from bench.history import raw_header, raw_text, write_raw  # noqa: E402
from sglfleet.validation.tokenlaw import binomial_sum_tail  # noqa: E402

CORRECT = ("chain", "b7-k4", "b16-k4", "b16-k4-overlap")


def two_rates_p(strata: Sequence[tuple[int, int, int, int]]) -> float:
    """Two-sided exact conditional p that, in every stratum (k outside of n tokens, k0 of n0), the two sides share
    one rate (the rate may differ between strata: a series' rules and baseline): given each stratum's k + k0, the
    sum of the k is a sum of binomials with shares n / (n + n0)."""
    use = [(k, k + k0, n / (n + n0)) for k, n, k0, n0 in strata if n > 0 and n0 > 0]
    k_sum = sum(k for k, _, _ in use)
    law = [(m, share) for _, m, share in use]
    if not any(m for m, _ in law):
        return 1.0
    return min(1.0, 2.0 * min(binomial_sum_tail(k_sum, law, upper=True), binomial_sum_tail(k_sum, law, upper=False)))


def series_counts(raw: dict[str, Any]) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Per build: gates, tokens and outside tokens summed over its gates' T>0 temperatures, in all and per cut
    ("top_p:tokens", "top_p:outside", ...: the tokens of requests with that cut, those outside it); the
    baseline's once (its numbers per temperature are the same in every gate of a series: the largest kept)."""
    builds: dict[str, dict[str, int]] = {}
    base_t: dict[str, tuple[int, int, dict[str, list[int]]]] = {}
    for g in raw.get("gates", []):
        per = [(t, (lk or {}).get("per_token")) for t, lk in (g.get("likelihood") or {}).items()]
        per = [(t, pt) for t, pt in per if pt and pt.get("n_candidate")]
        if not per:
            continue
        b = builds.setdefault(g["server"], {"gates": 0, "tokens": 0, "outside": 0})
        b["gates"] += 1
        for t, pt in per:
            b["tokens"] += int(pt["n_candidate"])
            b["outside"] += int(pt.get("outside_candidate", 0))
            for cut, (n, k) in (pt.get("cut_candidate") or {}).items():  # tokens under that cut, outside it
                b[f"{cut}:tokens"] = b.get(f"{cut}:tokens", 0) + int(n)
                b[f"{cut}:outside"] = b.get(f"{cut}:outside", 0) + int(k)
            seen = (int(pt.get("n_baseline", 0)), int(pt.get("outside_baseline", 0)))
            if seen >= base_t.get(t, (0, 0, {}))[:2]:
                base_t[t] = (*seen, pt.get("cut_baseline") or {})
    base = {"tokens": sum(v[0] for v in base_t.values()), "outside": sum(v[1] for v in base_t.values())}
    for v in base_t.values():
        for cut, (n, k) in v[2].items():
            base[f"{cut}:tokens"] = base.get(f"{cut}:tokens", 0) + int(n)
            base[f"{cut}:outside"] = base.get(f"{cut}:outside", 0) + int(k)
    return builds, base


def _rate(k: int, n: int) -> float | None:
    return round(1000 * k / n, 3) if n else None


def _row(name: str, pairs: Sequence[tuple[dict[str, int], dict[str, int]]]) -> dict[str, Any]:
    """A build against the baseline over one or more series (pairs of the build's counts and that series'
    baseline counts): in all and per threshold/nucleus cut (tokens of the requests that have the cut)."""
    def side(key: str) -> dict[str, Any]:
        strata = [(c.get(f"{key}outside", 0), c.get(f"{key}tokens", 0), b.get(f"{key}outside", 0),
                   b.get(f"{key}tokens", 0)) for c, b in pairs]
        k, n = sum(x[0] for x in strata), sum(x[1] for x in strata)
        k0, n0 = sum(x[2] for x in strata), sum(x[3] for x in strata)
        rate, base = _rate(k, n), _rate(k0, n0)
        return {"tokens": n, "outside": k, "per_1000": rate, "baseline_tokens": n0, "baseline_outside": k0,
                "baseline_per_1000": base, "ratio": round(rate / base, 3) if rate is not None and base else None,
                "p": float(f"{two_rates_p(strata):.3g}")}
    cuts = sorted({key.split(":")[0] for c, _ in pairs for key in c if ":" in key})
    return {"build": name, "gates": sum(c["gates"] for c, _ in pairs), **side(""),
            "cuts": {cut: side(f"{cut}:") for cut in cuts}}


def measure(paths: Sequence[Path]) -> dict[str, Any]:
    series = []
    by_build: dict[str, list[tuple[dict[str, int], dict[str, int]]]] = {}
    for path in paths:
        raw = json.loads(raw_text(path))
        builds, base = series_counts(raw)
        if not builds:
            raise ValueError(f"{path}: no gate with per-token counts")
        series.append({"raw": str(path.relative_to(REPO) if path.is_relative_to(REPO) else path),
                       "commit": raw.get("commit"), "date": raw.get("date"),
                       "baseline": {"tokens": base["tokens"], "outside": base["outside"],
                                    "per_1000": _rate(base["outside"], base["tokens"])},
                       "builds": [_row(n, [(c, base)]) for n, c in sorted(builds.items())]})
        for n, c in builds.items():
            by_build.setdefault(n, []).append((c, base))
    out: dict[str, Any] = {"series": series,
                           "pooled": [_row(n, by_build[n]) for n in CORRECT if n in by_build]}
    if "chain" in by_build and "b16-k4" in by_build:  # the chain against b16/k4, gate counts of the same series
        both = [(c, next(d for d, b2 in by_build["b16-k4"] if b2 is b)) for c, b in by_build["chain"]
                if any(b2 is b for _, b2 in by_build["b16-k4"])]
        out["chain_vs_b16"] = _row("chain vs b16-k4", both)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raws", nargs="+", type=Path, help="prodseq raw files (docs/results/prodseq-*.json.gz)")
    ap.add_argument("--out", type=Path, help="write the raw result here (.json or .json.gz)")
    a = ap.parse_args(argv)
    missing = [str(p) for p in a.raws if not p.is_file()]
    if missing:
        print(f"prodseq_rates: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        res = measure([p.resolve() for p in a.raws])
    except (ValueError, KeyError, json.JSONDecodeError, gzip.BadGzipFile) as e:
        print(f"prodseq_rates: {e}", file=sys.stderr)
        return 2
    for s in [*res["series"], {"raw": "pooled over the series", "commit": "-", "baseline": None,
                                "builds": res["pooled"] + [res.get("chain_vs_b16")] * ("chain_vs_b16" in res)}]:
        print(f"{s['raw']} ({s['commit']})")
        for r in s["builds"]:
            cuts = "  ".join(f"{c} {v['outside']}/{v['tokens']} x{v['ratio']} p {v['p']:.2g}"
                             for c, v in r["cuts"].items())
            print(f"  {r['build']:34s} {r['outside']:4d}/{r['tokens']:6d} vs {r['baseline_outside']}/"
                  f"{r['baseline_tokens']}  x{r['ratio']}  p {r['p']:.3g}   {cuts}")
    if a.out:
        write_raw(a.out, {**raw_header("bench/prodseq_rates.py", argv), **res})
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
