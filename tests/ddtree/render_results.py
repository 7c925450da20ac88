"""Render the GPU proof's results-{patched,unpatched}.jsonl as the markdown tables
in docs/ddtree-gpu-proof.md.

Usage: python tests/ddtree/render_results.py OUT_DIR [--backend flashinfer|triton]
       python tests/ddtree/render_results.py OUT/results-all.jsonl --all   (patched/unpatched/mutant)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_proof_table import BUDGETS, TOPKS, _cell, render_rows


def _load(path: Path, backend: str) -> dict:
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r.get("backend", "triton") == backend and "budget" in r:
                rows[(r["mode"], r["budget"], r["topk"])] = r
    return rows


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path, help="dir with results-{patched,unpatched}.jsonl, or with --all a "
                    "results-all.jsonl file")
    ap.add_argument("--backend", default="flashinfer")
    ap.add_argument("--all", action="store_true", help="render every backend and variant of results-all.jsonl")
    a = ap.parse_args()
    if a.all:
        rows = [json.loads(line) for line in a.out_dir.read_text().splitlines() if line.strip()]
        print(render_rows(rows))
    else:
        print(render(a.out_dir, a.backend))


if __name__ == "__main__":
    main()
