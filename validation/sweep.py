"""Speculative-configuration sweep: gate every cell of a grid, recommend the fastest that passed.

    python -m validation sweep --grid validation/grids/embedded-draft.yaml [--out DIR]
    make sweep HOST=embedded GRID=validation/grids/embedded-draft.yaml

A grid is a list of server configurations. Each cell is deployed (the embedded engine started with
the cell's settings, or an endpoint that is already serving it), then gated on everything that
matters for a speculative deployment: coherence at every temperature, lossless T=0 output against
the non-speculative baseline, quality, acceptance, and speed against the baseline at one stream.
A cell that fails to start, names an unknown setting, or serves another model is reported as
failed — the matrix goes on, and no failed cell is ever shown as passed or skipped.
"""

from __future__ import annotations

import itertools
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from rich.console import Console

from pipeline.config import StrictModel, format_validation_error, load_config
from pipeline.embedded import EmbeddedConfig, EmbeddedServer
from pipeline.errors import PipelineError, UsageError
from pipeline.reports import Case, write_html, write_json, write_junit
from validation.config import GateConfig, load_gate_config

# Settings an SGLang DDTree / DFlash cell may carry (they become server arguments on deploy).
SGLANG_SETTINGS = {"budget", "topk", "block_size", "algorithm", "attention_backend", "cuda_graph"}


class Cell(StrictModel):
    name: str | None = None
    url: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)


class SweepConfig(StrictModel):
    kind: Literal["embedded", "endpoints"] = "embedded"
    # embedded: the cartesian product of `axes` over `base` settings, each served by the embedded engine
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    base: dict[str, Any] = Field(default_factory=lambda: {"spec_type": "draft"})
    # endpoints: cells already served elsewhere (SGLang deployments), plus the non-speculative baseline
    cells: list[Cell] = Field(default_factory=list)
    baseline_url: str | None = None
    plot_axes: list[str] = Field(default_factory=list, description="x axis, then series; default: axes order")
    gate_config: str | None = None
    gate: dict[str, Any] = Field(default_factory=dict, description="gate overrides for every cell")
    port_base: int = Field(default=18600, ge=1024, le=65000)

    @model_validator(mode="after")
    def _shape(self) -> SweepConfig:
        if self.kind == "embedded" and not self.axes:
            raise ValueError("an embedded sweep needs `axes` (setting -> list of values)")
        if self.kind == "endpoints":
            if not self.cells:
                raise ValueError("an endpoints sweep needs `cells` with url + settings")
            if not self.baseline_url:
                raise ValueError("an endpoints sweep needs `baseline_url` (the non-speculative deployment)")
            if any(not c.url for c in self.cells):
                raise ValueError("every endpoints cell needs a url")
        if any(not v for v in self.axes.values()):
            raise ValueError("every axis needs at least one value")
        return self

    def expand(self) -> list[Cell]:
        if self.kind == "endpoints":
            return self.cells
        keys = list(self.axes)
        return [Cell(settings=dict(zip(keys, combo, strict=True)))
                for combo in itertools.product(*(self.axes[k] for k in keys))]

    def plot_keys(self) -> list[str]:
        if self.plot_axes:
            return self.plot_axes
        if self.axes:
            return list(self.axes)[:2]
        keys: list[str] = []
        for c in self.cells:
            keys += [k for k in c.settings if k not in keys]
        return keys[:2]


def load_sweep_config(path: str, overrides: dict[str, Any] | None = None) -> SweepConfig:
    return load_config(SweepConfig, path, overrides, section="sweep")


def cell_label(cell: Cell) -> str:
    return cell.name or ",".join(f"{k}={v}" for k, v in cell.settings.items()) or "default"


def _embedded_cell_config(settings: dict[str, Any], base: dict[str, Any], port: int) -> EmbeddedConfig:
    known = set(EmbeddedConfig.model_fields)
    unknown = sorted(set(settings) - known)
    if unknown:
        raise UsageError(f"unknown setting(s) {unknown} for the embedded engine; known: {sorted(known)}")
    merged = {**base, **settings, "port": port}
    if merged.get("spec_type") == "draft" and not merged.get("draft_model_path"):
        merged["draft_model_path"] = EmbeddedConfig(port=port).model_path  # the target drafts for itself
    try:
        return EmbeddedConfig.model_validate(merged)
    except ValidationError as exc:
        raise UsageError(format_validation_error(exc, f"invalid cell settings {settings}")) from None


def _metric(case_list: list[Case], name: str, key: str) -> Any:
    for c in case_list:
        if c.name == name:
            return c.details.get(key)
    return None


