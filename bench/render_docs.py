"""Render the measurement tables in docs/ from the raw result files committed beside them.

A rendered block in a Markdown file looks like

    <!-- render: loadtest-ceiling docs/results/loadtest-ceiling-2026-12-01.json -->
    | ... table rendered from the JSON ... |
    Raw: docs/results/loadtest-ceiling-2026-12-01.json (date, machine and command inside)
    <!-- /render -->

Everything between the markers is generated: edit the raw file's source (re-run the benchmark with
`--result`), then `python bench/render_docs.py`. `--check` exits 1 when a block is out of date, 2 when
a block names an unknown renderer or a missing file. tests/test_docs_claims.py runs the check in CI.
`--check` also recomputes every number of the claims manifest (bench/claims.py, docs/claims.yaml).
`--show RENDERER RAW` prints one renderer's output for a raw file (exit 2 on a bad name or file).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: bench/ is the lab, not an installed package
    sys.path.insert(0, str(REPO))
from bench.history import raw_text  # noqa: E402

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- render: (?P<name>[\w-]+) (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /render -->)", re.S)


def _num(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "—"
    text = f"{v:,.{digits}f}"
    return text.replace(",", " ") if digits == 0 else text


def _machine(raw: dict[str, Any]) -> str:
    m = raw.get("machine") or {}
    load = m.get("load_average_start")
    load_txt = f", load average {load[0]:.1f} at the start" if load else ""
    return f"{m.get('cpus', '?')} cores ({m.get('cpu_model') or 'unknown CPU'}){load_txt}"


def _raw_line(path: str, raw: dict[str, Any]) -> str:
    return (f"Raw: {path} — measured {raw.get('date', '?')} on {_machine(raw)}; command: "
            f"`{raw.get('command', '?')}`")


def render_ceiling(raw: dict[str, Any], path: str) -> str:
    """Harness ceiling per client core (best and worst of the repeats per ITL setting)."""
    lines = ["| client (pinned to 1 core) | runs | output tok/s | req/s | client core busy | tok per client CPU-s |",
             "|---|---|---|---|---|---|"]
    for ev in ("each", "mean"):
        rows = [r for r in raw.get("harness", []) if r["itl_events"] == ev]
        if not rows:
            continue

        def span(key: str, digits: int = 0, rows: list[dict[str, Any]] = rows) -> str:
            vals = [r[key] for r in rows if r.get(key) is not None]
            if not vals:
                return "—"
            lo, hi = min(vals), max(vals)
            return _num(lo, digits) if lo == hi else f"{_num(lo, digits)} – {_num(hi, digits)}"
        lines.append(f"| harness, ITL `{ev}` | {len(rows)} | {span('output_tok_per_s')} | {span('requests_per_s')} | "
                     f"{span('client_cores_busy', 2)} | {span('tok_per_cpu_s')} |")
    for b in raw.get("bench_serving", []):
        lines.append(f"| sglang.bench_serving | 1 | {_num(b.get('output_tok_per_s'))} | "
                     f"{_num(b.get('requests_per_s'))} | — | — |")
    return "\n".join(lines) + "\n\n" + _raw_line(path, raw) + "\n"


def render_timing(raw: dict[str, Any], path: str) -> str:
    """Timing error of TTFT and every ITL gap against the simulator's recorded send instants."""
    t = raw["timing"]
    lines = ["| quantity | samples | \\|error\\| median | p90 | p99 | share < 1 ms |", "|---|---|---|---|---|---|"]
    for label, key in (("ITL gap", "itl_abs_error"), ("TTFT (headers → first token)", "ttft_abs_error")):
        d = t[key]
        lines.append(f"| {label} | {d['n']} | {d['median_ms']:.3f} ms | {d['p90_ms']:.3f} ms | {d['p99_ms']:.3f} ms | "
                     f"{d['share_under_1ms'] * 100:.0f} % |")
    return "\n".join(lines) + "\n\n" + _raw_line(path, raw) + "\n"


def render_scaling(raw: dict[str, Any], path: str) -> str:
    """Locust master + N workers against the same simulator."""
    lines = ["| workers | users | output tok/s | per worker vs 1 worker | client cores busy | tok per client CPU-s |",
             "|---|---|---|---|---|---|"]
    eff = raw.get("scaling_efficiency") or {}
    for r in raw.get("scaling", []):
        lines.append(f"| {r['processes']} | {r['users']} | {_num(r['output_tok_per_s'])} | "
                     f"{eff.get(str(r['processes']), 0):.2f} | {r['client_cores_busy']:.2f} | "
                     f"{_num(r['tok_per_cpu_s'])} |")
    return "\n".join(lines) + "\n\n" + _raw_line(path, raw) + "\n"


def render_ddtree_serve(raw: dict[str, Any], path: str) -> str:
    """DDTree served by real sglang servers on the H200 (tests/ddtree/serve_matrix.py)."""
    from bench.ddtree_serve_table import render

    return render(raw, 0.05) + f"\nRaw: {path} (date, machine, command and every server's log tail inside)\n"


