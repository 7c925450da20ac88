"""Render bench/ddtree_step.py's raw JSON: decode tok/s side by side, and DDTree's per-step breakdown.

    python3 bench/render_ddtree_step.py docs/results/ddtree-step-2026-12-03-run2.json.xz

bench/render_docs.py calls `render` for the `ddtree-step` blocks of docs/ddtree-step.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

STAGES = ("draft", "topk", "tree", "mask", "prepare", "verify", "accept", "commit", "draft_kv")
PATHS = ("device", "graphed", "eager", "host")
# the draft stage's first parts, marked since 2026-12-07 (sglang_ddtree.worker): the host copy of the prefix lengths
# (under the overlap scheduler, resolved from what the step before published) and the drafter launch's preparation
DRAFT_PARTS = ("lens", "draft_prep")


def _f(v: float | None, d: int = 0) -> str:
    return "—" if v is None else f"{v:.{d}f}"


def _cell(cells: list[dict], **want: Any) -> dict | None:
    for c in cells:
        if all(c.get(k) == v for k, v in want.items()):
            return c
    return None


def _graphs_measured(raw: dict) -> bool:
    """Runs before tree_device.GraphedTree had no `eager` cells: their `device` path was the eager ops."""
    return any(c.get("path") == "eager" for s in raw["servers"] for c in s.get("cells", []))


def _kernel_measured(raw: dict) -> bool:
    """Runs since the tree kernel and the draft graph's head have `graphed` cells (the previous default)."""
    return any(c.get("path") == "graphed" for s in raw["servers"] for c in s.get("cells", []))


def _path_name(raw: dict, path: str) -> str:
    if _kernel_measured(raw):
        return {"device": "device (head in the draft graph, tree kernel)",
                "graphed": "graphed (run 2's default)", "eager": "eager ops", "host": "host (numpy)"}[path]
    if path == "device" and not _graphs_measured(raw):
        return "device (eager ops, before CUDA graphs)"
    return {"device": "device (CUDA graphs)", "eager": "device, eager ops", "host": "host (numpy)"}[path]


def _label(s: dict, path: str | None = None, k: int | None = None) -> str:
    if s["kind"] == "target":
        return "target-only"
    if s["kind"] == "chain":
        return "DFLASH chain (block 8)"
    return f"DDTree b{s['budget']}/k{k} {path}"


def throughput_rows(raw: dict) -> list[tuple[str, dict[str, dict | None]]]:
    """(label, {column: cell}) per method in the run."""
    out = []
    for s in raw["servers"]:
        cells = s.get("cells", [])
        if s["kind"] == "target":
            out.append((_label(s), {"branch1": _cell(cells, streams=1), "top11": _cell(cells, streams=1),
                                    "branch4": _cell(cells, streams=4), "top14": _cell(cells, streams=4)}))
            continue
        combos = [(None, None)] if s["kind"] == "chain" else [
            (p, k) for k in raw.get("topks", (4, 8)) for p in PATHS]
        for path, k in combos:
            sel = {} if path is None else {"path": path, "topk": k}
            got = {f"{o}{n}": _cell(cells, oracle=o, streams=n, **sel) for o in ("branch", "top1") for n in (1, 4)}
            if any(got.values()):
                out.append((_label(s, path if path is None else _path_name(raw, path), k), got))
    return out


def render_throughput(raw: dict) -> list[str]:
    rows = throughput_rows(raw)
    base = rows[0][1]["branch1"] if rows and rows[0][0] == "target-only" else None
    base_tok = base.get("tok_s") if base else None
    lines = ["| method | branch oracle, 1 stream: tok/s | accept | vs target-only | top1 oracle, 1 stream: tok/s "
             "| accept | vs target-only | branch, 4 streams: tok/s | top1, 4 streams: tok/s | identical to target |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, c in rows:
        def tok(key: str, c: dict = c) -> float | None:
            cell = c.get(key)
            return cell.get("tok_s") if cell else None

        def acc(key: str, c: dict = c) -> str:
            cell = c.get(key)
            return _f(cell.get("accept_length"), 2) if cell and cell.get("accept_length") else "1"

        def ratio(key: str) -> str:
            t = tok(key)
            return f"{t / base_tok:.2f}x" if t and base_tok else "—"

        same = [cell["identical_to_target"] for cell in c.values() if cell]
        n_ok = sum(int(x.split("/")[0]) for x in same)
        n_all = sum(int(x.split("/")[1]) for x in same)
        if label == "target-only":  # one set of cells, shown under both oracles
            n_ok, n_all = n_ok // 2, n_all // 2
        lines.append(f"| {label} | {_f(tok('branch1'))} | {acc('branch1')} | {ratio('branch1')} | {_f(tok('top11'))} "
                     f"| {acc('top11')} | {ratio('top11')} | {_f(tok('branch4'))} | {_f(tok('top14'))} "
                     f"| {n_ok}/{n_all} |")
    return lines


def profile_totals(s: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for prof in s.get("profiles", {}).values():
        out.update(prof.get("totals", {}))
    return out


def breakdown(t: dict) -> dict[str, float]:
    """Mean ms per step: GPU time per stage (stream events), the gap before the next step, the host's
    time in tree + mask + accept."""
    n = max(1, t["steps"])
    row = {st: t["gpu_ms"].get(st, 0.0) / n for st in STAGES}
    # the draft stage's parts a later worker marks (lens, draft_prep; profiling only) count in its draft column
    row["draft"] += sum(t["gpu_ms"].get(st, 0.0) for st in DRAFT_PARTS) / n
    row["between"] = t["gap_ms"] / max(1, t["gaps"])
    row["step"] = sum(t["gpu_ms"].values()) / n + row["between"]
    row["host_tree"] = sum(t["host_ms"].get(st, 0.0) for st in ("tree", "mask", "accept")) / n
    row["steps"] = t["steps"]
    return row


def render_breakdown(raw: dict, oracle: str = "branch", streams: int = 1) -> list[str]:
    lines = ["| DDTree step | steps | " + " | ".join(STAGES) + " | between steps | step | outside verify "
             "| outside verify + drafter | host: tree+mask+accept |",
             "|---|---|" + "---|" * (len(STAGES) + 5)]
    for s in raw["servers"]:
        if s["kind"] != "ddtree":
            continue
        totals = profile_totals(s)
        for k in raw.get("topks", (4, 8)):
            for path in PATHS:
                key = next((key for key in totals if key.endswith(f"/{oracle}-k{k}-{path}-s{streams}")), None)
                if key is None:
                    continue
                r = breakdown(totals[key])
                out = (r["step"] - r["verify"]) / r["step"]
                out2 = (r["step"] - r["verify"] - r["draft"]) / r["step"]
                lines.append(f"| b{s['budget']}/k{k} {_path_name(raw, path)} | {r['steps']} | "
                             + " | ".join(_f(r[st], 2) for st in STAGES)
                             + f" | {_f(r['between'], 2)} | {_f(r['step'], 2)} | {out:.0%} | {out2:.0%} "
                               f"| {_f(r['host_tree'], 2)} |")
    return lines


def render(raw: dict, path: str) -> str:
    lines = render_throughput(raw)
    lines += ["", "Per-step breakdown, branch oracle, 1 stream (ms per step, mean; GPU time between CUDA events on "
              "the stream, so a stage the host is slow to issue shows its wait):", ""]
    lines += render_breakdown(raw)
    lines += ["", f"Raw: {path} ({raw.get('date')}, {raw.get('machine')}; `{raw.get('command')}`)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repo root
    from bench.history import render_main

    return render_main(argv, render, "render_ddtree_step.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
