"""Speculative-configuration sweep: gate every cell of a grid, recommend the fastest that passed.

    python -m sglfleet.validation sweep --grid validation/grids/embedded-draft.yaml [--out DIR]
    make sweep HOST=embedded GRID=validation/grids/embedded-draft.yaml
    python -m sglfleet.validation sweep --grid validation/grids/sglang-smollm2.yaml     # on a GPU machine

A grid is a list of server configurations. Each cell is deployed (the embedded engine started with
the cell's settings, an SGLang server the sweep starts with them, or an endpoint that is already
serving it), then gated on everything that
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

from sglfleet.flow.sweep_sglang import (
    CELL_SETTINGS,
    EPHEMERAL_LOW,
    SGLangConfig,
    cell_command,
    cell_server,
    server_command,
)
from sglfleet.pipeline.config import StrictModel, format_validation_error, load_config
from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer
from sglfleet.pipeline.errors import PipelineError, UsageError
from sglfleet.pipeline.reports import Case, write_html, write_json, write_junit
from sglfleet.pipeline.server_proc import ServerProcess
from sglfleet.validation.config import GateConfig, load_gate_config

# Settings an SGLang DDTree / DFlash cell may carry (they become server arguments on deploy).
SGLANG_SETTINGS = {"budget", "topk", "block_size", "algorithm", "attention_backend", "cuda_graph"}


class Cell(StrictModel):
    name: str | None = None
    url: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)


class SweepConfig(StrictModel):
    kind: Literal["embedded", "endpoints", "sglang"] = "embedded"
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
    # sglang: the cartesian product of `axes` (CELL_SETTINGS), each an SGLang server the sweep starts
    sglang: SGLangConfig | None = None

    @model_validator(mode="after")
    def _shape(self) -> SweepConfig:
        if self.kind in ("embedded", "sglang") and not self.axes:
            raise ValueError(f"an {self.kind} sweep needs `axes` (setting -> list of values)")
        if self.kind == "sglang":
            self._sglang_shape()
        elif self.sglang is not None:
            raise ValueError(f"`sglang` is the section of the sglang kind, not of {self.kind}")
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

    def _sglang_shape(self) -> None:
        if self.sglang is None:
            raise ValueError("an sglang sweep needs an `sglang` section (model_path, draft_model_path, ...)")
        if self.cells:
            raise ValueError("an sglang sweep starts its cells from `axes`; `cells` is for the endpoints kind")
        if "port_base" in self.model_fields_set:
            raise ValueError("the sglang kind takes its ports from `sglang.port_base`")
        unknown = sorted(set(self.axes) - set(CELL_SETTINGS))
        if unknown:
            raise ValueError(f"unknown axis {unknown} for the sglang kind; known: {list(CELL_SETTINGS)}")
        n = 1 + len(self.expand())  # the baseline and every cell
        s = self.sglang
        if s.nccl_port_offset < n:
            raise ValueError(f"sglang.nccl_port_offset {s.nccl_port_offset} must be >= {n} (the servers' count) "
                             "so no --nccl-port is another server's --port")
        if s.port_base + s.nccl_port_offset + n > 65535:
            raise ValueError(f"sglang ports run past 65535: port_base {s.port_base}, {n} servers, "
                             f"nccl_port_offset {s.nccl_port_offset}")
        if s.port_base + s.nccl_port_offset + n > EPHEMERAL_LOW:
            raise ValueError(f"sglang NCCL ports reach {s.port_base + s.nccl_port_offset + n - 1} (port_base + "
                             f"nccl_port_offset + {n} servers): keep them below {EPHEMERAL_LOW}, where Linux "
                             "hands ports to outgoing connections and a server can lose its port between sglang's "
                             "check and its bind (EADDRINUSE)")

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


def _start_sglang(cfg: SweepConfig, cells: list[Cell], out: Path, stack: ExitStack,
                  servers: dict[int, ServerProcess], refused: dict[int, PipelineError], extra: dict[str, Any],
                  console: Console) -> str:
    """Render and check every cell's command (the DDTree rules, before anything starts), start the
    baseline (unless `baseline_url` names one) and, with `start: all`, every accepted cell at once;
    return the baseline URL. A refused cell or one that does not come up lands in `refused`."""
    s = cfg.sglang
    assert s is not None
    for i, cell in enumerate(cells):
        port = s.port_base + 1 + i
        try:
            servers[i] = cell_server(cell_command(s, cell.settings, port, cell_label(cell)), s, port,
                                     out / f"cell-{i:02d}", f"cell {cell_label(cell)}")
        except PipelineError as exc:
            refused[i] = exc
            console.print(f"[bold red]cell {cell_label(cell)} refused before start: {exc}")
    base: ServerProcess | None = None
    if not cfg.baseline_url:
        base = cell_server(server_command(s, s.port_base, None), s, s.port_base, out / "baseline", "baseline")
        extra["baseline_command"] = " ".join(base.command)
    if base is not None:
        stack.callback(base.stop)
        base.launch()
    if s.start == "all":
        for i, srv in list(servers.items()):
            stack.callback(srv.stop)
            try:
                srv.launch()
            except PipelineError as exc:  # its port is taken: that cell is an error row
                refused[i] = exc
    if base is not None:
        console.rule("baseline: SGLang without speculative decoding")
        base.wait_ready()
    if s.start == "all":
        console.rule(f"waiting for {len(servers)} SGLang cell servers (timeout {s.startup_timeout_s:g}s)")
        for i, srv in list(servers.items()):
            if i in refused:
                continue
            try:
                srv.wait_ready()
            except PipelineError as exc:
                refused[i] = exc
                console.print(f"[bold red]{exc}")
    return base.url if base is not None else str(cfg.baseline_url)


def _metric(case_list: list[Case], name: str, key: str) -> Any:
    for c in case_list:
        if c.name == name:
            return c.details.get(key)
    return None


def run_sweep(cfg: SweepConfig, out: Path, console: Console | None = None) -> dict[str, Any]:
    """Gate every cell; write sweep.json, junit.xml, sweep.html + plots; return the summary."""
    from sglfleet.validation.gate import run_gate

    console = console or Console(stderr=True)
    out.mkdir(parents=True, exist_ok=True)
    base_gate = load_gate_config(cfg.gate_config, cfg.gate) if cfg.gate_config else GateConfig(**cfg.gate)
    cells = cfg.expand()
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    with ExitStack() as stack:
        baseline_url = cfg.baseline_url
        if cfg.kind == "embedded":
            base_cfg = _embedded_cell_config({k: v for k, v in cfg.base.items() if k != "spec_type"} | {
                "spec_type": "none"}, {}, cfg.port_base)
            console.rule("baseline: embedded engine without speculative decoding")
            baseline_url = stack.enter_context(EmbeddedServer(base_cfg, out / "baseline")).url
        servers: dict[int, ServerProcess] = {}
        refused: dict[int, PipelineError] = {}
        if cfg.kind == "sglang":
            baseline_url = _start_sglang(cfg, cells, out, stack, servers, refused, extra, console)
        for i, cell in enumerate(cells):
            label = cell_label(cell)
            console.rule(f"cell {i + 1}/{len(cells)}: {label}")
            row: dict[str, Any] = {"cell": label, "settings": cell.settings, "status": "error"}
            if i in servers:
                row["command"] = " ".join(servers[i].command)
            t0 = time.perf_counter()
            try:
                gate_cfg = base_gate.model_copy(update={"baseline_url": baseline_url})
                if cfg.kind == "embedded":
                    ecfg = _embedded_cell_config(cell.settings, cfg.base, cfg.port_base + 1 + i)
                    with EmbeddedServer(ecfg, out / f"cell-{i:02d}") as srv:
                        res = run_gate(srv.url, gate_cfg, out_dir=out / f"cell-{i:02d}", console=console)
                elif cfg.kind == "sglang":
                    if i in refused:
                        raise refused[i]
                    with servers[i] as sg:  # started already (start: all) or now (one_at_a_time)
                        row["startup_s"] = round(sg.ready_s or 0.0, 1)
                        res = run_gate(sg.url, gate_cfg, out_dir=out / f"cell-{i:02d}", console=console)
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
               "advice": advise(rows, best), "baseline": baseline_url, **extra, "rows": rows}
    _write(cfg, out, summary, rows)
    return summary


def _only_speed(r: dict[str, Any]) -> bool:
    failed = r.get("failed_checks") or []
    return r["status"] == "failed" and bool(failed) and all(c.startswith("speed_vs_baseline") for c in failed)


def advise(rows: list[dict[str, Any]], best: dict[str, Any] | None) -> str:
    """One sentence an operator can act on: the recommended cell; or, when every cell that is correct
    lost only on speed, to serve without speculative decoding; or that nothing is safe to serve."""
    if best is not None:
        return (f"serve {best['cell']}: the fastest cell that passed every check ({_f(best.get('tok_s'))} tok/s, "
                f"{_f(best.get('speedup'))}x the baseline)")
    slow = [r for r in rows if _only_speed(r)]
    if slow:
        top = max(slow, key=lambda r: r.get("tok_s") or 0.0)
        return (f"serve without speculative decoding: {len(slow)} cell(s) passed every check but speed, the "
                f"fastest of them ({top['cell']}) at {_f(top.get('speedup'))}x the baseline")
    return "no cell is safe to serve: every cell failed a correctness check (see failed checks)"


def _write(cfg: SweepConfig, out: Path, summary: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    images = _plots(cfg, out, rows)
    cases = [Case(r["cell"], "sweep", r["status"] == "passed",
                  r.get("error") or ("passed" if r["status"] == "passed" else f"failed: {r.get('failed_checks')}"),
                  r, time_s=r.get("seconds", 0.0)) for r in rows]
    write_json(out / "sweep.json", summary)
    write_junit(out / "junit.xml", "sweep", cases)
    best = summary["recommendation"]
    verdict = (f"RECOMMEND {best['cell']} ({_f(best.get('tok_s'))} tok/s, {_f(best.get('speedup'))}x baseline, "
               f"accept {_f(best.get('accept_length'))})" if best else "NO CELL PASSED: " + summary["advice"])
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
