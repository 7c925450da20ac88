"""Score the whole text gate (detectors + fluency judge) on generated families and real model output.

    python bench/gate_families.py --seed 20261201 --out docs/results/gate-heldout-seed20261201.json [--n 6]

For one seed it builds, then scores with the gate's default config:

- *real coherent*: answers of the embedded target (SmolLM2-135M on llama.cpp, started here) to the suite
  prompts and to varied prompts, at every gate temperature (0, 0.6, 0.8, 1.0), sampling seeds derived
  from --seed; labeled coherent because the model wrote them (the model's own T=0 loops are included);
- *generated coherent*: every coherent-but-tricky family of textscore/synth.py (code, JSON, YAML,
  tables, lists, identifiers, numbers, non-English, emoji, legitimate repetition);
- *corrupted*: every corruption family of textscore/synth.py applied to the real answers and to
  generated prose, each judged as a T=0 answer (the one temperature at which the judge may excuse a loop as
  the reference model's own: the hardest case for the gate);
- the labeled corpus tests/validation/corpus.jsonl (fixed; the same for every seed);
- the real-output set tests/validation/real_outputs.jsonl (fixed): 50 answers of the target-only SGLang
  server of 2026-12-01 (coherent) and the mutant server's output with variations (garbled).

Every item's verdict, findings and judge scores go into the raw JSON (`items`), with rates per class,
the command, the date, the machine load and the judge's time. Seeds used while tuning are listed in
docs/detectors-lab.md; the held-out seed is run once, at the end. bench/gate_heldout_seeds.py digests the
seed files and bench/render_docs.py renders docs/results.md's tables from them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sglfleet.pipeline.client import OpenAIClient  # noqa: E402
from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer  # noqa: E402
from sglfleet.pipeline.errors import TargetError  # noqa: E402
from sglfleet.pipeline.reports import utc_now, write_json  # noqa: E402
from sglfleet.textscore.detectors import score_text  # noqa: E402
from sglfleet.textscore.judge import FluencyJudge, judge_verdict, threshold_for  # noqa: E402
from sglfleet.textscore.synth import COHERENT_FAMILIES, CORRUPTION_FAMILIES, corrupt  # noqa: E402
from sglfleet.validation.config import GateConfig  # noqa: E402
from sglfleet.validation.suite import load_suite  # noqa: E402

EXTRA_PROMPTS = [
    ("prose", "Describe a sunrise over the mountains."), ("prose", "Explain how a bicycle works."),
    ("list", "Give three tips for learning a language."), ("poem", "Write a haiku about rain."),
    ("prose", "What is photosynthesis?"), ("prose", "Write a short story about a lost cat."),
    ("list", "List the planets of the solar system."), ("list", "How do I boil an egg? Give numbered steps."),
    ("code", "Write a Python function that reverses a string."), ("prose", "Summarize the plot of Romeo and Juliet."),
    ("prose", "What are the benefits of exercise?"), ("prose", "Explain what a database index is."),
    ("poem", "Write a limerick about a programmer."), ("table", "Make a table of three countries and capitals."),
    ("prose", "What causes seasons on Earth?"), ("list", "Give a recipe for pancakes."),
    ("code", "Write a JavaScript function that sums an array."), ("prose", "Explain recursion to a child."),
    ("prose", "Write a thank-you note to a teacher."), ("code", "Write a SQL query that counts users per country."),
]
FAMILY_CLASS = {"code_python": "code", "code_js": "code", "json": "json", "yaml": "yaml", "table": "table",
                "list": "list", "steps": "list", "repeated_structure": "list", "test_log": "code"}


def real_answers(url: str, seed: int, temps: list[float], max_tokens: int, extra: int) -> list[dict[str, Any]]:
    suite = load_suite(GateConfig().suite)
    pick = random.Random(seed).sample(EXTRA_PROMPTS, min(extra, len(EXTRA_PROMPTS)))
    prompts = [(p.category, p.prompt) for p in suite.prompts] + pick
    client = OpenAIClient(url, timeout_s=300)
    jobs = [(cat, pr, t) for t in temps for cat, pr in prompts]

    def one(job: tuple[str, str, float]) -> dict[str, Any] | None:
        cat, pr, t = job
        try:
            r = client.chat([{"role": "user", "content": pr}], max_tokens=max_tokens, temperature=t,
                            top_p=0.95 if t > 0 else None, seed=seed, stream=True)
        except TargetError as exc:
            print(f"request failed: {exc}", file=sys.stderr)
            return None
        return {"prompt": pr, "category": cat, "temperature": t, "text": r.text}

    with ThreadPoolExecutor(4) as pool:
        out = [x for x in pool.map(one, jobs) if x and x["text"].strip()]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--n", type=int, default=6, help="items per generated family")
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--extra-prompts", type=int, default=4, help="varied prompts beside the 8 suite prompts")
    ap.add_argument("--target", help="an already running embedded-model URL (default: start one)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = GateConfig()
    rng = random.Random(args.seed)
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    srv = None
    if args.target:
        url = args.target
    else:
        port = 18000 + args.seed % 1000
        srv = EmbeddedServer(EmbeddedConfig(port=port), REPO / "runs" / f"families-{args.seed}").start()
        url = srv.url
    try:
        real = real_answers(url, args.seed, cfg.temperatures, args.max_tokens, args.extra_prompts)
    finally:
        if srv:
            srv.stop()
    t_gen = time.perf_counter() - t_start
    items: list[dict[str, Any]] = []
    for k, r in enumerate(real):
        items.append({"id": f"real-{k}", "label": "ok", "class": f"real_T{r['temperature']:g}", "source": "model",
                      "prompt": r["prompt"], "category": r["category"], "temperature": r["temperature"],
                      "text": r["text"]})
    for fam, fn in COHERENT_FAMILIES.items():
        for i in range(args.n):
            items.append({"id": f"gen-ok-{fam}-{i}", "label": "ok", "class": fam, "source": "synth",
                          "category": FAMILY_CLASS.get(fam, "prose"), "text": fn(rng)})
    for fam in CORRUPTION_FAMILIES:
        for i in range(args.n):
            use_real = real and i % 2 == 0
            base = rng.choice(real) if use_real else None
            try:
                text = corrupt(base["text"] if base else COHERENT_FAMILIES["prose"](rng), fam, rng)
            except ValueError:  # this family cannot corrupt that real answer (no letters, one word): generated prose
                base = None
                text = corrupt(COHERENT_FAMILIES["prose"](rng), fam, rng)
            items.append({"id": f"bad-{fam}-{i}", "label": "bad", "class": fam, "source": "model" if base else "synth",
                          "prompt": base["prompt"] if base else None, "category": base["category"] if base else "prose",
                          "temperature": 0.0, "text": text})
    corpus = REPO / "tests" / "validation" / "corpus.jsonl"
    for line in corpus.read_text().splitlines():
        o = json.loads(line)
        items.append({"id": f"corpus-{o['id']}", "label": o["label"], "class": f"corpus_{o['label']}",
                      "source": "corpus", "category": "prose", "temperature": 0.0 if o["label"] == "bad" else None,
                      "text": o["text"]})
    # real outputs of served models (tests/validation/make_real_outputs.py): the target-only SGLang
    # server's answers (coherent, judged after their suite prompt) and the mutant server's output (garbled)
    prompts = {p.id: p.prompt for p in load_suite(cfg.suite).prompts}
    for line in (REPO / "tests" / "validation" / "real_outputs.jsonl").read_text().splitlines():
        o = json.loads(line)
        items.append({"id": f"realset-{o['id']}", "label": o["label"], "class": f"sglang_{o['class']}",
                      "source": o["source"], "prompt": prompts.get(o.get("prompt_id", "")),
                      "category": o.get("prompt_class", "prose"),
                      "temperature": 0.0 if o["label"] == "bad" else o.get("temperature"), "text": o["text"]})
    t_judge0 = time.perf_counter()
    det_s = 0.0
    with FluencyJudge(cfg.judge) as judge:
        for it in items:
            t0 = time.perf_counter()
            found = score_text(it["text"], cfg.thresholds)
            det_s += time.perf_counter() - t0
            sc = judge.score(it["text"], it.get("prompt")) if it["text"].strip() else None
            limit = threshold_for(cfg.judge, it["category"], prompted=bool(it.get("prompt")))
            it["judge"] = {**sc.as_dict(), "limit": limit} if sc else None
            v = judge_verdict(found, sc, limit, cfg.judge, it.get("temperature"))
            it["findings"] = [f"{f.check}: {f.reason}" for f in v.findings]
            if v.excuse:
                it["excused"] = {"findings": [f"{f.check}: {f.reason}" for f in v.excused], "why": v.excuse}
            it["flagged"] = bool(v.findings)
        judge_busy = judge.busy_s
    t_judge = time.perf_counter() - t_judge0
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for it in items:
        by[(it["label"], it["class"])].append(it)
    ok = [i for i in items if i["label"] == "ok"]
    bad = [i for i in items if i["label"] == "bad"]
    summary = {
        "coherent": len(ok), "garbled": len(bad),
        "false_fail": sum(1 for i in ok if i["flagged"]), "false_pass": sum(1 for i in bad if not i["flagged"]),
        "false_fail_rate": sum(1 for i in ok if i["flagged"]) / max(1, len(ok)),
        "false_pass_rate": sum(1 for i in bad if not i["flagged"]) / max(1, len(bad)),
        "per_class": {f"{lab}/{cls}": {"n": len(v), "flagged": sum(1 for i in v if i["flagged"])}
                      for (lab, cls), v in sorted(by.items())},
        "caught_by": dict(Counter(f.split(":")[0] for i in bad for f in i["findings"])),
        "fluency_only_catches": sum(1 for i in bad if i["findings"] and
                                    all(f.startswith("fluency") for f in i["findings"])),
    }
    result = {
        "command": "python bench/gate_families.py " + " ".join(sys.argv[1:]),
        "date": utc_now(), "seed": args.seed, "loadavg_start_end": [load0, os.getloadavg()[0]],
        "timing_s": {"generate_real": round(t_gen, 1), "score_all": round(t_judge, 1),
                     "judge_busy": round(judge_busy, 1), "detectors": round(det_s, 2)},
        "judge_config": cfg.judge.model_dump(mode="json"), "summary": summary, "items": items,
    }
    write_json(args.out, result)
    print(json.dumps({k: summary[k] for k in ("coherent", "garbled", "false_fail", "false_pass")}))
    for (lab, cls), v in sorted(by.items()):
        wrong = [i for i in v if i["flagged"] != (lab == "bad")]
        if wrong:
            w = wrong[0]
            print(f"{lab}/{cls}: {len(wrong)}/{len(v)} wrong, e.g. {w['text'][:100]!r} {w['findings'][:2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
