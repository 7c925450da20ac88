"""Render the production-sequence gate runs (tests/ddtree/prodseq.py's prodseq.json, kept gzipped in docs/results/)
as the tables of docs/production-gate.md, between its markers:

    <!-- prodseq: docs/results/prodseq-h200-2026-12-04.json.gz -->
    ... generated ...
    <!-- /prodseq -->

    python tests/ddtree/render_prodseq.py            # rewrite every block of docs/production-gate.md
    python tests/ddtree/render_prodseq.py --check    # exit 1 when a block is out of date
    python tests/ddtree/render_prodseq.py --show RAW # print the tables of one raw file

(Its own markers, not bench/render_docs.py's `render:` blocks: the renderer lives with the driver.)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "production-gate.md"
BLOCK = re.compile(r"(<!-- prodseq: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /prodseq -->)", re.S)
# bench/prodseq_outside.py's raw file: the tokens outside their request's law per sampling-mix entry
OUTSIDE = re.compile(r"(<!-- prodseq-outside: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /prodseq-outside -->)", re.S)
ROLE_ORDER = {"correct": 0, "fault": 1, "unpatched": 2}
if str(REPO) not in sys.path:  # run as a script from tests/ddtree: bench/ is the lab, importable from the root
    sys.path.insert(0, str(REPO))
from bench.history import raw_text  # noqa: E402


def load(path: Path) -> dict[str, Any]:
    """A prodseq raw file, plain, .gz or .xz (bench/history.raw_text, the one reader of committed raws)."""
    return json.loads(raw_text(path))


def _f(x: Any, fmt: str = ".3f") -> str:
    return "—" if x is None else format(x, fmt)


def _p(x: Any) -> str:
    if x is None:
        return "—"
    return f"{x:.2g}" if x < 0.01 else f"{x:.2f}"


def _temps(gates: list[dict[str, Any]]) -> list[str]:
    return sorted({t for g in gates for t in (g.get("likelihood") or {})}, key=lambda t: float(t.lstrip("T")))


def _verdicts(gates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [g for g in gates if g.get("rc") is not None]


def _by_server(raw: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for g in raw.get("gates", []):
        out.setdefault(g["server"], []).append(g)
    roles = {s["name"]: s.get("role") for s in raw.get("servers", [])}
    return dict(sorted(out.items(), key=lambda kv: (ROLE_ORDER.get(roles.get(kv[0]) or "", 3), kv[0])))


def _failed_counts(gates: list[dict[str, Any]]) -> str:
    c: Counter[str] = Counter(f["name"] for g in gates for f in g.get("failed") or [])
    return ", ".join(f"{n} ({k})" for n, k in c.most_common(6)) + (f", {len(c) - 6} more" if len(c) > 6 else "") \
        if c else "none"


def verdict_table(raw: dict[str, Any]) -> list[str]:
    roles = {s["name"]: s for s in raw.get("servers", [])}
    lines = ["| build | must | gate runs with a verdict | passed | refused | no verdict | exit codes | failing checks "
             "(runs) | median wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for server, gates in _by_server(raw).items():
        v = _verdicts(gates)
        role = (roles.get(server) or {}).get("role") or gates[0].get("role")
        must = "pass" if role == "correct" else "be refused"
        passed = sum(1 for g in v if g.get("passed"))
        walls = [g["wall_s"] for g in v if g.get("wall_s") is not None]
        rcs = Counter(str(g.get("rc")) for g in v)
        lines.append(f"| {server} | {must} | {len(v)} | {passed} | {len(v) - passed} | {len(gates) - len(v)} | "
                     + ", ".join(f"{rc}: {n}" for rc, n in sorted(rcs.items())) + " | "
                     f"{_failed_counts(v)} | {_f(statistics.median(walls) if walls else None, '.0f')} |")
    return lines


def token_table(raw: dict[str, Any]) -> list[str]:
    """Per build and temperature, over the runs: the per-token KS test (its p after the scorer's allowance, the
    smallest and the median), the tokens outside the request's law, and the per-token power statement."""
    by = _by_server(raw)
    temps = _temps([g for gs in by.values() for g in gs])
    # the answers' dispersion (a test of the per-token test since 2026-12-05): a column only where a run has it
    disp = any((((g.get("likelihood") or {}).get(t) or {}).get("per_token") or {}).get("dispersion") is not None
               for gs in by.values() for g in _verdicts(gs) for t in temps)
    # the draws at the law's cut (the edge test, since 2026-12-05): a column only where a run has it
    edge = any((((g.get("likelihood") or {}).get(t) or {}).get("per_token") or {}).get("edge_p") is not None
               for gs in by.values() for g in _verdicts(gs) for t in temps)
    lines = ["| build | T | runs | per-token refused | KS D (median) | KS p min / median | mean u (median) "
             "| mean p min / median | noise allowance (max) | outside the law, candidate / baseline (sum) "
             + ("| answers' dispersion (median), p min " if disp else "")
             + ("| cut token drawn / expected, baseline (sum), p min " if edge else "")
             + "| power: smallest wrong share refused (median) |",
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if disp else "") + ("---|" if edge else "")]
    for server, gates in by.items():
        for t in temps:
            toks = [((g.get("likelihood") or {}).get(t) or {}).get("per_token") for g in _verdicts(gates)]
            toks = [x for x in toks if x]
            if not toks:
                cases = [((g.get("likelihood") or {}).get(t) or {}) for g in _verdicts(gates)]
                why = next((c.get("message") for c in cases if c.get("message")), "no likelihood case")
                lines.append(f"| {server} | {t} | {len(cases)} | no per-token numbers: {str(why)[:160]} "
                             "| — | — | — | — | — | — | — |" + (" — |" if disp else "") + (" — |" if edge else ""))
                continue
            ps = [x.get("ks_p") for x in toks if x.get("ks_p") is not None]
            ds = [x.get("ks_d") for x in toks if x.get("ks_d") is not None]
            allow = [x.get("noise_allowance") for x in toks if x.get("noise_allowance") is not None]
            mus = [x.get("mean_u") for x in toks if x.get("mean_u") is not None]
            mps = [x.get("mean_p") for x in toks if x.get("mean_p") is not None]
            dv = [x["dispersion"] for x in toks if x.get("dispersion") is not None]
            dp = [x["dispersion_p"] for x in toks if x.get("dispersion_p") is not None]
            dcell = (f"{_f(statistics.median(dv)) if dv else '—'}, {_p(min(dp)) if dp else '—'} | " if disp else "")
            ex = [x for x in toks if x.get("edge_p") is not None]
            if edge:
                dcell += (f"{sum(int(x['edge_candidate']) for x in ex)} / "
                          f"{sum(float(x['edge_expected_candidate']) for x in ex):.1f}, "
                          f"{sum(int(x['edge_baseline']) for x in ex)} / "
                          f"{sum(float(x['edge_expected_baseline']) for x in ex):.1f}, "
                          f"{_p(min(float(x['edge_p']) for x in ex))} | " if ex else "— | ")
            rates = [(x.get("power") or {}).get("min_rate_all_families") for x in toks]
            rates_ok = [r for r in rates if r is not None]
            lines.append(
                f"| {server} | {t} | {len(toks)} | {sum(1 for x in toks if x.get('ok') is False)} | "
                f"{_f(statistics.median(ds) if ds else None)} | "
                f"{_p(min(ps) if ps else None)} / {_p(statistics.median(ps) if ps else None)} | "
                f"{_f(statistics.median(mus) if mus else None)} | "
                f"{_p(min(mps) if mps else None)} / {_p(statistics.median(mps) if mps else None)} | "
                f"{_f(max(allow) if allow else None)} | "
                f"{sum(int(x.get('outside_candidate') or 0) for x in toks)} / "
                f"{sum(int(x.get('outside_baseline') or 0) for x in toks)} | " + dcell
                + (f"{statistics.median(rates_ok):.1%}" if rates_ok else "none reached") + " |")
    return lines


