"""Render a serve-matrix result (tests/ddtree/serve_matrix.py, raw JSON kept in docs/results/) as
Markdown tables: per server, whether it served, and per request group how many greedy outputs
equal the target-only baseline, with the mean accept length from meta_info; where an output
differs, the first differing position and the baseline's top-2 log-prob gap there (a near-tie
when the gap is under --tie-nats).

    python bench/ddtree_serve_table.py docs/results/ddtree-serve-....json [--tie-nats 0.05]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _gap(top2_row) -> float | None:
    if not top2_row or len(top2_row) < 2:
        return None
    return float(top2_row[0][0]) - float(top2_row[1][0])


def summarize(doc: dict, tie_nats: float) -> dict:
    servers = doc["servers"]
    base = next((s for s in servers if s["name"] == "base-eager"), None)
    base_by_len = {}
    if base:
        base_by_len = {r["prompt_len"]: r for r in base["results"] if r.get("output_ids") is not None}
    rows = []
    for s in servers:
        row = {"name": s["name"], "up_s": s["up_s"], "error": _short(s["error"]), "groups": {}}
        for r in s["results"]:
            g = row["groups"].setdefault(r["tag"], {"n": 0, "same": 0, "errors": 0, "accept": [], "diffs": []})
            g["n"] += 1
            if r.get("output_ids") is None:
                g["errors"] += 1
                continue
            b = base_by_len.get(r["prompt_len"])
            if r["meta"].get("spec_accept_length") is not None:
                g["accept"].append(float(r["meta"]["spec_accept_length"]))
            if b is None or r["tag"].startswith("t0.8"):
                continue
            d = first_diff(r["output_ids"], b["output_ids"])
            if d is None:
                g["same"] += 1
            else:
                top2 = (b["meta"].get("top2") or [])
                gap = _gap(top2[d]) if d < len(top2) else None
                g["diffs"].append({"prompt_len": r["prompt_len"], "pos": d, "gap": gap,
                                   "near_tie": gap is not None and gap < tie_nats})
        rows.append(row)
    return {"rows": rows, "baseline_ok": bool(base_by_len)}


def _short(err: str | None) -> str | None:
    if not err:
        return None
    lines = [ln.strip() for ln in err.splitlines() if ("Error" in ln or "error" in ln) and "py-spy" not in ln.lower()]
    return (lines[-1] if lines else err.strip().splitlines()[-1])[:160]


def render(doc: dict, tie_nats: float) -> str:
    s = summarize(doc, tie_nats)
    out = [f"Run {doc['date']} on {doc['machine']}; command `{doc['command']}`; model {doc.get('model', 'tiny')}, "
           f"block {doc['block']}, {doc['max_new_tokens']} new tokens, server top-k {doc['server_topk']}.", ""]
    out += ["| server | up (s) | group | identical to target-only | mean accept length | differences |",
            "|---|---|---|---|---|---|"]
    for row in s["rows"]:
        if row["error"] or not row["groups"]:
            why = row["error"] or "no results"
            out.append(f"| {row['name']} | {_fmt(row['up_s'])} | — | did not serve: {why} | | |")
            continue
        if all(g["errors"] == g["n"] for g in row["groups"].values()):
            n = sum(g["n"] for g in row["groups"].values())
            out.append(f"| {row['name']} | {_fmt(row['up_s'])} | all | served; all {n} requests failed | | |")
            continue
        for tag, g in row["groups"].items():
            if g["errors"] == g["n"]:
                out.append(f"| {row['name']} | {_fmt(row['up_s'])} | {tag} | all {g['n']} requests failed | | |")
                continue
            same = ("n/a (sampled)" if tag.startswith("t0.8") else "(the baseline)" if tag == "baseline"
                    else f"{g['same']}/{g['n'] - g['errors']}")
            acc = f"{statistics.mean(g['accept']):.2f}" if g["accept"] else "—"
            diffs = "; ".join(f"len {d['prompt_len']} @{d['pos']} gap {_fmt(d['gap'], 3)}"
                              f"{' (near-tie)' if d['near_tie'] else ''}" for d in g["diffs"])
            out.append(f"| {row['name']} | {_fmt(row['up_s'])} | {tag} | {same} | {acc} | {diffs} |")
    return "\n".join(out) + "\n"


def render_verdict(doc: dict, tie_nats: float) -> str:
    """One row per server: per request group the greedy outputs identical to target-only / that
    first differ at a near-tie (baseline top-2 gap <= tie_nats) / that differ structurally, the
    mean accept length, and the server's verdict."""
    s = summarize(doc, tie_nats)
    tags = [f"k{k}-{m}" for m in ("oracle", "drafter") for k in (1, 4, 8)]
    out = [f"Run {doc['date']} on {doc['machine']}; command `{doc['command']}`; model {doc.get('model', 'tiny')}, "
           f"block {doc['block']}, {doc['max_new_tokens']} new tokens, {len(doc.get('prompt_lens') or [])} "
           f"concurrent requests per group; near-tie: first difference where the baseline's top-2 log-prob gap "
           f"is <= {tie_nats} nats. Cells: identical / near-tie / structural (of the group's outputs), then the "
           f"mean accept length.", ""]
    out += ["| server | " + " | ".join(tags) + " | verdict |", "|---|" + "---|" * len(tags) + "---|"]
    for row in s["rows"]:
        if row["name"] == "base-eager":
            continue
        if row["error"] or not row["groups"]:
            out.append(f"| {row['name']} | " + " | ".join("—" for _ in tags)
                       + f" | did not serve: {row['error'] or 'no results'} |")
            continue
        cells, structural = [], 0
        for tag in (tags if any(t in row["groups"] for t in tags) else ["t0"]):
            g = row["groups"].get(tag)
            if g is None:
                cells.append("—")
                continue
            ties = sum(1 for d in g["diffs"] if d["near_tie"])
            struct = len(g["diffs"]) - ties
            structural += struct + g["errors"]
            acc = f" · {statistics.mean(g['accept']):.2f}" if g["accept"] else ""
            err = f" +{g['errors']} err" if g["errors"] else ""
            cells.append(f"{g['same']}/{ties}/{struct}{err}{acc}")
        cells += ["—"] * (len(tags) - len(cells))
        verdict = "identical up to near-ties" if not structural else f"**STRUCTURAL: {structural} outputs**"
        out.append(f"| {row['name']} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(out) + "\n"


def _fmt(v, nd: int = 0) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("result", type=Path)
    ap.add_argument("--tie-nats", type=float, default=0.05)
    ap.add_argument("--verdict", action="store_true", help="one row per server (render_verdict)")
    a = ap.parse_args(argv)
    try:
        doc = json.loads(a.result.read_text())
    except (OSError, ValueError) as e:
        print(f"error: {a.result}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render_verdict(doc, a.tie_nats) if a.verdict else render(doc, a.tie_nats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
