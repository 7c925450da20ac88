"""Render bench/ddtree_real.py's raw JSON: the inflation's function check, decode tok/s side by side with the
target alone, accept lengths, greedy identity, and DDTree's per-step breakdown.

    python3 bench/render_ddtree_real.py docs/results/ddtree-real-....json.gz

bench/render_docs.py calls `render` for the `ddtree-real` blocks of docs/ddtree-real.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repo root
from bench.history import render_main
from bench.render_ddtree_step import DRAFT_PARTS, STAGES, breakdown, profile_totals


def _f(v: float | None, d: int = 0) -> str:
    return "—" if v is None else f"{v:.{d}f}"


def _cell(s: dict[str, Any], temp: float, streams: int, topk: int | None, path: str = "device"
          ) -> dict[str, Any] | None:
    for c in s.get("cells", []):
        if c.get("temperature") == temp and c.get("streams") == streams and c.get("topk") == topk \
                and c.get("path", "device") == path and not c.get("skipped"):
            return c
    return None


def _synced(s: dict[str, Any]) -> bool:
    """A server that waits for the host lengths every step (SGLANG_DDTREE_SYNC_LENS=1: the worker before the
    reserved bound, measured beside it)."""
    return (s.get("env") or {}).get("SGLANG_DDTREE_SYNC_LENS") == "1"


def _sched(s: dict[str, Any]) -> str:
    """``overlap scheduler`` (``, lengths synced`` for the twin that waits), or ``""``."""
    return ("overlap scheduler" + (", lengths synced" if _synced(s) else "")) if s.get("overlap") else ""


def _label(s: dict[str, Any], k: int | None = None) -> str:
    sched = _sched(s)
    ov = f", {sched}" if sched else ""
    if s["kind"] == "target":
        return "target alone"
    if s["kind"] == "chain":
        return f"DFLASH chain (block 8{ov})"
    return f"DDTree b{s['budget']}" + (f" / top-k {k}" if k is not None else "") + (f" ({ov[2:]})" if ov else "")


def _gap(row: dict[str, Any] | None, i: int) -> float | None:
    """The top-2 log-prob gap at position i of one server's greedy answer (None: not recorded)."""
    top = (row or {}).get("top2") or []
    return top[i][0][0] - top[i][1][0] if i < len(top) and len(top[i]) == 2 else None


def function_lines(raw: dict[str, Any], tie: float = 0.05) -> list[str]:
    """The inflated target's greedy answers against the 135M target's: identical, or parted where one of the two
    had a tie (its top-2 gap within ``tie`` nats) and the other a gap of a bf16 rounding step."""
    fn = raw.get("function", {})
    rows = fn.get("small_vs_target") or []
    if not rows:
        return ["The 135M target's greedy answers were not compared (its server or the inflated one did not answer)."]
    small = {r["id"]: r for r in fn.get("small", [])}
    big = {r["id"]: r for r in fn.get("target", [])}
    same = sum(1 for r in rows if r.get("identical"))
    parts = []
    for r in rows:
        if r.get("identical") or "diverge_at" not in r:
            continue
        i = r["diverge_at"]
        gs, gb = _gap(small.get(r["id"]), i), _gap(big.get(r["id"]), i)
        at_tie = min(g for g in (gs, gb, 1e9) if g is not None) <= tie
        parts.append((r["id"], i, gs, gb, at_tie))
    text = (f"Function: the inflated target's greedy answers equal the 135M target's in {same} of {len(rows)} suite "
            "prompts")
    ties = [p for p in parts if p[4]]
    if ties:
        text += (f"; the other {len(ties)} part at a tie of one of the two (top-2 log-prob gaps there, 135M / "
                 "inflated: " + ", ".join(f"{pid} token {i}: {_f(gs, 3)} / {_f(gb, 3)}" for pid, i, gs, gb, _ in ties)
                 + "): bf16 rounding, the inflation's rescaled norms and q rows included")
    other = [p for p in parts if not p[4]]
    if other:
        text += ("; " + str(len(other)) + " part where neither had a tie (" + ", ".join(
            f"{pid} token {i}: {_f(gs, 3)} / {_f(gb, 3)}" for pid, i, gs, gb, _ in other) + ")")
    return [text + "."]


def _greedy(c: dict[str, Any] | None, raw: dict[str, Any]) -> str:
    """A T=0 cell's answers against the target alone (recorded 8 at once, before the timed cells): identical, and
    the largest top-2 gap of the target's own log-probs where the others part from it."""
    if not c or not c.get("identical_to_target"):
        return "—"
    ref = {r["id"]: r for r in raw.get("function", {}).get("target", [])}
    gaps = [_gap(ref.get(d["id"]), d["diverge_at"]) for d in c.get("divergences", []) if "diverge_at" in d]
    known = [g for g in gaps if g is not None]
    if not gaps:
        return str(c["identical_to_target"])
    return f"{c['identical_to_target']}; {len(gaps)} part at gap ≤ {max(known):.3f}" if known else \
        f"{c['identical_to_target']}; {len(gaps)} part"