def _pooled(g: dict[str, Any]) -> dict[str, Any] | None:
    """A gate's per-token statistics pooled over its T>0 temperatures (tokenlaw.pooled_test; the same dict in each
    temperature's per-token test), None where the run has none."""
    for c in (g.get("likelihood") or {}).values():
        pooled = (c.get("per_token") or {}).get("pooled")
        if pooled:
            return dict(pooled)
    return None


def _by_cut(pools: list[dict[str, Any]]) -> str:
    """The outside counts by truncation over a build's runs: each cut's candidate tokens (sum) and its least p;
    "not run" where the gate had no counts by cut (before 2026-12-05's twenty-eighth session)."""
    cells = []
    for name in ("top_k", "top_p", "min_p"):
        got = [pl["cuts"][name] for pl in pools if isinstance(pl.get("cuts"), dict) and name in pl["cuts"]]
        cells.append(f"{sum(int(c['candidate']) for c in got)} ({_p(min(float(c['p']) for c in got))})" if got else "—")
    return "not run" if all(c == "—" for c in cells) else " / ".join(cells)


def pooled_table(raw: dict[str, Any]) -> list[str]:
    """Per build: the pooled per-token statistics over the runs, and the verdict with them (a run is refused when
    its gate refused it or the pooled test does)."""
    lines = ["| build | must | runs | gate refused | pooled refused | refused with both | outside the law, candidate "
             "/ baseline (sum), p min | by cut: outside top-k / top-p / min-p, candidate (sum), p min | cut token "
             "drawn / expected (sum), p min | consecutive tokens: Stouffer z (min / max) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    roles = {s["name"]: s for s in raw.get("servers", [])}
    for server, gates in _by_server(raw).items():
        rows = [(g, _pooled(g)) for g in _verdicts(gates)]
        rows = [(g, pl) for g, pl in rows if pl is not None]
        if not rows:
            continue
        role = (roles.get(server) or {}).get("role") or gates[0].get("role")
        pools = [pl for _, pl in rows]
        zs = [float(pl["serial_z"]) for pl in pools]
        lines.append(
            f"| {server} | {'pass' if role == 'correct' else 'be refused'} | {len(rows)} | "
            f"{sum(1 for g, _ in rows if not g.get('passed'))} | {sum(1 for pl in pools if not pl['ok'])} | "
            f"{sum(1 for g, pl in rows if not g.get('passed') or not pl['ok'])} | "
            f"{sum(int(pl['outside_candidate']) for pl in pools)} / {sum(int(pl['outside_baseline']) for pl in pools)}"
            f", {_p(min(float(pl['outside_p']) for pl in pools))} | {_by_cut(pools)} | "
            f"{sum(int(pl['edge_candidate']) for pl in pools)} / {sum(float(pl['edge_expected']) for pl in pools):.1f}"
            f", {_p(min(float(pl['edge_p']) for pl in pools))} | {min(zs):+.1f} / {max(zs):+.1f} |")
    return lines


STAT_KEYS = ("ks", "mean", "outside", "dispersion", "edge", "serial")


@functools.lru_cache(maxsize=8)
def _likelihood_config(profile_text: str) -> Any:
    """The raw file's profile's likelihood settings (parsed once per profile, not once per gate), or None."""
    import yaml

    from sglfleet.validation.config import LikelihoodConfig

    try:
        gate = (yaml.safe_load(profile_text) or {}).get("gate") or {}
        return LikelihoodConfig(**(gate.get("likelihood") or {}))
    except (yaml.YAMLError, ValueError, TypeError):
        return None


def _answer_alpha(raw: dict[str, Any], n_temperatures: int, per_token: bool) -> float | None:
    """Each answer-level statistic's alpha under the raw file's profile (likelihood._alphas): the raw keeps the
    temperature's alpha only."""
    from sglfleet.validation.likelihood import _alphas

    lc = _likelihood_config(raw.get("profile_text") or "")
    return None if lc is None else _alphas(lc, n_temperatures, per_token)[2]


def margins(raw: dict[str, Any], g: dict[str, Any]) -> list[tuple[float, str]]:
    """A gate run's T>0 statistics as p / alpha, each against the alpha the gate gave it (below 1: refused): the
    answer-level test, the per-token statistics per temperature and the pooled ones. The support check (a count of
    impossible tokens, no p-value) is not among them."""
    lk = {t: c for t, c in (g.get("likelihood") or {}).items() if isinstance(c, dict) and not c.get("skipped")}
    out: list[tuple[float, str]] = []
    for t, c in lk.items():
        pt = c.get("per_token") or {}
        a_stat = _answer_alpha(raw, len(lk), bool(pt))
        if c.get("p_value") is not None and a_stat:
            out.append((float(c["p_value"]) / a_stat, f"{t} answers"))
        for k in STAT_KEYS:
            if pt.get(f"{k}_p") is not None and pt.get(f"alpha_{k}"):
                out.append((float(pt[f"{k}_p"]) / float(pt[f"alpha_{k}"]), f"{t} {k}"))
    pooled = _pooled(g) or {}
    al = pooled.get("alphas") or {}
    for k in ("outside", "edge", "serial"):
        if pooled.get(f"{k}_p") is not None and al.get(k):
            out.append((float(pooled[f"{k}_p"]) / float(al[k]), f"pooled {k}"))
    for name, c in (pooled.get("cuts") or {}).items():
        if c.get("p") is not None and al.get("cut"):
            out.append((float(c["p"]) / float(al["cut"]), f"pooled {name.replace('_', '-')}"))
    return out


def _ratio(x: float) -> str:
    return f"{x:.2g}" if x < 10 else f"{x:.0f}"


def margin_table(raw: dict[str, Any]) -> list[str]:
    """Per build: each run's smallest p / alpha over its T>0 statistics, and how many runs would be refused were
    the gate's alpha 10 or 100 times smaller (p-values do not depend on alpha: the same runs judged again)."""
    lines = ["| build | must | runs | smallest p / alpha of a run: least (its statistic) | median | largest | runs "
             "below 1 (refused) | below 0.1 (alpha / 10) | below 0.01 (alpha / 100) |",
             "|---|---|---|---|---|---|---|---|---|"]
    roles = {s["name"]: s for s in raw.get("servers", [])}
    for server, gates in _by_server(raw).items():
        mins = [min(m) for m in (margins(raw, g) for g in _verdicts(gates)) if m]
        if not mins:
            continue
        role = (roles.get(server) or {}).get("role") or gates[0].get("role")
        least = min(mins)
        vals = [r for r, _ in mins]
        lines.append(f"| {server} | {'pass' if role == 'correct' else 'be refused'} | {len(mins)} | "
                     f"{_ratio(least[0])} ({least[1]}) | {_ratio(statistics.median(vals))} | {_ratio(max(vals))} | "
                     f"{sum(v < 1 for v in vals)} | {sum(v < 0.1 for v in vals)} | {sum(v < 0.01 for v in vals)} |")
    return lines


def _reach_cases(g: dict[str, Any]) -> list[dict[str, Any]]:
    """A gate run's per-token tests that ran the threshold-reach rule (a finite margin; since 2026-12-06)."""
    out = []
    for c in (g.get("likelihood") or {}).values():
        pt = (c.get("per_token") or {}) if isinstance(c, dict) else {}
        m = pt.get("reach_margin")
        if isinstance(m, (int, float)) and math.isfinite(m):
            out.append(pt)
    return out


def reach_table(raw: dict[str, Any]) -> list[str]:
    """Per build: how far past a threshold cut (top-k, min-p) its tokens lay, in logits, against the margin the
    baseline set (tokenlaw.threshold_reach; a token past the margin refuses)."""
    lines = ["| build | must | runs | runs with a token past the margin | tokens past it (sum) | farthest reach, "
             "least / median / largest run | the baseline's farthest | margin |", "|---|---|---|---|---|---|---|---|"]
    roles = {s["name"]: s for s in raw.get("servers", [])}
    for server, gates in _by_server(raw).items():
        runs = [cs for cs in (_reach_cases(g) for g in _verdicts(gates)) if cs]
        if not runs:
            continue
        far = [max(float(x.get("farthest_reach") or 0.0) for x in cs) for cs in runs]
        role = (roles.get(server) or {}).get("role") or gates[0].get("role")
        lines.append(
            f"| {server} | {'pass' if role == 'correct' else 'be refused'} | {len(runs)} | "
            f"{sum(1 for cs in runs if any(int(x.get('past_reach') or 0) for x in cs))} | "
            f"{sum(int(x.get('past_reach') or 0) for cs in runs for x in cs)} | "
            f"{min(far):.3f} / {statistics.median(far):.3f} / {max(far):.3f} | "
            f"{max(float(x.get('baseline_farthest_reach') or 0.0) for cs in runs for x in cs):.3f} | "
            f"{max(float(x['reach_margin']) for cs in runs for x in cs):.3f} |")
    return lines


def trust_table(raw: dict[str, Any]) -> list[str]:
    """The candidate as the target's scorer: its log p_1 of the baseline's answers against the target-only server's
    recorded ones (largest over the runs and temperatures)."""
    lines = ["| build | runs | trusted in | median abs d log p (max) | p99 abs (max) | max abs (max) | tokens compared "
             "(median) |", "|---|---|---|---|---|---|---|"]
    for server, gates in _by_server(raw).items():
        rows = []
        for g in _verdicts(gates):
            trusts = [c.get("scorer_trust") for c in (g.get("likelihood") or {}).values() if c.get("scorer_trust")]
            if trusts:
                rows.append(trusts[0])  # one trust check per gate, repeated in each temperature's case
        if not rows:
            lines.append(f"| {server} | {len(_verdicts(gates))} | no trust numbers | — | — | — | — |")
            continue

        def mx(key: str, rows: list[dict[str, Any]] = rows) -> float | None:
            v = [r.get(key) for r in rows if r.get(key) is not None]
            return max(v) if v else None
        toks = [r.get("tokens") for r in rows if r.get("tokens") is not None]
        lines.append(f"| {server} | {len(rows)} | {sum(1 for r in rows if r.get('ok'))} of {len(rows)} | "
                     f"{_f(mx('median_abs'), '.4f')} | {_f(mx('p99_abs'), '.3f')} | {_f(mx('max_abs'), '.3f')} | "
                     f"{_f(statistics.median(toks) if toks else None, '.0f')} |")
    return lines


def _untrusted(g: dict[str, Any]) -> bool:
    """The gate's scorer-trust check refused (the verdict's recorded ``scorer_trust``)."""
    return any((c.get("scorer_trust") or {}).get("ok") is False for c in (g.get("likelihood") or {}).values())


def own_failures(g: dict[str, Any]) -> list[str]:
    """A gate's failing checks apart from the scorer-trust refusal: every other failed check, and each temperature's
    likelihood verdict on its own statistics (the answer-level permutation p against its alpha, the per-token
    test, the support check). The trust check compares the candidate's scores of the baseline's answers with the
    recorded ones; when it refused, the statistics were still computed and kept."""
    out = [n for n in (g.get("summary") or {}).get("failed_checks", []) if not n.startswith("likelihood@")]
    for t, c in (g.get("likelihood") or {}).items():
        if c.get("skipped") or c.get("not_run"):
            continue
        stat_ok = c.get("p_value") is not None and c.get("alpha") is not None and c["p_value"] >= c["alpha"]
        tok_ok = (c.get("per_token") or {}).get("ok", True)
        support_ok = not (c.get("support") or {}).get("impossible")  # any token below the support bound fails
        if not (stat_ok and tok_ok and support_ok):
            out.append(f"likelihood@{t}")
    return out


def untrusted_table(raw: dict[str, Any]) -> list[str]:
    """Per build, when the scorer-trust check refused: the verdicts the rest of each gate gave."""
    lines = ["| build | must | runs refused on scorer trust | apart from it: passed | refused "
             "| failing checks (runs) |", "|---|---|---|---|---|---|"]
    roles = {s["name"]: s for s in raw.get("servers", [])}
    for server, gates in _by_server(raw).items():
        v = [g for g in _verdicts(gates) if _untrusted(g)]
        if not v:
            continue
        role = (roles.get(server) or {}).get("role") or gates[0].get("role")
        fails = [own_failures(g) for g in v]
        c: Counter[str] = Counter(n for f in fails for n in f)
        lines.append(f"| {server} | {'pass' if role == 'correct' else 'be refused'} | {len(v)} | "
                     f"{sum(1 for f in fails if not f)} | {sum(1 for f in fails if f)} | "
                     + (", ".join(f"{n} ({k})" for n, k in c.most_common(6)) or "none") + " |")
    return lines


def lossless_table(raw: dict[str, Any]) -> list[str]:
    lines = ["| build | runs | lossless_t0 passed | answers identical / compared | near-ties | re-anchored to the end "
             "| not re-anchored (why, first) |", "|---|---|---|---|---|---|---|"]
    for server, gates in _by_server(raw).items():
        ls = [g.get("lossless") for g in _verdicts(gates) if g.get("lossless")]
        if not ls:
            lines.append(f"| {server} | {len(_verdicts(gates))} | — | — | — | — | — |")
            continue
        off = next(((x.get("reanchor") or {}).get("off") for x in ls if (x.get("reanchor") or {}).get("off")), None)
        def tot(key: str, ls: list[dict[str, Any]] = ls) -> int:
            return sum(int(x.get(key) or 0) for x in ls)
        lines.append(f"| {server} | {len(ls)} | {sum(1 for x in ls if x.get('ok'))} | {tot('identical')} / "
                     f"{tot('answers')} | {tot('near_ties')} | {tot('reanchored')} | "
                     f"{str(off)[:120] if off else '—'} |")
    return lines


def notes(raw: dict[str, Any], path: str) -> list[str]:
    base = raw.get("baseline") or {}
    f = base.get("file") or {}
    train = raw.get("drafter_train") or {}
    offline = (train.get("offline") or {}).get("accept_length")
    gates = raw.get("gates", [])
    v = _verdicts(gates)
    calls = raw.get("calls", [])
    rc = "timed out" if base.get("timed_out") else base.get("rc", "—")
    out = [f"Baseline (the last recording): `record-baseline` {rc} after {_f(base.get('wall_s'), '.0f')} s on the "
           f"target-only server ({f.get('answers_t0', '—')} T=0 answers, "
           f"{sum((f.get('samples_by_temperature') or {}).values()) or '—'} T>0 samples, target-only scores of "
           f"{f.get('scores_answers', '—')}); the server stopped at {_f(base.get('stopped_at_s'), '.0f')} s, its port "
           f"refusing before the first gate: {base.get('port_refuses_after_stop', '—')}."]
    if offline is not None:
        out.append(f"Drafter: trained on the device, offline accept length {offline:.2f}.")
    out.append(f"Gate runs: {len(v)} with a verdict of {len(gates)} started, over {len(calls)} gate call(s) of the "
               "last machine.")
    out.append(f"Raw: {path} ({raw.get('date')}, {raw.get('machine')}, commit {raw.get('commit')})")
    return out


def _why(tail: str) -> str:
    """The last line of a command's output that says why it stopped."""
    lines = [ln.strip() for ln in (tail or "").splitlines() if ln.strip()]
    err = [ln for ln in lines if ln.startswith("error:")]
    return (err[-1] if err else lines[-1] if lines else "")[:200].replace("|", "/")


def attempts_table(raw: dict[str, Any]) -> list[str]:
    """Each call's baseline recording on the target-only server (the step every gate waits for)."""
    lines = ["| call (UTC) | machine | target-only up s | candidates up s (from their start) | record-baseline | exit "
             "| wall s | last line |", "|---|---|---|---|---|---|---|---|"]
    for a in raw.get("attempts", []):
        b = a.get("baseline") or {}
        ups = [s.get("up_s") for s in a.get("servers", []) if s.get("role") != "target-only" and s.get("up_s")]
        base = next((s.get("up_s") for s in a.get("servers", []) if s.get("role") == "target-only"), None)
        judge = "judge off (--no-judge)" if "--no-judge" in str(b.get("cmd")) else "judge on"
        rc = "timed out" if b.get("timed_out") else b.get("rc")
        lines.append(f"| {a.get('call')} | {a.get('machine')} | {_f(b.get('server_up_s') or base, '.0f')} | "
                     f"{_f(min(ups), '.0f') if ups else '—'}-{_f(max(ups), '.0f') if ups else '—'} | {judge} | {rc} | "
                     f"{_f(b.get('wall_s'), '.0f')} | {_why(b.get('tail', ''))} |")
    return lines


def render(raw: dict[str, Any], path: str) -> str:
    parts: list[str] = []
    src = f"(raw: {path})"  # each table names its raw file in the line above it (tests/test_docs_claims.py)
    if raw.get("attempts"):
        parts += [f"Baseline recordings, the target-only server stopped after each {src}:", "", *attempts_table(raw),
                  ""]
    if not _verdicts(raw.get("gates", [])):
        parts += [f"No gate verdict: {raw.get('not_run') or 'no gate ran'}.", "", *notes(raw, path), ""]
        return "\n".join(parts)
    parts += [f"Verdicts per build {src}:", "", *verdict_table(raw), "",
              f"The per-token test per build and temperature, its numbers over the runs {src}:", "",
              *token_table(raw), "",
              f"The candidate as the target's scorer, trusted on the baseline's recorded target-only scores {src}:",
              "", *trust_table(raw), "",
              f"lossless_t0 and its re-anchoring, the candidate forced onto the baseline's path {src}:", "",
              *lossless_table(raw), ""]
    if any(_pooled(g) for g in _verdicts(raw.get("gates", []))):
        how = (raw.get("pooled") or {}).get("what") or "computed by the gate"
        parts += [f"The per-token statistics pooled over the T>0 temperatures (`likelihood_pooled`; {how}) {src}:",
                  "", *pooled_table(raw), ""]
    if any(_reach_cases(g) for g in _verdicts(raw.get("gates", []))):
        parts += ["Tokens past a threshold cut (top-k, min-p) by more than the scorer's numeric reach, in logits "
                  f"(zero tolerance) {src}:", "", *reach_table(raw), ""]
    # the margins are the gate's own verdicts only where the gate computed every statistic and trusted its scorer
    own = not (raw.get("pooled") or {}).get("what") and not any(_untrusted(g) for g in _verdicts(raw.get("gates", [])))
    if own and any(margins(raw, g) for g in _verdicts(raw.get("gates", []))):
        parts += ["The margin of each verdict at T>0: a run's smallest p / alpha over its statistics (below 1 the gate "
                  f"refused; the support check's count of impossible tokens is not among them) {src}:", "",
                  *margin_table(raw), ""]
    if any(_untrusted(g) for g in _verdicts(raw.get("gates", []))):
        parts += [f"The gates whose scorer-trust check refused, and what the rest of each gate said {src} (the "
                  "trust check never compared a token there, so these are not verdicts of the production gate):", "",
                  *untrusted_table(raw), ""]
    parts += [*notes(raw, path), ""]
    return "\n".join(parts)


def _cut_cell(c: dict[str, Any], alpha: float | None) -> str:
    cell = f"{int(c['candidate'])} / {int(c['baseline'])}, {_p(float(c['p']))}"
    return f"**{cell}**" if alpha is not None and float(c["p"]) < alpha else cell


def render_outside(raw: dict[str, Any], path: str) -> str:
    """Per build and sampling-mix entry: answers, tokens, tokens outside the request's law."""
    labels = sorted({lab for rows in raw["builds"].values() for lab in rows})
    out = [f"Tokens outside the request's law per sampling-mix entry, placed again by the reference model on the CPU "
           f"(raw: {path}):", "", "| build | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for build, rows in raw["builds"].items():
        cells = [f"{rows[lab]['outside']} of {rows[lab]['tokens']}" if lab in rows else "—" for lab in labels]
        out.append(f"| {build} | " + " | ".join(cells) + " |")
    out += ["", f"Command: `{raw['command']}` ({raw['date']}, {raw['machine']}, commit {raw['commit']}); baseline "
            f"seeds {raw.get('baseline_seeds', 'all')}.", ""]
    if raw.get("by_cut"):
        names = [n for n in ("top_k", "top_p", "min_p", "all") if any(n in c for c in raw["by_cut"].values())]
        al = raw.get("alphas")
        alphas = (f" (the gate's alphas, as recorded: {float(al['cut']):.3g} a cut, {float(al['all']):.3g} all; "
                  "**bold**: refused)" if al else "")
        out += ["The gate's pooled outside counts on these re-scored tokens, by the truncation that leaves each token "
                "outside (tokenlaw.cut_counts_p; `all`: every cut together, tokenlaw.pooled_counts_p): candidate / "
                f"baseline tokens outside, p{alphas}:", "",
                "| gate | " + " | ".join(n.replace("_", "-") for n in names) + " |", "|---|" + "---|" * len(names)]
        for build, cuts in raw["by_cut"].items():
            cells = [_cut_cell(cuts[n], float(al["all" if n == "all" else "cut"]) if al else None)
                     if n in cuts else "—" for n in names]
            out.append(f"| {build} | " + " | ".join(cells) + " |")
        rc = raw.get("recomputed")
        out += ["", f"By cut: `{rc['command']}` ({rc['date']}, commit {rc['commit']})." if rc else "", ""]
    return "\n".join(out)


def render_text(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        return m.group(1) + render(load(REPO / m.group("path")), m.group("path")) + m.group(4)

    def sub_outside(m: re.Match[str]) -> str:
        return m.group(1) + render_outside(load(REPO / m.group("path")), m.group("path")) + m.group(4)
    return OUTSIDE.sub(sub_outside, BLOCK.sub(sub, text))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--show", metavar="RAW")
    ap.add_argument("--page", default=str(PAGE))
    a = ap.parse_args(argv)
    if a.show:
        sys.stdout.write(render(load(Path(a.show)), a.show))
        return 0
    page = Path(a.page)
    text = page.read_text(encoding="utf-8")
    new = render_text(text)
    if new == text:
        print(f"up to date: {page}")
        return 0
    if a.check:
        print(f"out of date (run python tests/ddtree/render_prodseq.py): {page}", file=sys.stderr)
        return 1
    page.write_text(new, encoding="utf-8")
    print(f"rendered: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
