"""Gate depth: quality smoke, long-context copy, speed against a baseline, lossless against a live baseline.

Each probe returns `Case`s the gate adds to its report. They judge a speculative deployment on what
matters beyond "the text looks like language": the right answers (quality), a long verbatim copy
that catches KV / prefix-cache corruption short prompts miss, and real speed against the same model
served without speculation, measured in the same run with requests alternating between the two.
"""

from __future__ import annotations

import difflib
import json
import random
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sglfleet.pipeline.client import ChatResult, OpenAIClient
from sglfleet.pipeline.errors import TargetError, UsageError
from sglfleet.pipeline.reports import Case
from sglfleet.validation.config import LongCopyConfig, QualityConfig, SpeedConfig

_NUM = re.compile(r"-?\d+(?:\.\d+)?")


# ---------------------------------------------------------------------------- quality smoke


def load_quality_set(path: str) -> list[dict[str, str]]:
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
                rows.append({"id": str(row["id"]), "question": str(row["question"]), "answer": str(row["answer"]),
                             "kind": str(row.get("kind", ""))})
            except (ValueError, KeyError):
                raise UsageError(f"{path}:{n}: expected {{id, question, answer}}") from None
    if not rows:
        raise UsageError(f"{path}: no questions")
    return rows


def is_correct(answer: str, expected: str) -> bool:
    """Numbers: the first number in the answer equals the expected one. Words: the word appears."""
    if _NUM.fullmatch(expected):
        found = _NUM.findall(answer.replace(",", ""))
        return bool(found) and float(found[0]) == float(expected)
    return re.search(rf"\b{re.escape(expected.lower())}\b", answer.lower()) is not None


def quality_case(client: OpenAIClient, cfg: QualityConfig, workers: int) -> Case:
    rows = load_quality_set(cfg.dataset)

    def ask(row: dict[str, str]) -> tuple[dict[str, str], str | None, str | None]:
        try:
            r = client.chat(row["question"], max_tokens=cfg.max_tokens, temperature=0.0, stream=False)
            return row, r.text, None
        except TargetError as exc:
            return row, None, str(exc)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(ask, rows))
    errors = [(r["id"], e) for r, _, e in results if e]
    graded = [(r, a, is_correct(a, r["answer"])) for r, a, e in results if a is not None]
    acc = sum(ok for _, _, ok in graded) / len(rows)
    wrong = [f"{r['id']}: {r['question']!r} -> {a[:60]!r} (want {r['answer']})" for r, a, ok in graded if not ok]
    problems = []
    if errors:
        problems.append(f"{len(errors)} request errors ({errors[0][1]})")
    if acc < cfg.min_accuracy:
        problems.append(f"accuracy {acc:.0%} below floor {cfg.min_accuracy:.0%}")
    if cfg.baseline_accuracy is not None and abs(acc - cfg.baseline_accuracy) > cfg.band:
        problems.append(f"accuracy {acc:.0%} outside {cfg.baseline_accuracy:.0%} ± {cfg.band:.0%} of the baseline")
    msg = "; ".join(problems) or f"accuracy {acc:.0%} ({len(graded) - len(wrong)}/{len(rows)}) at T=0"
    if problems and wrong:
        msg += "; e.g. " + "; ".join(wrong[:3])
    return Case("quality_accuracy", "quality", not problems, msg,
                {"accuracy": acc, "n": len(rows), "wrong": wrong, "errors": errors},
                time_s=time.perf_counter() - t0)


# ---------------------------------------------------------------------------- long-context copy

_NOUNS = ("river", "engine", "garden", "signal", "harbor", "lantern", "market", "valley", "bridge", "archive",
          "meadow", "circuit", "orchard", "compass", "station", "ledger", "canyon", "furnace", "glacier", "tower")
_VERBS = ("carries", "follows", "measures", "guards", "shelters", "records", "crosses", "lights", "feeds", "counts")
_ADJS = ("quiet", "amber", "northern", "hollow", "patient", "crowded", "narrow", "silver", "ancient", "restless")


def copy_passage(words: int, seed: int) -> str:
    """Deterministic, never-seen prose of about `words` words (so the model must copy, not recall)."""
    rng = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < words:
        a, b = rng.choice(_ADJS), rng.choice(_ADJS)
        s = (f"The {a} {rng.choice(_NOUNS)} {rng.choice(_VERBS)} the {b} {rng.choice(_NOUNS)} "
             f"near the {rng.choice(_NOUNS)} number {rng.randint(10, 999)}.")
        out.append(s)
        n += len(s.split())
    paras = [" ".join(out[i:i + 6]) for i in range(0, len(out), 6)]
    return "\n\n".join(paras)


def copy_scores(passage: str, output: str) -> dict[str, float]:
    """Longest exact copied span and word agreement, both as fractions of the passage."""
    a, b = passage.split(), output.split()
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    m = sm.find_longest_match(0, len(a), 0, len(b))
    matched = sum(blk.size for blk in sm.get_matching_blocks())
    return {"longest_span_words": m.size, "longest_span_fraction": m.size / max(1, len(a)),
            "agreement": matched / max(1, len(a)), "passage_words": len(a), "output_words": len(b)}