def throughput_lines(raw: dict[str, Any]) -> list[str]:
    lines = ["| server | T=0, 1 stream tok/s | × target | accept | greedy = target alone (top-2 gap where they part) "
             "| T=0, 4 streams tok/s | × target | T=0.8, 1 stream tok/s | × target | accept | T=0.8, 4 streams tok/s "
             "| × target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    servers = [s for s in raw["servers"] if s["name"] != "small"]
    base = next((s for s in servers if s["kind"] == "target"), None)

    def ratio(c: dict[str, Any] | None, temp: float, streams: int) -> str:
        b = _cell(base, temp, streams, None) if base else None
        if not c or not b or not c.get("tok_s") or not b.get("tok_s"):
            return "—"
        return f"{c['tok_s'] / b['tok_s']:.2f}"

    for s in servers:
        for k in ((4, 8) if s["kind"] == "ddtree" else (None,)):
            c = {(t, n): _cell(s, t, n, k) for t in (0.0, 0.8) for n in (1, 4)}
            if not any(c.values()):
                continue
            c01 = c[(0.0, 1)]
            lines.append(
                f"| {_label(s, k)} | {_f(c01 and c01.get('tok_s'))} | {ratio(c01, 0.0, 1)} | "
                f"{_f(c01 and c01.get('accept_length'), 2)} | {_greedy(c01, raw)} | "
                f"{_f(c[(0.0, 4)] and c[(0.0, 4)].get('tok_s'))} | {ratio(c[(0.0, 4)], 0.0, 4)} | "
                f"{_f(c[(0.8, 1)] and c[(0.8, 1)].get('tok_s'))} | {ratio(c[(0.8, 1)], 0.8, 1)} | "
                f"{_f(c[(0.8, 1)] and c[(0.8, 1)].get('accept_length'), 2)} | "
                f"{_f(c[(0.8, 4)] and c[(0.8, 4)].get('tok_s'))} | {ratio(c[(0.8, 4)], 0.8, 4)} |")
    return lines


def unmeasured_lines(raw: dict[str, Any]) -> list[str]:
    """Servers the run started but did not measure (the deadline came first, or the server failed), named so a
    table without their rows is not read as if they were left out by choice."""
    out = []
    for s in raw["servers"]:
        if s["name"] == "small" or s.get("cells"):
            continue
        err = str(s.get("error") or "")
        # a server the GPU had no room for says so somewhere in its log's tail, rarely in its first characters
        oom = "out of memory" in err.lower() or "outofmemory" in err.lower().replace(" ", "")
        why = ("failed: CUDA out of memory (too many servers for the GPU at this --mem)" if oom else
               f"failed: {err[:120]}" if err else
               f"up at {s['up_s']:.0f} s, not measured before the deadline" if s.get("up_s") else "never came up")
        out.append(f"{s['name']} ({why})")
    return ["", "Started but not measured: " + "; ".join(out) + "."] if out else []


def path_lines(raw: dict[str, Any]) -> list[str]:
    """DDTree's tree paths on the same greedy requests (T=0, 1 stream, top-k 4), where a run measured them."""
    rows = []
    for s in raw["servers"]:
        if s["kind"] != "ddtree":
            continue
        cells = {p: _cell(s, 0.0, 1, 4, p) for p in ("device", "graphed", "host")}
        if cells["graphed"] is None and cells["host"] is None:
            continue
        sched = _sched(s)
        ov = f" ({sched})" if sched else ""
        rows.append(f"| b{s['budget']}{ov} | " + " | ".join(
            f"{_f(c and c.get('tok_s'))} / {_f(c and c.get('accept_length'), 2)}" for c in cells.values()) + " |")
    if not rows:
        return []
    return ["", "DDTree's tree paths on the same greedy requests (T=0, 1 stream, top-k 4; tok/s / accept length):", "",
            "| budget | device (default) | graphed | host (numpy reference) |", "|---|---|---|---|", *rows]


def _host(t: dict[str, Any], stages: tuple[str, ...]) -> float:
    """The host's mean ms per step over ``stages``."""
    return sum(t.get("host_ms", {}).get(st, 0.0) for st in stages) / max(1, t["steps"])


def _draft_split(t: dict[str, Any]) -> str:
    if not all(p in t.get("host_ms", {}) for p in DRAFT_PARTS):
        return "—"  # a worker from before the parts were marked
    return " / ".join(f"{_host(t, (st,)):.2f}" for st in (*DRAFT_PARTS, "draft"))


def breakdown_lines(raw: dict[str, Any], temp: float = 0.0, streams: int = 1) -> list[str]:
    # host: draft = the host's time in the draft stage (launching the drafter: its batch, KV plan and attention
    # metadata; under the overlap scheduler also the wait for the step before's lengths)
    # host: draft split = the host's ms in the draft stage's parts (lens / prep / forward), where the worker marks them
    lines = ["| DDTree step | steps | " + " | ".join(STAGES)
             + " | between steps | step | outside verify | host: draft | host: draft split (lens / prep / forward) |",
             "|---|---|" + "---|" * (len(STAGES) + 5)]
    for s in raw["servers"]:
        if s["kind"] != "ddtree":
            continue
        totals = profile_totals(s)
        for k in (4, 8):
            key = next((key for key in totals if key.endswith(f"/t{temp}-k{k}-s{streams}")), None)
            if key is None:
                continue
            r = breakdown(totals[key])
            out = (r["step"] - r["verify"]) / r["step"] if r["step"] else None
            ov = (" overlap, synced" if _synced(s) else " overlap") if s.get("overlap") else ""
            lines.append(f"| b{s['budget']}/k{k}{ov} | {r['steps']} | " + " | ".join(_f(r[st], 2) for st in STAGES)
                         + f" | {_f(r['between'], 2)} | {_f(r['step'], 2)} | {'—' if out is None else f'{out:.0%}'} | "
                         f"{_f(_host(totals[key], ('draft', *DRAFT_PARTS)), 2)} | {_draft_split(totals[key])} |")
    return lines


def churn_lines(raw: dict[str, Any]) -> list[str]:
    """The churn cells (mixed-length greedy requests, several at a time, new ones starting as others end): each
    server's answers against the target alone's, and the largest top-2 gap of the target where one parts."""
    rows = []
    for s in raw["servers"]:
        c = next((c for c in s.get("cells", []) if c.get("churn")), None)
        if c is None:
            continue
        parted = [r for r in c["rows"] if "diverge_at" in r]
        gaps = [r["top2_gap"] for r in parted if r.get("top2_gap") is not None]
        where = "—" if not parted else (f"{len(parted)}, at top-2 gap ≤ {max(gaps):.3f}" if len(gaps) == len(parted)
                                        else f"{len(parted)} ({len(parted) - len(gaps)} where no gap is recorded)")
        rows.append(f"| {_label(s)} | {c['identical']}/{c['requests']} | {where} | {len(c['errors'])} | "
                    f"{_f(c.get('wall_s'), 1)} |")
    if not rows:
        return []
    churn = raw.get("churn", {})
    return ["", f"Churn: {churn.get('requests')} greedy requests of mixed lengths, {churn.get('streams')} at a time "
            "(a new one starts as one ends), each against the target alone's answer up to its length:", "",
            "| server | identical | parted from the target alone | errors | wall s |", "|---|---|---|---|---|", *rows]


def render(raw: dict[str, Any], path: str) -> str:
    inf = raw.get("inflate", {})
    cfg = inf.get("target_config", {})
    lines = [f"Model: {raw.get('model')}. Target shape: hidden {cfg.get('hidden_size')}, "
             f"{cfg.get('num_hidden_layers')} layers, {cfg.get('num_attention_heads')} / "
             f"{cfg.get('num_key_value_heads')} heads, MLP {cfg.get('intermediate_size')}, vocabulary "
             f"{cfg.get('vocab_size')}; {_f(inf.get('target_bytes', 0) / 1e9, 1)} GB of weights. "
             f"{len(raw.get('prompts', []))} suite prompts, up to {raw.get('new_tokens')} new tokens, one server "
             "measured at a time.", ""]
    src = f"(raw: {path})"  # each table names its raw file in the line above it (tests/test_docs_claims.py)
    lines += [*function_lines(raw), ""]
    lines += [f"Decode tok/s per server, side by side with the target alone {src}:", ""]
    lines += throughput_lines(raw)
    lines += unmeasured_lines(raw)
    lines += [x.replace("accept length):", f"accept length) {src}:") for x in path_lines(raw)]
    lines += [x.replace("up to its length:", f"up to its length {src}:") for x in churn_lines(raw)]
    lines += ["", "Per-step breakdown, T=0, 1 stream (ms per step, mean; GPU time between CUDA events on the "
              f"stream) {src}:", ""]
    lines += breakdown_lines(raw)
    lines += ["", f"Raw: {path} ({raw.get('date')}, {raw.get('machine')}; `{raw.get('command')}`)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    return render_main(argv, render, "render_ddtree_real.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
