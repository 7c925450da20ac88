"""Render the GPU proof's results-{patched,unpatched}.jsonl as the markdown tables
in docs/ddtree-gpu-proof.md.

Usage: python tests/ddtree/render_results.py OUT_DIR [--backend flashinfer|triton]
       python tests/ddtree/render_results.py OUT/results-all.jsonl --all   (patched/unpatched/mutant)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BUDGETS = [1, 3, 7, 8, 12, 15, 16, 31, 32, 63]
TOPKS = [1, 2, 4, 8]


def _load(path: Path, backend: str) -> dict:
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r.get("backend", "triton") == backend and "budget" in r:
                rows[(r["mode"], r["budget"], r["topk"])] = r
    return rows


def _cell(r) -> str:
    if r is None:
        return "not run"
    if r.get("max_err") is None:
        return "**FAIL** " + (r.get("error") or "error").split(":")[0]
    e = f"{r['max_err']:.3g}"
    return f"PASS {e}" if r["passed"] else f"**FAIL** {e}"


def render(out_dir: Path, backend: str) -> str:
    pat = _load(out_dir / "results-patched.jsonl", backend)
    unp = _load(out_dir / "results-unpatched.jsonl", backend)
    lines = []
    for mode in ("eager", "cuda_graph"):
        lines += [f"### {backend}: {mode}", "",
                  "| budget (q) | " + " | ".join(f"top-k {k}: patched / unpatched" for k in TOPKS) + " |",
                  "|---" * (len(TOPKS) + 1) + "|"]
        for b in BUDGETS:
            cells = [f"{_cell(pat.get((mode, b, k)))} / {_cell(unp.get((mode, b, k)))}" for k in TOPKS]
            lines.append(f"| {b} ({b + 1}) | " + " | ".join(cells) + " |")
        lines.append("")
    summ = []
    for label, rows in (("patched", pat), ("unpatched", unp)):
        for mode in ("eager", "cuda_graph"):
            rs = [r for (m, _, _), r in rows.items() if m == mode]
            ok = [r for r in rs if r.get("passed")]
            mx = max((r["max_err"] for r in ok), default=None)
            summ.append(f"{label} {mode}: {len(ok)}/{len(rs)} pass"
                        + (f" (max err of passing cells {mx:.2g})" if mx is not None else ""))
    lines.append("Summary: " + "; ".join(summ))
    return "\n".join(lines)


VARIANTS = ("patched", "unpatched", "mutant")
BLOCK = 8


def _load_all(path: Path) -> dict:
    """results-all.jsonl (gpu_proof.sh JOBS=...): {(backend, variant): {(mode, budget, topk): row}}."""
    out: dict = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if "budget" in r:
            out.setdefault((r.get("backend", "triton"), r["sglang"]), {})[(r["mode"], r["budget"], r["topk"])] = r
    return out


def render_all(path: Path) -> str:
    data = _load_all(path)
    lines = []
    for backend in ("triton", "flashinfer"):
        vs = [v for v in VARIANTS if (backend, v) in data]
        if not vs:
            continue
        for mode in ("eager", "cuda_graph"):
            lines += [f"### {backend}: {mode}", "",
                      "| budget (q) | " + " | ".join(f"top-k {k}: {' / '.join(vs)}" for k in TOPKS) + " |",
                      "|---" * (len(TOPKS) + 1) + "|"]
            for b in BUDGETS:
                cells = [" / ".join(_cell(data[(backend, v)].get((mode, b, k))) for v in vs) for k in TOPKS]
                lines.append(f"| {b} ({b + 1}) | " + " | ".join(cells) + " |")
            lines.append("")
        summ = []
        for v in vs:
            for mode in ("eager", "cuda_graph"):
                rs = [r for (m, _, _), r in data[(backend, v)].items() if m == mode]
                ok = [r for r in rs if r.get("passed")]
                bad = [r["max_err"] for r in rs if not r.get("passed") and r.get("max_err") is not None]
                mx = max((r["max_err"] for r in ok), default=None)
                summ.append(f"{v} {mode}: {len(ok)}/{len(rs)} pass"
                            + (f" (max err of passing cells {mx:.2g})" if mx is not None else "")
                            + (f" (failing errors {min(bad):.3g}..{max(bad):.3g})" if bad else ""))
            if v == "mutant":
                for mode in ("eager", "cuda_graph"):
                    rs = data[(backend, v)]
                    fail = {(b, k) for (m, b, k), r in rs.items() if m == mode and not r.get("passed")}
                    run = {(b, k) for (m, b, k) in rs if m == mode}
                    pred = {(b, k) for (b, k) in run if b + 1 != BLOCK}
                    summ.append(f"mutant {mode}: fails exactly where budget+1 != {BLOCK}: {fail == pred}"
                                + ("" if fail == pred else
                                   f" (fail but predicted pass: {sorted(fail - pred)};"
                                   f" pass but predicted fail: {sorted(pred - fail)})"))
        lines.append(f"Summary ({backend}): " + "; ".join(summ))
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path, help="dir with results-{patched,unpatched}.jsonl, or with --all a "
                    "results-all.jsonl file")
    ap.add_argument("--backend", default="flashinfer")
    ap.add_argument("--all", action="store_true", help="render every backend and variant of results-all.jsonl")
    a = ap.parse_args()
    print(render_all(a.out_dir) if a.all else render(a.out_dir, a.backend))


if __name__ == "__main__":
    main()
