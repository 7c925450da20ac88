"""Tables of the kernel-level GPU proof (tests/ddtree/gpu_proof.sh, tests/ddtree/test_tree_verify_gpu.py):
one row per budget, one column per top-k, every variant's cell (PASS/FAIL and max |out - ref|).

Used by tests/ddtree/render_results.py on the GPU machine and by bench/render_docs.py (block
`ddtree-gpu-proof`) on the committed raw results.
"""

from __future__ import annotations

from typing import Any

BUDGETS = [1, 3, 7, 8, 12, 15, 16, 31, 32, 63]
TOPKS = [1, 2, 4, 8]


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not run"
    if r.get("max_err") is None:
        return "**FAIL** " + (r.get("error") or "error").split(":")[0]
    e = f"{r['max_err']:.3g}"
    return f"PASS {e}" if r["passed"] else f"**FAIL** {e}"


VARIANTS = ("patched", "unpatched", "mutant")
BLOCK = 8


def _group(rows: list[dict[str, Any]]) -> dict:
    """{(backend, variant): {(mode, budget, topk): row}} from per-cell result rows."""
    out: dict = {}
    for r in rows:
        if "budget" in r:
            out.setdefault((r.get("backend", "triton"), r["sglang"]), {})[(r["mode"], r["budget"], r["topk"])] = r
    return out


def render_rows(rows: list[dict[str, Any]], note: str = "") -> str:
    """Per backend and mode, one table of every variant's cells (each followed by `note`), then a
    summary line per backend."""
    data = _group(rows)
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
            lines += ["", note, ""] if note else [""]
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



def render_doc(raw: dict[str, Any], path: str) -> str:
    """The committed raw file (bench/render_docs.py): its run notes, then the tables."""
    cmds = "; ".join(f"`{c}`" for c in raw.get("commands", []))
    runs = ", ".join(f"{k} {v}" for k, v in (raw.get("pytest") or {}).items())
    return (f"Run {raw.get('date', '?')} on {raw.get('machine', '?')}. {raw.get('setup', '')}. Commands: {cmds}. "
            f"pytest: {runs}.\n\n" + render_rows(raw.get("rows", []), f"Raw: {path}")
            + f"\nRaw: {path} (one row per cell)\n")