# a first difference where the baseline's top-2 log-prob gap is at most this is a numerical tie:
# SmolLM2's bf16 logits of 8..32 are spaced 1/16..1/8 apart, so 0.25 nats is two bf16 steps at most
DDTREE_TIE_NATS = 0.25


def render_ddtree_verdict(raw: dict[str, Any], path: str) -> str:
    """One verdict row per DDTree server (tests/ddtree/serve_matrix.py on the H200)."""
    from bench.ddtree_serve_table import render_verdict

    return render_verdict(raw, DDTREE_TIE_NATS) + f"\nRaw: {path} (per-request output ids, meta_info, " \
        "the baseline's top-2 log-probs, /server_info and the Prometheus spec lines inside)\n"


def render_incident(raw: dict[str, Any], path: str) -> str:
    """The incident on real SGLang (tests/ddtree/incident.py on the H200)."""
    from bench.incident_table import render

    return render(raw, path) + f"\nRaw: {path} (per-server commands, speed rows with texts, every gate case with its " \
        "message, the recorded SGLang response shapes)\n"


def render_gate_false_fails(raw: dict[str, Any], path: str) -> str:
    """A correct build gated again and again in the production sequence (bench/gate_false_fails.py): one row per
    run, the per-token test's numbers per T>0 temperature."""
    disp = any(v.get("dispersion") is not None for r in raw["runs"] for v in (r.get("likelihood") or {}).values())
    more = any(v.get("edge_p") is not None for r in raw["runs"] for v in (r.get("likelihood") or {}).values())
    pooled = any(r.get("pooled") for r in raw["runs"])
    lines = ["| run | verdict | failing checks | per T>0: tokens, KS p, mean u (p), clearly outside, "
             + ("answers' dispersion (p), " if disp else "")
             + ("cut token p, consecutive tokens z (p), " if more else "")
             + "smallest mean TV refused at 90% |"
             + (" pooled over T>0: outside the law (p), cut token p, Stouffer z (p) |" if pooled else ""),
             "|---|---|---|---|" + ("---|" if pooled else "")]
    for r in raw["runs"]:
        cells = []
        for name, v in sorted((r.get("likelihood") or {}).items()):
            tv = v.get("min_mean_tv")
            mean = f"{v['mean_u']:.3f} ({v['mean_p']:.2g})" if v.get("mean_u") is not None else "—"
            dd = (f"{v['dispersion']:.2f} ({v['dispersion_p']:.2g}), " if v.get("dispersion") is not None
                  else "—, " if disp else "")
            if v.get("edge_p") is not None:
                dd += f"{v['edge_p']:.2g}, {v['serial_z']:+.1f} ({v['serial_p']:.2g}), "
            elif more:
                dd += "—, —, "
            cells.append(f"{name.split('@', 1)[1]}: {_num(v.get('tokens'))}, {v['ks_p']:.2g}, {mean}, "
                         f"{v.get('clearly_outside', '—')}, {dd}{f'{tv:.3f}' if tv is not None else '—'}")
        failed = ", ".join(f"`{c}`" for c in sorted(r.get("failed") or {})) or "—"
        pl = r.get("pooled")
        cuts = (pl or {}).get("cuts") or {}
        least = min(cuts.items(), key=lambda kv: kv[1]["p"]) if cuts else None
        pcell = (f" {pl['outside_candidate']} of {pl['outside_candidate'] + pl['outside_baseline']} "
                 f"({pl['outside_p']:.2g}), {pl['edge_p']:.2g}, {pl['serial_z']:+.1f} ({pl['serial_p']:.2g})"
                 + (f"; by cut, least p {least[1]['p']:.2g} ({least[0].replace('_', '-')})" if least else "") + " |"
                 if pl else " — |" if pooled else "")
        lines.append(f"| {r['run']} | {r.get('verdict', 'no verdict')} | {failed} | {'; '.join(cells) or '—'} |"
                     + pcell)
    ff = raw.get("false_fails") or {}
    lines += ["", f"{ff.get('refused', '?')} of {ff.get('runs', '?')} runs refused.", "",
              f"Raw: {path} — {raw.get('date', '?')}, {raw.get('machine', '?')}, commit {raw.get('commit', '?')}; "
              f"command: `{raw.get('command', '?')}`", ""]
    return "\n".join(lines)


def render_gate_repeat(raw: dict[str, Any], path: str) -> str:
    """Repeated gate runs per server from one incident call (tests/ddtree/incident.py --repeat N)."""
    from bench.gate_repeat_table import render

    return render(raw, path)