def run_sweep(cfg: SweepConfig, out: Path, console: Console | None = None) -> dict[str, Any]:
    """Gate every cell; write sweep.json, junit.xml, sweep.html + plots; return the summary."""
    from validation.gate import run_gate

    console = console or Console(stderr=True)
    out.mkdir(parents=True, exist_ok=True)
    base_gate = load_gate_config(cfg.gate_config, cfg.gate) if cfg.gate_config else GateConfig(**cfg.gate)
    cells = cfg.expand()
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        baseline_url = cfg.baseline_url
        if cfg.kind == "embedded":
            base_cfg = _embedded_cell_config({k: v for k, v in cfg.base.items() if k != "spec_type"} | {
                "spec_type": "none"}, {}, cfg.port_base)
            console.rule("baseline: embedded engine without speculative decoding")
            baseline_url = stack.enter_context(EmbeddedServer(base_cfg, out / "baseline")).url
        for i, cell in enumerate(cells):
            label = cell_label(cell)
            console.rule(f"cell {i + 1}/{len(cells)}: {label}")
            row: dict[str, Any] = {"cell": label, "settings": cell.settings, "status": "error"}
            t0 = time.perf_counter()
            try:
                gate_cfg = base_gate.model_copy(update={"baseline_url": baseline_url})
                if cfg.kind == "embedded":
                    ecfg = _embedded_cell_config(cell.settings, cfg.base, cfg.port_base + 1 + i)
                    with EmbeddedServer(ecfg, out / f"cell-{i:02d}") as srv:
                        res = run_gate(srv.url, gate_cfg, out_dir=out / f"cell-{i:02d}", console=console)
                else:
                    unknown = sorted(set(cell.settings) - SGLANG_SETTINGS)
                    if unknown:
                        raise UsageError(f"unknown setting(s) {unknown}; known: {sorted(SGLANG_SETTINGS)}")
                    assert cell.url
                    res = run_gate(cell.url, gate_cfg, out_dir=out / f"cell-{i:02d}", console=console)
                accept = _metric(res.cases, "spec_accept_length", "per_request")
                row.update({
                    "status": "passed" if res.passed else "failed",
                    "failed_checks": [c.name for c in res.failed_cases],
                    "accept_length": (sum(accept) / len(accept)) if accept else None,
                    "tok_s": _metric(res.cases, "speed_vs_baseline@c1", "candidate_tok_s"),
                    "baseline_tok_s": _metric(res.cases, "speed_vs_baseline@c1", "baseline_tok_s"),
                    "speedup": _metric(res.cases, "speed_vs_baseline@c1", "ratio_median"),
                    "quality": _metric(res.cases, "quality_accuracy", "accuracy"),
                    "lossless": next((c.ok for c in res.cases if c.name == "lossless_t0"), None),
                    "report": str(out / f"cell-{i:02d}" / "report.html"),
                })
            except PipelineError as exc:
                row.update({"status": "error", "error": str(exc), "failed_checks": ["cell-error"]})
                console.print(f"[bold red]cell {label} failed: {exc}")
            row["seconds"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
    passed = [r for r in rows if r["status"] == "passed"]
    best = max(passed, key=lambda r: r.get("tok_s") or 0.0) if passed else None
    summary = {"kind": cfg.kind, "cells": len(rows), "passed": len(passed), "recommendation": best,
               "baseline": baseline_url, "rows": rows}
    _write(cfg, out, summary, rows)
    return summary


def _write(cfg: SweepConfig, out: Path, summary: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    images = _plots(cfg, out, rows)
    cases = [Case(r["cell"], "sweep", r["status"] == "passed",
                  r.get("error") or ("passed" if r["status"] == "passed" else f"failed: {r.get('failed_checks')}"),
                  r, time_s=r.get("seconds", 0.0)) for r in rows]
    write_json(out / "sweep.json", summary)
    write_junit(out / "junit.xml", "sweep", cases)
    best = summary["recommendation"]
    verdict = (f"RECOMMEND {best['cell']} ({_f(best.get('tok_s'))} tok/s, {_f(best.get('speedup'))}x baseline, "
               f"accept {_f(best.get('accept_length'))})" if best else "NO CELL PASSED")
    header = ["cell", "status", "accept length", "tok/s", "baseline tok/s", "speedup", "quality", "lossless",
              "failed checks"]
    table = [[r["cell"], r["status"], _f(r.get("accept_length")), _f(r.get("tok_s")), _f(r.get("baseline_tok_s")),
              _f(r.get("speedup")), _f(r.get("quality")), r.get("lossless"), ", ".join(r.get("failed_checks") or [])
              or r.get("error", "")] for r in rows]
    write_html(out / "sweep.html", "Speculative-configuration sweep", verdict=verdict,
               summary={"cells": summary["cells"], "passed": summary["passed"], "baseline": summary["baseline"]},
               tables=[("Cells (one stream)", header, table)], images=images)
    (out / "sweep.md").write_text("| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n"
                                  + "".join("| " + " | ".join(str(x) for x in row) + " |\n" for row in table))


def _f(x: Any) -> str:
    return "-" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))


def _plots(cfg: SweepConfig, out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = cfg.plot_keys()
    if not keys:
        return []
    x_key, s_key = keys[0], (keys[1] if len(keys) > 1 else None)
    paths = []
    for metric, ylabel in (("accept_length", "accept length (tokens / verify step)"), ("tok_s", "output tok/s")):
        fig, ax = plt.subplots(figsize=(6, 4))
        series: dict[Any, list[tuple[Any, float, str]]] = {}
        for r in rows:
            if x_key not in r["settings"] or r.get(metric) is None:
                continue
            series.setdefault(r["settings"].get(s_key) if s_key else None, []).append(
                (r["settings"][x_key], r[metric], r["status"]))
        for s, pts in sorted(series.items(), key=lambda kv: str(kv[0])):
            pts.sort(key=lambda p: p[0])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{s_key}={s}" if s_key else metric)
            for x, y, st in pts:
                if st != "passed":
                    ax.scatter([x], [y], marker="x", color="red", s=80, zorder=3)
        if metric == "tok_s":
            base = [r["baseline_tok_s"] for r in rows if r.get("baseline_tok_s")]
            if base:
                ax.axhline(sum(base) / len(base), color="gray", linestyle="--", label="baseline (no spec)")
        ax.set_xlabel(x_key)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel} vs {x_key} (red x: failed the gate)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        p = out / f"{metric}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    return paths


def sweep_overrides(host: str | None) -> dict[str, Any]:
    """`make sweep HOST=embedded` keeps the embedded kind; HOST=url means the grid's endpoints."""
    if host in (None, "", "embedded"):
        return {}
    return {"baseline_url": host}


__all__ = ["SweepConfig", "load_sweep_config", "run_sweep", "sweep_overrides"]
