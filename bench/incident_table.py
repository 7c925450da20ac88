"""Render the incident run (tests/ddtree/incident.py on the H200; raw JSON kept in docs/results/) as
Markdown: per server its single-stream speed against target-only (side by side in one run), accept
length per temperature, and the gate's verdict with the checks that failed; then, for the servers
whose gate failed on corruption, what each named check quoted.

    python bench/render_docs.py --show incident docs/results/incident-....json
"""

from __future__ import annotations

import re
import statistics
from typing import Any

CORRUPTION = ("char_run", "ngram_loop", "token_soup", "bad_chars", "script_salad", "collapse", "subword_repeat",
              "mojibake", "word_order", "near_repeat", "empty", "fluency")
REFERENCE_CHECKS = ("lossless_t0", "long_copy", "determinism_sequential", "determinism_concurrent")


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def _f(v: float | None, nd: int = 0) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def _failed(s: dict[str, Any]) -> list[dict[str, Any]]:
    """The gate's failed checks (its summary's failed_checks), with their messages."""
    names = (s.get("gate", {}).get("summary") or {}).get("failed_checks") or []
    by_name = {c["name"]: c for c in s.get("gate", {}).get("cases", [])}
    return [by_name.get(n, {"name": n, "message": ""}) for n in names]


def _lossless(s: dict[str, Any]) -> str:
    """lossless_t0 in a few words: identical / near-tie / re-anchored counts, or FAIL."""
    c = next((c for c in s.get("gate", {}).get("cases", []) if c["name"] == "lossless_t0"), None)
    if c is None:
        return "—"
    if not c.get("ok"):
        return "FAIL"
    n = c.get("counts")
    if n and n.get("identical") is not None:  # raw files from 2026-12-02 on keep the counts
        whole = n.get("reanchored")
        return (f"{n['identical']}/{n['answers']} identical, {n['near_ties']} near-tie"
                + (f" ({whole} re-anchored to the end)" if whole else ""))
    # older raw files kept the message only
    m = re.match(r"(\d+) of (\d+) T=0 answers identical to the baseline, (\d+) differ from a near-tie on"
                 r"(?: \((\d+) of them re-anchored)?", c.get("message") or "")
    if not m:
        return "pass"
    same, n, ties, whole = m.groups()
    return f"{same}/{n} identical, {ties} near-tie" + (f" ({whole} re-anchored to the end)" if whole else "")


def _unreachable(s: dict[str, Any]) -> str | None:
    """The gate's one-line error when it could not judge the server at all (exit 2)."""
    g = s.get("gate") or {}
    if g.get("rc") != 2:
        return None
    line = next((ln for ln in (g.get("tail") or "").splitlines() if ln.startswith("error:")), "error")
    return line[:140]


def render(doc: dict[str, Any], path: str | None = None) -> str:
    servers = doc["servers"]
    base = next(s for s in servers if s["name"] == "base")
    base_tps = base.get("median_tokens_per_s_t0")
    tr = doc.get("drafter_train") or {}
    out = [f"Run {doc['date']} on {doc['machine']}; command `{doc['command']}`; gate profile `{doc['profile']}`; "
           f"{doc['speed_tokens']} new tokens per speed request (`ignore_eos`), each server measured alone.", ""]
    if tr:
        off = tr.get("offline", {})
        out += [f"Drafter: {tr.get('layers')} layers, block {tr.get('block_size')}, target layers "
                f"{tr.get('target_layer_ids')}, {tr.get('steps')} steps on {tr.get('train_tokens')} target-written "
                f"tokens ({tr.get('train_seqs')} sequences) in {_f(tr.get('seconds'))} s, seed {tr.get('seed')}; "
                f"offline accept length {_f(off.get('accept_length'), 2)} on {tr.get('held_out_seqs')} held-out "
                "sequences.", ""]
    if path:
        out += [f"Raw: {path}", ""]
    out += ["| server | budget / top-k | T=0 tok/s (1 stream) | vs target-only | accept length T=0 | T=0.8 | "
            "gate exit | lossless_t0 | checks failed |", "|---|---|---|---|---|---|---|---|---|"]
    for s in servers:
        if not s.get("up_s"):
            out.append(f"| {s['name']} | | did not serve | | | | | | |")
            continue
        tps = s.get("median_tokens_per_s_t0")
        ratio = f"{tps / base_tps:.2f}x" if tps and base_tps else "—"
        acc = {t: _mean([r.get("spec_accept_length") for r in s["speed"] if r.get("temperature") == t])
               for t in (0.0, 0.8)}
        cfg = "target only" if s["budget"] is None and not s.get("chain") else (
            "DFLASH chain" if s["budget"] is None else f"{s['budget']} / {s['topk']}")
        names = ", ".join(c["name"] for c in _failed(s)) or _unreachable(s) or "none"
        if s["name"] == "base":
            names = "— (the baseline: record-baseline judged its answers)"
        out.append(f"| {s['name']} | {cfg} | {_f(tps)} | {ratio} | {_f(acc[0.0], 2)} | {_f(acc[0.8], 2)} | "
                   f"{s.get('gate', {}).get('rc', '—')} | {_lossless(s) if s['name'] != 'base' else '—'} | "
                   f"{names.replace('|', '/')} |")
    rows = []
    for s in servers:
        for c in _failed(s):
            if c["name"].split("@")[0] in CORRUPTION and c["name"].endswith("@T0"):
                msg = (c.get("message") or "").replace("|", "/").replace("\n", " ")[:160]
                rows.append(f"| {s['name']} | {c['name']} | {msg} |")
    if rows:
        out += ["", "What the gate quoted where corruption detectors fired at T=0 (first 160 characters of each "
                "check):", "", "| server | check | message |", "|---|---|---|", *rows]
    else:
        out += ["", "No corruption detector failed at T=0 on any server the gate could reach."]
    # where no corruption detector fires (the unpatched build at budget 7 reads as English), the checks that
    # compare against the target itself are what stops it: quote them for every failing speculative build
    refs = []
    for s in servers:
        for c in _failed(s):
            if c["name"] in REFERENCE_CHECKS and s["name"] != "base":
                msg = (c.get("message") or "").replace("|", "/").replace("\n", " ")[:240]
                refs.append(f"| {s['name']} | {c['name']} | {msg} |")
    if refs:
        out += ["", "What the checks against the target itself said where they failed (first 240 characters):", "",
                "| server | check | message |", "|---|---|---|", *refs]
    died = [s for s in servers if s.get("up_s") and s.get("error")]
    for s in died:
        out += ["", f"{s['name']} stopped serving: {s['error'][:300]}"]
    return "\n".join(out) + "\n"
