"""Can one text's own likelihood tell a small model's sampled (T>0) loop from a corrupted one?

    python bench/sampled_typicality.py --out docs/results/sampled-typicality-2026-12-02.json

The gate fails the embedded 135M model's own T>0 loops and drifts ("Abe nadai, sea of light," four times,
"| Bird| Birds|" thirteen times): they are real output of a correct build, labeled coherent, and they
are most of the coherent texts the gate fails. This asks whether a per-text statistic of the reference
model *at the sample's temperature* could excuse them without excusing corruptions, on every stored item
of docs/gate-heldout-seed*.json that an excuse could touch:

- coherent: real T>0 answers (embedded llama.cpp target and target-only SGLang) that the gate flagged;
- garbled: corruptions whose only findings are loop checks or the fluency window (any other detector
  fails them whatever an excuse says), each scored at T 0.6, 0.8 and 1.0 and kept at its most lenient.

Two statistics under p_T = softmax(logits / T) of the reference model:
- `tail`: n * min over tokens of the p_T mass of tokens no more likely than the text's token (a
  Bonferroni-corrected tail probability; a true sample of p_T is below alpha with probability <= alpha);
- `typical_z`: the worst 16-token window of sum(surprisal - entropy) / sqrt(sum(varentropy)) (how much
  more surprising than p_T's own samples the text is).
For each, the result gives the limit that would excuse every flagged coherent item and how many garbled
items pass it, and the limit that passes no garbled item and how many coherent items it excuses.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.history import raw_header, read_json, seed_files  # noqa: E402
from sglfleet.textscore.judge import CHAT_PREFIX, LOOP_CHECKS, FluencyJudge  # noqa: E402
from sglfleet.validation.config import GateConfig  # noqa: E402

EXCUSABLE = {*LOOP_CHECKS, "fluency"}
TEMPS = (0.6, 0.8, 1.0)
WINDOW = 16


def candidates() -> list[dict[str, Any]]:
    items, seen = [], set()
    for f in seed_files():  # removed ones from git history
        for x in read_json(f).get("items", []):
            checks = {str(s).split(":")[0] for s in x.get("findings", [])}
            key = (x["text"], x.get("prompt"))
            if not x["text"].strip() or key in seen:
                continue
            sampled_ok = x["label"] == "ok" and (x.get("temperature") or 0) > 0 and x["flagged"]
            excusable_bad = x["label"] == "bad" and checks and checks <= EXCUSABLE
            if sampled_ok or excusable_bad:
                seen.add(key)
                items.append({**x, "checks": sorted(checks), "file": Path(f).name})
    return items


def stats(logits: np.ndarray, ids: list[int], temperature: float) -> dict[str, float]:
    z = logits / temperature
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    rows = np.arange(len(ids))
    px = p[rows, ids]
    tail = (p * (p <= px[:, None])).sum(axis=1)
    lp = np.log(np.maximum(p, 1e-300))
    h = -(p * lp).sum(axis=1)
    v = np.maximum((p * lp * lp).sum(axis=1) - h * h, 1e-9)
    e = -np.log(np.maximum(px, 1e-300)) - h
    if len(e) <= WINDOW:
        wz = float(e.sum() / math.sqrt(v.sum()))
    else:
        ce, cv = np.concatenate([[0], np.cumsum(e)]), np.concatenate([[0], np.cumsum(v)])
        wz = float(((ce[WINDOW:] - ce[:-WINDOW]) / np.sqrt(cv[WINDOW:] - cv[:-WINDOW])).max())
    return {"tail": float(len(ids) * tail.min()), "typical_z": wz}


def separation(ok: list[float], bad: list[float], higher_is_plausible: bool) -> dict[str, Any]:
    """Limits on one statistic: the one excusing every coherent item, and the one excusing no garbled one."""
    sign = 1 if higher_is_plausible else -1
    lo = min(sign * x for x in ok)             # excuse every coherent item: threshold at the least plausible
    top = max(sign * x for x in bad)           # excuse no garbled item: threshold above the most plausible
    return {"limit_excusing_all_coherent": sign * lo,
            "garbled_excused_at_that_limit": sum(1 for x in bad if sign * x >= lo),
            "limit_excusing_no_garbled": sign * top,
            "coherent_excused_at_that_limit": sum(1 for x in ok if sign * x > top),
            "coherent": len(ok), "garbled": len(bad)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = GateConfig().judge
    t0 = time.perf_counter()
    out = []
    with FluencyJudge(cfg) as j:
        for x in candidates():
            prefix = [i for i, _ in j.tokenize(CHAT_PREFIX.format(prompt=(x.get("prompt") or "")[:2000]))][-64:]
            ids = [i for i, _ in j.tokenize(x["text"])][-cfg.max_tokens:]
            h = j._hidden(prefix + ids)
            n = len(prefix)
            logits = np.asarray(h[n - 1:n - 1 + len(ids)] @ j._out_t, dtype=np.float64)
            temps = [float(x["temperature"])] if x["label"] == "ok" else list(TEMPS)
            per_t = {f"{t:g}": stats(logits, ids, t) for t in temps}
            out.append({"label": x["label"], "class": x["class"], "file": x["file"], "checks": x["checks"],
                        "tokens": len(ids), "per_temperature": per_t,
                        "tail": max(s["tail"] for s in per_t.values()),
                        "typical_z": min(s["typical_z"] for s in per_t.values()), "text": x["text"][:160]})
    ok = [o for o in out if o["label"] == "ok"]
    bad = [o for o in out if o["label"] == "bad"]
    summary = {"tail": separation([o["tail"] for o in ok], [o["tail"] for o in bad], True),
               "typical_z": separation([o["typical_z"] for o in ok], [o["typical_z"] for o in bad], False)}
    result = {**raw_header("bench/sampled_typicality.py"), "seconds": round(time.perf_counter() - t0, 1),
              "judge_config": cfg.model_dump(mode="json"), "summary": summary, "items": out}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
