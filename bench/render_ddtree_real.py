"""Render bench/ddtree_real.py's raw JSON: the inflation's function check, decode tok/s side by side with the
target alone, accept lengths, greedy identity, and DDTree's per-step breakdown.

    python3 bench/render_ddtree_real.py docs/results/ddtree-real-....json.gz

bench/render_docs.py calls `render` for the `ddtree-real` blocks of docs/ddtree-real.md.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

from bench.render_ddtree_step import STAGES, breakdown, profile_totals


def _f(v: float | None, d: int = 0) -> str:
    return "—" if v is None else f"{v:.{d}f}"


def _cell(s: dict[str, Any], temp: float, streams: int, topk: int | None) -> dict[str, Any] | None:
    for c in s.get("cells", []):
        if c.get("temperature") == temp and c.get("streams") == streams and c.get("topk") == topk \
                and not c.get("skipped"):
            return c
    return None


def _label(s: dict[str, Any], k: int | None) -> str:
    if s["kind"] == "target":
        return "target alone"
    if s["kind"] == "chain":
        return "DFLASH chain (block 8)"
    return f"DDTree b{s['budget']} / top-k {k}"


def function_lines(raw: dict[str, Any]) -> list[str]:
    rows = raw.get("function", {}).get("small_vs_target") or []
    if not rows:
        return ["The 135M target's greedy answers were not compared (its server or the inflated one did not answer)."]
    same = sum(1 for r in rows if r.get("identical"))
    ties = [r for r in rows if not r.get("identical") and r.get("near_tie")]
    other = [r for r in rows if not r.get("identical") and not r.get("near_tie")]
    text = (f"Function: the inflated target's greedy answers equal the 135M target's in {same} of {len(rows)} suite "
            f"prompts")
    if ties:
        text += (f"; {len(ties)} part at a near-tie (top-2 log-prob gap "
                 + ", ".join(f"{r['top2_gap']:.3f} at token {r['diverge_at']}" for r in ties) + ")")
    if other:
        text += ("; " + str(len(other)) + " part away from a near-tie ("
                 + ", ".join(f"{r['id']}: token {r.get('diverge_at')}, gap {_f(r.get('top2_gap'), 3)}"
                             for r in other) + ")")
    return [text + "."]


def throughput_lines(raw: dict[str, Any]) -> list[str]:
    lines = ["| server | T=0, 1 stream tok/s | × target | accept | greedy = target | T=0, 4 streams tok/s | × target "
             "| T=0.8, 1 stream tok/s | × target | accept | T=0.8, 4 streams tok/s | × target |",
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
                f"{_f(c01 and c01.get('accept_length'), 2)} | {(c01 or {}).get('identical_to_target', '—')} | "
                f"{_f(c[(0.0, 4)] and c[(0.0, 4)].get('tok_s'))} | {ratio(c[(0.0, 4)], 0.0, 4)} | "
                f"{_f(c[(0.8, 1)] and c[(0.8, 1)].get('tok_s'))} | {ratio(c[(0.8, 1)], 0.8, 1)} | "
                f"{_f(c[(0.8, 1)] and c[(0.8, 1)].get('accept_length'), 2)} | "
                f"{_f(c[(0.8, 4)] and c[(0.8, 4)].get('tok_s'))} | {ratio(c[(0.8, 4)], 0.8, 4)} |")
    return lines


def breakdown_lines(raw: dict[str, Any], temp: float = 0.0, streams: int = 1) -> list[str]:
    lines = ["| DDTree step | steps | " + " | ".join(STAGES) + " | between steps | step | outside verify |",
             "|---|---|" + "---|" * (len(STAGES) + 3)]
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
            lines.append(f"| b{s['budget']}/k{k} | {r['steps']} | " + " | ".join(_f(r[st], 2) for st in STAGES)
                         + f" | {_f(r['between'], 2)} | {_f(r['step'], 2)} | {'—' if out is None else f'{out:.0%}'} |")
    return lines


def render(raw: dict[str, Any], path: str) -> str:
    inf = raw.get("inflate", {})
    cfg = inf.get("target_config", {})
    lines = [f"Model: {raw.get('model')}. Target shape: hidden {cfg.get('hidden_size')}, "
             f"{cfg.get('num_hidden_layers')} layers, {cfg.get('num_attention_heads')} / "
             f"{cfg.get('num_key_value_heads')} heads, MLP {cfg.get('intermediate_size')}, vocabulary "
             f"{cfg.get('vocab_size')}; {_f(inf.get('target_bytes', 0) / 1e9, 1)} GB of weights. "
             f"{len(raw.get('prompts', []))} suite prompts, up to {raw.get('new_tokens')} new tokens, one server "
             "measured at a time.", ""]
    lines += [*function_lines(raw), ""]
    lines += throughput_lines(raw)
    lines += ["", "Per-step breakdown, T=0, 1 stream (ms per step, mean; GPU time between CUDA events on the "
              "stream):", ""]
    lines += breakdown_lines(raw)
    lines += ["", f"Raw: {path} ({raw.get('date')}, {raw.get('machine')}; `{raw.get('command')}`)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: render_ddtree_real.py RAW.json[.gz]", file=sys.stderr)
        return 2
    p = Path(argv[0])
    if not p.is_file():
        print(f"error: no file {p}", file=sys.stderr)
        return 2
    data = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    print(render(json.loads(data), str(p)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
