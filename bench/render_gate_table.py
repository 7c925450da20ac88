"""The held-out rates tables of one bench/gate_families.py result (`split`, `render`).

docs/results.md renders them through bench/render_docs.py (renderers `gate-heldout`, `gate-heldout-seeds`);
this module has no command of its own (its old block-writing command wrote into a block no page has any more).
Each seed's rates are split into its fresh items (generated at that seed: text no one had seen) and the
fixed sets (the corpus and the stored SGLang answers, scored at every seed and seen while tuning).
"""

from __future__ import annotations

FIXED = ("corpus_", "sglang_")  # classes of the fixed sets: the same items at every seed, seen in development


def split(res: dict) -> dict[str, dict[str, int]]:
    """Per part (fresh: generated at this seed, never seen before it ran; fixed: the labeled corpus and the
    stored SGLang answers, the same at every seed and seen while tuning) and label: items and wrong verdicts."""
    out = {part: {"ok": 0, "ok_wrong": 0, "bad": 0, "bad_wrong": 0} for part in ("fresh", "fixed")}
    for it in res["items"]:
        part = out["fixed" if it["class"].startswith(FIXED) else "fresh"]
        part[it["label"]] += 1
        part[it["label"] + "_wrong"] += int(it["flagged"] != (it["label"] == "bad"))
    return out


def _rate(k: int, n: int) -> str:
    return f"{k / n:.1%}" if n else "–"


def render(res: dict, src: str) -> str:
    s = res["summary"]
    t = res["timing_s"]
    sp = split(res)
    fr, fx = sp["fresh"], sp["fixed"]
    lines = [
        f"Raw result: `{src}` — command `{res['command']}`, {res['date']}, seed {res['seed']}, "
        f"load average {res['loadavg_start_end'][0]:.1f} → {res['loadavg_start_end'][-1]:.1f}.",
        "",
        "| set | items | flagged | false-fail rate | false-pass rate |",
        "|---|---:|---:|---:|---:|",
        f"| coherent (real model output, generated tricky families, corpus) | {s['coherent']} | {s['false_fail']} | "
        f"{s['false_fail_rate']:.1%} | |",
        f"| garbled (14 corruption families, corpus) | {s['garbled']} | {s['garbled'] - s['false_pass']} | | "
        f"{s['false_pass_rate']:.1%} |",
        f"| of them fresh at this seed, coherent (real answers, generated families) | {fr['ok']} | {fr['ok_wrong']} | "
        f"{_rate(fr['ok_wrong'], fr['ok'])} | |",
        f"| of them fresh at this seed, garbled (corruptions) | {fr['bad']} | {fr['bad'] - fr['bad_wrong']} | | "
        f"{_rate(fr['bad_wrong'], fr['bad'])} |",
        f"| of them fixed, coherent (corpus, stored SGLang answers) | {fx['ok']} | {fx['ok_wrong']} | "
        f"{_rate(fx['ok_wrong'], fx['ok'])} | |",
        f"| of them fixed, garbled (corpus, mutant SGLang output) | {fx['bad']} | {fx['bad'] - fx['bad_wrong']} | | "
        f"{_rate(fx['bad_wrong'], fx['bad'])} |",
        "",
        "| label / class | items | flagged | wrong |",
        "|---|---:|---:|---:|",
    ]
    for key, v in s["per_class"].items():
        label = key.split("/", 1)[0]
        wrong = v["flagged"] if label == "ok" else v["n"] - v["flagged"]
        lines.append(f"| {key} | {v['n']} | {v['flagged']} | {wrong} |")
    caught = ", ".join(f"{k} {v}" for k, v in sorted(s["caught_by"].items(), key=lambda kv: -kv[1]))
    lines += ["", f"Per class and by check from the same raw result, `{src}`. Findings on garbled items by check: "
              f"{caught}. Garbled items caught by the fluency judge alone: {s['fluency_only_catches']}.",
              f"Time: generating the real answers {t['generate_real']} s; scoring all {s['coherent'] + s['garbled']} "
              f"items {t['score_all']} s, of which the judge {t['judge_busy']} s and the text detectors "
              f"{t['detectors']} s."]
    return "\n".join(lines)