def render_ci_run(raw: dict[str, Any], path: str) -> str:
    """One `.ci/run` from a fresh clone (bench/ci_run_summary.py)."""
    verdict = "all stages passed" if raw.get("passed") else "FAILED: " + ", ".join(
        f"{f['stage']} (exit {f['exit']})" for f in raw.get("failed_stages", []))
    j = raw.get("junit") or {}
    lines = [f"`{raw['command']}` at `{(raw.get('commit') or '?')[:7]}`, {raw['date']}, {raw['machine']}: "
             f"**{verdict}** in {_num(raw.get('total_seconds'))} s; pytest: {raw.get('pytest_summary')}"
             + (f" (JUnit: {j['tests']} tests, {j['skipped']} skipped, {j['ran']} ran, {j['failed']} failed)"
                if j else ""),
             "", f"Raw: {path}", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {st['stage']} | {st['seconds']} |" for st in raw.get("stages", [])]
    lines += [f"| {f['stage']} (failed) | {f['seconds']} |" for f in raw.get("failed_stages", [])]
    prep = raw.get("test_prepare") or {}
    if prep:
        lines += ["", "Inside `test`: " + ", ".join(f"{k} {v} s" for k, v in prep.items()) + "."]
    return "\n".join(lines) + "\n"


def render_sglang_capacity(raw: dict[str, Any], path: str) -> str:
    """Locust capacity against real sglang servers on the H200 (tests/ddtree/loadtest_real.py)."""
    lines = ["| server | ready (s) | capacity (users) | first failing | step: users -> verdict, TTFT p95 / ITL p95 "
             "(ms), req/s, output tok/s, answer tokens |", "|---|---|---|---|---|"]
    for r in raw.get("runs", []):
        c = r.get("capacity") or {}
        steps = []
        for s in c.get("steps", []):
            m = s.get("summary") or {}
            thr, lens = m.get("throughput") or {}, m.get("lengths") or {}
            steps.append(f"{_num(s.get('load'))} -> {'pass' if s.get('passed') else 'FAIL'}, "
                         f"{_num((m.get('ttft_ms') or {}).get('p95'))} / {_num((m.get('itl_ms') or {}).get('p95'), 1)}"
                         f", {_num(thr.get('requests_per_s'))}, {_num(thr.get('output_tok_per_s'))}, "
                         f"{_num(lens.get('output_received_mean'))}")
        lines.append(f"| {r['name']} | {_num(r.get('ready_s'))} | {_num(c.get('capacity'))} | "
                     f"{_num(c.get('first_failing'))} | {'; '.join(steps) or r.get('error', '—')[:200]} |")
    slo = (raw.get("runs") or [{}])[0].get("capacity", {}).get("slo") or {}
    head = (f"SLOs: TTFT p95 <= {_num(slo.get('ttft_p95_ms'))} ms, ITL p95 <= {_num(slo.get('itl_p95_ms'))} ms, "
            f"errors <= {slo.get('max_error_rate', '?')}; capacity arguments `{' '.join(raw.get('capacity_args', []))}`"
            f"; grid `{raw.get('grid', '?')}`.")
    return head + "\n\n" + "\n".join(lines) + f"\n\nRaw: {path} — measured {raw.get('date', '?')}; command: " \
        f"`{raw.get('command', '?')}` (each server's command and every step's summary inside)\n"


def render_sglang_sweep(raw: dict[str, Any], path: str) -> str:
    """`python -m sglfleet.validation sweep` (kind sglang) starting its own servers on the H200."""
    lines = ["| cell | status | accept length | tok/s | baseline tok/s | speedup | quality | lossless | "
             "failed checks |", "|---|---|---|---|---|---|---|---|---|"]
    for r in raw.get("rows", []):
        lines.append(f"| {r['cell']} | {r['status']} | {_num(r.get('accept_length'), 2)} | {_num(r.get('tok_s'))} | "
                     f"{_num(r.get('baseline_tok_s'))} | {_num(r.get('speedup'), 2)}x | {_num(r.get('quality'), 2)} | "
                     f"{r.get('lossless')} | {', '.join(r.get('failed_checks') or []) or 'none'} |")
    return "\n".join(lines) + f"\n\nRaw: {path} (every cell's server command, the baseline's, per-cell timings)\n"

def render_gpu_proof(raw: dict[str, Any], path: str) -> str:
    """The kernel-level tree-verify proof on the H200 (tests/ddtree/gpu_proof.sh)."""
    from bench.gpu_proof_table import render_doc

    return render_doc(raw, path)


def render_gate_heldout_seeds(raw: dict[str, Any], path: str) -> str:
    """One row per held-out seed (bench/gate_heldout_seeds.py digest of bench/gate_families.py runs)."""
    def part(k: int, n: int) -> str:
        return f"{k} of {n}" + (f" ({k / n:.1%})" if n else "")

    lines = ["| seed | scored | coherent failed | garbled passed | fresh coherent failed | fresh garbled passed | "
             "fixed coherent failed | fixed garbled passed | full raw file (git history) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in raw["seeds"]:
        m, fr, fx, src = s["summary"], s["split"]["fresh"], s["split"]["fixed"], s["source"]
        lines.append(f"| {s['seed']} | {(s.get('date') or '?')[:10]} | {part(m['false_fail'], m['coherent'])} | "
                     f"{part(m['false_pass'], m['garbled'])} | {part(fr['ok_wrong'], fr['ok'])} | "
                     f"{part(fr['bad_wrong'], fr['bad'])} | {part(fx['ok_wrong'], fx['ok'])} | "
                     f"{part(fx['bad_wrong'], fx['bad'])} | `{src['commit'][:10]}:{src['path']}` |")
    return "\n".join(lines) + f"\n\nRaw: {path} — digest of the seed files made {raw.get('date', '?')} by " \
        f"`{raw.get('command', '?')}` (each row's file: `git show COMMIT:PATH`, blob id inside)\n"


def render_gate_heldout(raw: dict[str, Any], path: str) -> str:
    """One held-out seed in full: sets, fresh/fixed split, per class, by check (bench/render_gate_table.py)."""
    from bench.render_gate_table import render

    return render(raw, path) + "\n"


def render_drafter_recipe(raw: dict[str, Any], path: str) -> str:
    """The drafter recipes side by side (bench/drafter_recipe.py)."""
    from bench.drafter_recipe import render

    return render(raw, path)


def render_drafter_step(raw: dict[str, Any], path: str) -> str:
    """The drafter's training step: per sequence, packed, packed + TF32 side by side (bench/drafter_step.py)."""
    from bench.drafter_step import render

    return render(raw, path)


def render_self_asked(raw: dict[str, Any], path: str) -> str:
    """A sample of the prompts the target asks itself (bench/self_asked.py)."""
    from bench.self_asked import render

    return render(raw, path)


def render_drafter_train(raw: dict[str, Any], path: str) -> str:
    """Device calls of train-drafter, one row each (their train.json reports, as ``runs``)."""
    rows = ["| call | steps (this call / planned) | steps in all | training loss, last 20 | kept: step, validation "
            "loss (lowest / last) | answers per prompt, training answers | held-out accept | all anchors | "
            "suite accept | seconds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in raw["runs"]:
        rep = r["report"]
        off, suite = rep.get("offline", {}), rep.get("offline_suite", {})
        val = rep.get("validation") or []
        # a report from before the validation checks (95bf693) kept its last step and has no validation loss
        kept = (f"{rep['kept_step']:,}, {min(v['loss'] for v in val):.2f} / {val[-1]['loss']:.2f}"
                if val and "kept_step" in rep else "last step (no checks)")
        answers = f"{rep.get('corpus', {}).get('answers', 1)}, {rep['train_seqs']:,}" if "train_seqs" in rep else "—"
        rows.append(f"| {r['call']} | {rep['steps']:,} / {rep.get('steps_planned', rep['steps']):,} | "
                    f"{rep.get('steps_total', rep['steps']):,} | {rep['loss_last']:.4f} | {kept} | {answers} | "
                    f"{off.get('accept_length', 0):.2f} | {off.get('accept_length_all_anchors', 0):.2f} | "
                    f"{suite.get('accept_length', 0):.2f} | {rep['seconds']:.0f} |")
    first = raw["runs"][0]["report"].get("resumed_from")
    start = (f"Resumed from a drafter of {first['steps_total']:,} steps (held-out accept "
             f"{first['offline']['accept_length']:.2f}, suite {first['offline_suite']['accept_length']:.2f}). "
             if first else "")
    cmds = "; ".join(f"call {r['call']}: `{r['command']}`" for r in raw["runs"])
    return (start + "Accept lengths are offline chain figures (1 + the leading drafted tokens equal to the "
            "target's text): held out = the corpus's held-out tenth anchored where sglang drafts; all anchors = "
            "the same anywhere in the sequence; suite = the gate's suite prompts' greedy answers.\n\n"
            + "\n".join(rows) + f"\n\nRaw: {path} ({raw['date']}, {raw['machine']}; {cmds})\n")


def render_ddtree_real(raw: dict[str, Any], path: str) -> str:
    """DDTree with the trained drafter on the inflated 135M target, on the H200 (bench/ddtree_real.py)."""
    from bench.render_ddtree_real import render

    return render(raw, path)


def render_ddtree_step(raw: dict[str, Any], path: str) -> str:
    """DDTree's decode step at Llama-3-8B shape on the H200 (bench/ddtree_step.py)."""
    from bench.render_ddtree_step import render

    return render(raw, path)


def render_likelihood_rates(raw: dict[str, Any], path: str) -> str:
    """The likelihood test's false-fail rate and power on a pool of real answers (bench/likelihood_rates.py)."""
    ff = raw["false_fail"]
    temps = [f"{t:g}" for t in raw["temperatures"]]
    on = raw.get("scored_on", "text")
    n_ids = raw.get("answers_on_ids", 0)
    low = raw["correct_answers_lowest_tokens"][0]
    tok = low["token"].strip() or repr(low["token"])
    lines = [
        "| scored on | answers on ids | correct gates failed | per T " + " / ".join(temps)
        + " | impossible tokens | lowest correct log p_T (token) |",
        "|---|---|---|---|---|---|",
        f"| {on} | {n_ids} of {raw['pool_answers']} | {ff['gate_verdicts_failed']} of {ff['of']} "
        f"({ff['rate']:.2%}) | " + " / ".join(str(ff["per_temperature_failed"].get(t, 0)) for t in temps)
        + f" | {sum(ff['impossible_tokens'].values())} | {low['log_p_T']:.2f} (`{tok}`) |",
        "",
        "| answers corrupted (r) | gates refused | per T " + " / ".join(temps) + " | by an impossible token |",
        "|---|---|---|---|",
    ]
    for r, v in raw["corruption"]["by_rate"].items():
        lines.append(f"| {r} | {v['gate_rejections']} of {v['of']} | "
                     + " / ".join(str(v["per_temperature"].get(t, 0)) for t in temps)
                     + f" | {v['by_impossible_token']} |")
    lines += ["", f"Raw: {path} — {raw.get('date', '?')}, {raw.get('splits')} gate-size splits of "
              f"{raw.get('per_side')} seeds per side; command: `{raw.get('command', '?')}`", ""]
    return "\n".join(lines)


def render_corruptible_gate(raw: dict[str, Any], path: str) -> str:
    """The real gate against the corruptible engine, one row per mode (bench/corruptible_gate.py)."""
    lc = (raw.get("profile", {}).get("gate", {}).get("likelihood") or {})
    lag = any((v or {}).get("pit_lag1_p") is not None
              for r in raw["runs"] for v in (r.get("likelihood") or {}).values())
    tok = any("per_token" in (v or {}) for r in raw["runs"] for v in (r.get("likelihood") or {}).values())
    disp = any(((v or {}).get("per_token") or {}).get("dispersion") is not None
               for r in raw["runs"] for v in (r.get("likelihood") or {}).values())
    edge = any(((v or {}).get("per_token") or {}).get("edge_p") is not None
               for r in raw["runs"] for v in (r.get("likelihood") or {}).values())
    serial = any(((v or {}).get("per_token") or {}).get("serial_p") is not None
                 for r in raw["runs"] for v in (r.get("likelihood") or {}).values())
    disp_head = ((", answers' dispersion (p)" if disp else "") + (", cut token drawn / expected (p)" if edge else "")
                 + (", consecutive tokens z (p)" if serial else ""))
    lines = [f"| engine | w | verdict | failing checks | T>0 likelihood: p (mean NLL, worst window"
             f"{', lag-1 PIT' if lag else ''}), z | "
             + (f"per-token: tokens, KS p, mean u (p), outside (baseline){disp_head} | " if tok else "")
             + "accept length | gate s |", "|---|---|---|---|---|---|---|" + ("---|" if tok else "")]
    for r in raw["runs"]:
        lik = []
        for t, v in (r.get("likelihood") or {}).items():
            if v.get("mean_nll_p") is None:
                lik.append(f"{t}: no test ({v['message'][:90]})")
            else:
                lag1 = f", {v['pit_lag1_p']:.3g}" if v.get("pit_lag1_p") is not None else ""
                lik.append(f"{t}: {v['mean_nll_p']:.3g}, {v['worst_window_p']:.3g}{lag1}, z {v['mean_nll_z']:+.1f}"
                           f"{'' if v['ok'] else ' **fail**'}")
        if "likelihood" not in r:  # a run recorded before the bench kept the verdicts' numbers
            lik = [f"{k.split('@', 1)[1]}: **fail**, {m.split(': ', 1)[-1][:70]}"
                   for k, m in (r.get("failed") or {}).items() if k.startswith("likelihood@")]
            lik = lik or ["passed (p not kept)"]
        acc = re.search(r"mean accept length ([\d.]+)", r.get("spec_accept_length") or "")
        name = "correct" if r["mode"] == "none" else r["mode"].replace("@b", " at budget ")
        failed = ", ".join(f"`{c}`" for c in r.get("failed_checks") or []) or "—"
        per = ""
        if tok:
            cells = []
            for t, v in (r.get("likelihood") or {}).items():
                pt = v.get("per_token")
                if pt:
                    dd = (f", {pt['dispersion']:.2f} ({pt['dispersion_p']:.2g})" if pt.get("dispersion") is not None
                          else ", —" if disp else "")
                    if pt.get("edge_p") is not None:
                        dd += f", {pt['edge']} / {pt['edge_expected']:.1f} ({pt['edge_p']:.2g})"
                    elif edge:
                        dd += ", —"
                    if pt.get("serial_p") is not None:
                        dd += f", {pt['serial_z']:+.1f} ({pt['serial_p']:.2g})"
                    elif serial:
                        dd += ", —"
                    cells.append(f"{t}: {pt['tokens']}, {pt['ks_p']:.2g}, {pt['mean_u']:.3f} ({pt['mean_p']:.2g}), "
                                 f"{pt['outside']} ({pt['outside_baseline']}){dd}{'' if pt['ok'] else ' **fail**'}")
            per = f"{'; '.join(cells) or '—'} | "
        lines.append(f"| {name} | {r['verify_width']} | {r.get('verdict', 'no verdict')} | {failed} | "
                     f"{'; '.join(lik) or '—'} | {per}{acc.group(1) if acc else '—'} | {_num(r.get('wall_s'))} |")
    verdicts = [v for r in raw["runs"] for v in (r.get("likelihood") or {}).values()]
    need = next((v["alpha_per_statistic"] for v in verdicts if v.get("alpha_per_statistic")), None)
    counted = [v for v in verdicts if isinstance(v.get("on_ids"), dict) and v.get("n_candidate")]
    on_ids = sum(v["on_ids"].get("candidate", 0) for v in counted)
    ids = (f" Candidate answers scored on the ids the engine sampled: {on_ids} of "
           f"{sum(v['n_candidate'] for v in counted)} (the rest on their text)." if counted else "")
    lines += ["", f"Likelihood plan: {len(lc.get('seeds', [])) or 3} candidate and "
                  f"{len(lc.get('baseline_seeds', [])) or 3} baseline answers per prompt"
                  + (f"; each statistic needs p < {need:.3g}" if need else "") + "." + ids,
              "", f"Raw: {path} — {raw.get('date', '?')}, {raw.get('machine', '?')}, commit {raw.get('commit', '?')}; "
                  f"command: `{raw.get('command', '?')}`", ""]
    return "\n".join(lines)


def render_token_power_size(raw: dict[str, Any], path: str) -> str:
    """The per-token test's power against the gate's size (bench/token_power_size.py): per candidate tokens per
    temperature, the smallest mean total-variation distance refused with the target probability, per temperature
    alone and for every temperature's test together, and the worst family's smallest refused share."""
    temps = list(raw["sizes"][0]["per_temperature"]) if raw.get("sizes") else []
    head = " | ".join(f"T{t}" for t in temps)
    lines = [f"| candidate tokens per temperature | {head} | every temperature together | hardest family "
             "(share of tokens, together) |", "|---|" + "---|" * (len(temps) + 2)]

    def tv(st: dict[str, Any]) -> str:
        v = st.get("min_mean_tv_all_families")
        bad = st.get("unrefused_families") or []
        return ("—" if v is None else f"{v:.3f}") + (f" ({', '.join(bad)} unrefused)" if bad else "")

    for row in raw.get("sizes") or []:
        both = row["all_temperatures"]
        fams = {f: d for f, d in both["families"].items() if d.get("min_mean_tv") is not None}
        hard = max(fams, key=lambda f: fams[f]["min_mean_tv"]) if fams else None
        hard_s = f"{hard} ({fams[hard]['min_rate']:.1%})" if hard else "—"
        cells = " | ".join(tv(row["per_temperature"][t]) for t in temps)
        lines.append(f"| {_num(row['tokens_per_temperature'])} | {cells} | {tv(both)} | {hard_s} |")
    rows = raw.get("rows_per_temperature") or {}
    lines += ["", f"Rows: the baseline's own tokens ({', '.join(f'T{t}: {n}' for t, n in rows.items())}), "
              f"{raw.get('reps')} Monte Carlo draws per share tried, power target {raw.get('target'):.0%}, alphas "
              f"KS {raw['alphas']['ks']:.2g} / mean {raw['alphas']['mean']:.2g} / outside "
              f"{raw['alphas']['outside']:.2g}"
              + (f" / edge {raw['alphas']['edge']:.2g}" if raw["alphas"].get("edge") else "") + " per temperature.", "",
              f"Raw: {path} — {raw.get('date', '?')}, {raw.get('machine', {}).get('cpus', '?')} cores, commit "
              f"{raw.get('commit', '?')}; command: `{raw.get('command', '?')}`"]
    return "\n".join(lines) + "\n"


def render_corruptible_fault_strength(raw: dict[str, Any], path: str) -> str:
    """Each sampler fault's strength (mean total-variation distance of the emitted token's law from p_T) and the
    per-token test's probability of refusing it at several gate sizes (bench/corruptible_fault_strength.py)."""
    temps = list(raw["mean_tv"])
    sizes = [r["tokens"] for r in raw["power"][temps[0]]]
    lines = ["| fault | T | mean TV from p_T | " + " | ".join(f"refused at {_num(n)} tokens" for n in sizes) + " |",
             "|---|---|---|" + "---|" * len(sizes)]
    for f in raw["mean_tv"][temps[0]]:
        for t in temps:
            cells = []
            for r in raw["power"][t]:
                v = r["refused"].get(f)
                w = (r.get("refused_without_edge") or {}).get(f)
                cells.append("—" if v is None else f"{v:.0%}" + (f" ({w:.0%})" if w is not None and w != v else ""))
            lines.append(f"| {f} | {t} | {raw['mean_tv'][t][f]:.4f} | " + " | ".join(cells) + " |")
    toks = ", ".join(f"T{t}: {_num(n)}" for t, n in raw["tokens"].items())
    pa = raw["power_alphas"]
    edge = (f", edge {pa['edge']:.2g}; in brackets where it differs: without the edge test" if pa.get("edge")
            else "")
    lines += ["", f"Tokens walked by the correct engine: {toks} ({len(raw['answers'])} answers, seeds "
              f"{raw['seeds']}); engine budget {raw['engine']['budget']}, top-k {raw['engine']['topk']}. Refusal: "
              f"the per-token test at the shipped alphas (KS {pa['ks']:.2g}, mean {pa['mean']:.2g}, outside "
              f"{pa['outside']:.2g}{edge}) over gates whose "
              "every token comes from the fault's law; — where the fault's pool of draws is smaller than the gate.",
              "", f"Raw: {path} — {raw.get('date', '?')}, {raw.get('machine', {}).get('cpus', '?')} cores, commit "
              f"{raw.get('commit', '?')}; command: `{raw.get('command', '?')}`"]
    return "\n".join(lines) + "\n"


def render_cut_reach(raw: dict[str, Any], path: str) -> str:
    """How far past the request's threshold cuts the tokens outside the law lay, per build (bench/cut_reach.py)."""
    grid = list(next(iter(raw["summary"].values()))["past"])
    lines = ["| build | tokens (threshold-cut requests) | outside the law | past a threshold cut | farthest reach "
             "(logits) | " + " | ".join(f"past {g}" for g in grid) + " |", "|---|---|---|---|---|" + "---|" * len(grid)]
    for name, s in raw["summary"].items():
        far = "—" if s["max_reach"] is None else f"{s['max_reach']:.3f}"
        lines.append(f"| {name} | {_num(s['tokens'])} | {s['outside']} | {s['threshold_outside']} | {far} | "
                     + " | ".join(str(s["past"][g]) for g in grid) + " |")
    lines += ["", f"Scorer: {raw.get('scorer', '?')}, order {raw.get('order', '?')}; baseline file "
              f"{raw.get('baseline_file', '?')}.", "", f"Raw: {path} — {raw.get('date', '?')}, "
              f"{raw.get('machine', '?')}, commit {raw.get('commit', '?')}; command: `{raw.get('command', '?')}`"]
    return "\n".join(lines) + "\n"


def render_cut_reach_counts(raw: dict[str, Any], path: str) -> str:
    """The counts past a threshold cut as a two-sample test against the baseline (bench/cut_reach.py's raw): each
    build's tokens past the cut by more than 0, by more than the gate's CUT_REACH and by twice it (the candidate's
    own bf16 scorer flips tokens one or two bf16 steps, 0.125-0.25 logits, past a cut), the baseline's, and the
    one-sided binomial p with the build's share of the threshold-cut tokens (one stratum: the
    gate's own test counts each cut alone and conditions on each temperature)."""
    from sglfleet.validation.tokenlaw import CUT_REACH, binomial_sum_tail  # the product, installed by make setup

    builds = raw["builds"]
    base_name = next(k for k in builds if k.startswith("target-only"))
    base = builds[base_name]
    bars = (0.0, CUT_REACH, 2 * CUT_REACH)

    def past(b: dict[str, Any], r: float) -> int:
        return sum(1 for o in b["outside"] if o["reach"] is not None and o["reach"] > r)

    lines = ["| build | share of the tokens | " + " | ".join(f"past {r:g} (baseline {past(base, r)}) | p" for r in bars)
             + " |", "|---|---|" + "---|---|" * len(bars)]
    for name, b in builds.items():
        if name == base_name:
            continue
        share = b["tokens"] / (b["tokens"] + base["tokens"])
        cells = []
        for r in bars:
            c, n = past(b, r), past(b, r) + past(base, r)
            cells += [str(c), f"{binomial_sum_tail(c, [(n, share)]) if n else 1.0:.1e}"]
        lines.append(f"| {name} | {share:.2f} | " + " | ".join(cells) + " |")
    lines += ["", f"Raw: {path} — {raw.get('date', '?')}, {raw.get('machine', '?')}, commit "
              f"{raw.get('commit', '?')}; command: `{raw.get('command', '?')}`"]
    return "\n".join(lines) + "\n"


def render_prodseq_rates(raw: dict[str, Any], path: str) -> str:
    """The correct builds' tokens outside their request's law per 1,000 against the target-only baseline's, pooled
    over the production-sequence series (bench/prodseq_rates.py): in all and per cut, with the exact p stratified
    by series."""
    def cell(v: dict[str, Any]) -> str:
        ratio = "—" if v["ratio"] is None else f"x{v['ratio']:.2f}"
        return f"{v['outside']} / {_num(v['tokens'])} ({ratio}, p {v['p']:.2g})"
    rows = [*raw["pooled"], *([raw["chain_vs_b16"]] if raw.get("chain_vs_b16") else [])]
    cuts = sorted({c for r in rows for c in r["cuts"]})
    lines = ["| build (against) | gates | outside / tokens (rate vs the other side, p) | "
             + " | ".join(f"requests with {c}" for c in cuts) + " |", "|---|---|---|" + "---|" * len(cuts)]
    for r in rows:
        against = "DDTree b16/k4" if r["build"].startswith("chain vs") else "the baseline"
        name = "chain" if r["build"].startswith("chain vs") else r["build"]
        lines.append(f"| {name} ({against}) | {r['gates']} | {cell(r)} | "
                     + " | ".join(cell(r["cuts"][c]) if c in r["cuts"] else "—" for c in cuts) + " |")
    names = ", ".join(s["raw"].rsplit("/", 1)[-1] for s in raw["series"])
    lines += ["", f"Series: {names} (the counts by cut: the series that recorded them).", "",
              f"Raw: {path} — {raw.get('date', '?')}, {raw.get('machine', '?')}, commit {raw.get('commit', '?')}; "
              f"command: `{raw.get('command', '?')}`"]
    return "\n".join(lines) + "\n"


RENDERERS: dict[str, Callable[[dict[str, Any], str], str]] = {
    "prodseq-rates": render_prodseq_rates,
    "cut-reach-counts": render_cut_reach_counts,
    "cut-reach": render_cut_reach,
    "corruptible-fault-strength": render_corruptible_fault_strength,
    "token-power-size": render_token_power_size,
    "corruptible-gate": render_corruptible_gate,
    "likelihood-rates": render_likelihood_rates,
    "ddtree-step": render_ddtree_step,
    "ddtree-real": render_ddtree_real,
    "drafter-recipe": render_drafter_recipe,
    "drafter-step": render_drafter_step,
    "drafter-train": render_drafter_train,
    "self-asked": render_self_asked,
    "gate-heldout-seeds": render_gate_heldout_seeds,
    "gate-heldout": render_gate_heldout,
    "ddtree-gpu-proof": render_gpu_proof,
    "ci-run": render_ci_run,
    "incident": render_incident,
    "gate-repeat": render_gate_repeat,
    "gate-false-fails": render_gate_false_fails,
    "ddtree-serve": render_ddtree_serve,
    "ddtree-serve-verdict": render_ddtree_verdict,
    "loadtest-ceiling": render_ceiling,
    "loadtest-timing": render_timing,
    "loadtest-scaling": render_scaling,
    "sglang-capacity": render_sglang_capacity,
    "sglang-sweep": render_sglang_sweep,
}


class RenderError(Exception):
    pass


def render_text(text: str, repo: Path = REPO) -> str:
    """`text` with every render block regenerated from its raw file."""
    def sub(m: re.Match[str]) -> str:
        name, path = m.group("name"), m.group("path")
        return m.group(1) + render_one(name, path, repo) + m.group(5)
    return BLOCK.sub(sub, text)


def render_one(name: str, path: str, repo: Path = REPO) -> str:
    """What renderer `name` makes of the raw file `path` (relative to `repo`)."""
    if name not in RENDERERS:
        raise RenderError(f"unknown renderer '{name}' (known: {', '.join(RENDERERS)})")
    f = repo / path
    if not f.is_file():
        raise RenderError(f"render block '{name}' names {path}, which does not exist")
    try:
        raw = json.loads(raw_text(f))
    except ValueError as exc:
        raise RenderError(f"{path}: not JSON ({exc})") from None
    return RENDERERS[name](raw, path)


def blocks(text: str) -> list[tuple[str, str]]:
    """(renderer, raw path) of every render block in `text`."""
    return [(m.group("name"), m.group("path")) for m in BLOCK.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a rendered block is out of date")
    ap.add_argument("--show", nargs=2, metavar=("RENDERER", "RAW"), help="print one renderer's output for a raw file")
    args = ap.parse_args(argv)
    if args.show:
        try:
            sys.stdout.write(render_one(args.show[0], args.show[1], Path.cwd()))
        except RenderError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    stale = []
    try:
        for doc in DOCS:
            text = doc.read_text(encoding="utf-8")
            new = render_text(text)
            if new != text:
                stale.append(doc.relative_to(REPO))
                if not args.check:
                    doc.write_text(new, encoding="utf-8")
    except RenderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from bench.claims import STRICT_DOCS, ClaimError, check_claims, unclaimed_numbers

    try:
        bad = check_claims(REPO)
        for rel in STRICT_DOCS:
            if (REPO / rel).is_file():
                bad += [f"{u} (claim it in docs/claims.yaml or render it)"
                        for u in unclaimed_numbers(rel, (REPO / rel).read_text(encoding="utf-8"))]
    except ClaimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in bad:
        print(f"claim: {line}", file=sys.stderr)
    if args.check and stale:
        print(f"out of date (run python bench/render_docs.py): {', '.join(map(str, stale))}", file=sys.stderr)
        return 1
    if bad:
        return 1
    print(("rendered: " if stale else "up to date: ") + (", ".join(map(str, stale)) or f"{len(DOCS)} files"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