def long_copy_case(client: OpenAIClient, cfg: LongCopyConfig) -> Case:
    passage = copy_passage(cfg.passage_words, cfg.seed)
    prompt = ("Repeat the following text exactly, word for word, with nothing before or after it.\n\n"
              f"{passage}")
    t0 = time.perf_counter()
    try:
        r = client.chat(prompt, max_tokens=cfg.max_tokens, temperature=0.0, stream=True)
    except TargetError as exc:
        return Case("long_copy", "long_context", False, f"request failed: {exc}", time_s=time.perf_counter() - t0)
    sc = copy_scores(passage, r.text)
    ok = sc["longest_span_fraction"] >= cfg.min_span_fraction and sc["agreement"] >= cfg.min_agreement
    msg = (f"longest exact span {sc['longest_span_words']}/{sc['passage_words']} words "
           f"({sc['longest_span_fraction']:.0%}, floor {cfg.min_span_fraction:.0%}), agreement {sc['agreement']:.0%} "
           f"(floor {cfg.min_agreement:.0%}), prompt {r.prompt_tokens} tokens")
    if not ok:
        sm = difflib.SequenceMatcher(None, passage.split(), r.text.split(), autojunk=False)
        first = next((op for op in sm.get_opcodes() if op[0] != "equal"), None)
        if first:
            _, i1, _, j1, _ = first
            msg += (f"; first divergence at word {i1}: want {' '.join(passage.split()[i1:i1 + 8])!r}, "
                    f"got {' '.join(r.text.split()[j1:j1 + 8])!r}")
    return Case("long_copy", "long_context", ok, msg, {**sc, "output_head": r.text[:500]},
                time_s=time.perf_counter() - t0)


# ---------------------------------------------------------------------------- speed vs baseline


def _batch(client: OpenAIClient, prompt: str, n: int, max_tokens: int) -> tuple[float, list[ChatResult]]:
    """n concurrent identical T=0 requests; returns (aggregate output tok/s, results)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as pool:
        res = list(pool.map(lambda _: client.chat(prompt, max_tokens=max_tokens, temperature=0.0, stream=True),
                            range(n)))
    wall = time.perf_counter() - t0
    return sum(r.completion_tokens or 0 for r in res) / wall, res


def speed_cases(candidate: OpenAIClient, baseline: OpenAIClient, cfg: SpeedConfig) -> list[Case]:
    """Alternate candidate/baseline batches at each concurrency; ratio of tok/s with its spread."""
    if baseline.model != candidate.model:
        raise UsageError(f"baseline serves {baseline.model!r} but the candidate serves {candidate.model!r}: "
                         "speed and lossless comparisons need the same model")
    cases = []
    for c in cfg.concurrency:
        ratios, cand_tps, base_tps, cand_ttft, base_ttft = [], [], [], [], []
        t0 = time.perf_counter()
        try:
            _batch(candidate, cfg.prompt, c, 8)  # warm-up both sides (prefix cache, JIT)
            _batch(baseline, cfg.prompt, c, 8)
            for i in range(cfg.rounds):
                order = (candidate, baseline) if i % 2 == 0 else (baseline, candidate)
                got = {}
                for cl in order:
                    got[id(cl)] = _batch(cl, cfg.prompt, c, cfg.max_tokens)
                ctps, cres = got[id(candidate)]
                btps, bres = got[id(baseline)]
                cand_tps.append(ctps)
                base_tps.append(btps)
                cand_ttft += [r.ttft_s for r in cres if r.ttft_s is not None]
                base_ttft += [r.ttft_s for r in bres if r.ttft_s is not None]
                ratios.append(ctps / btps if btps else 0.0)
        except TargetError as exc:
            cases.append(Case(f"speed_vs_baseline@c{c}", "speed", False, f"request failed: {exc}"))
            continue
        med = statistics.median(ratios)
        floor = cfg.min_ratio if c == 1 else cfg.min_ratio_concurrent
        ok = med >= floor
        data: dict[str, Any] = {
            "concurrency": c, "ratio_median": med, "ratio_min": min(ratios), "ratio_max": max(ratios),
            "candidate_tok_s": statistics.median(cand_tps), "baseline_tok_s": statistics.median(base_tps),
            "candidate_ttft_s": statistics.median(cand_ttft) if cand_ttft else None,
            "baseline_ttft_s": statistics.median(base_ttft) if base_ttft else None, "rounds": cfg.rounds}
        cases.append(Case(
            f"speed_vs_baseline@c{c}", "speed", ok,
            f"{data['candidate_tok_s']:.1f} vs {data['baseline_tok_s']:.1f} tok/s = {med:.2f}x "
            f"(spread {min(ratios):.2f}-{max(ratios):.2f}, floor {floor:.2f}x), TTFT "
            f"{_ms(data['candidate_ttft_s'])} vs {_ms(data['baseline_ttft_s'])}",
            data, time_s=time.perf_counter() - t0))
    return cases


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.0f} ms"
