"""HTML reports (through pipeline.reports) and matplotlib plots for runs and capacity searches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sglfleet.pipeline.reports import write_html

_METRICS = (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2e_ms"))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def _latency_table(summary: dict[str, Any]) -> tuple[str, list[str], list[list[Any]]]:
    rows = []
    for label, key in _METRICS:
        d = summary.get(key) or {}
        rows.append([label, d.get("count"), _fmt(d.get("mean")), _fmt(d.get("p50")), _fmt(d.get("p90")),
                     _fmt(d.get("p95")), _fmt(d.get("p99")), _fmt(d.get("max"))])
    return ("Latency (ms)", ["metric", "samples", "mean", "p50", "p90", "p95", "p99", "max"], rows)


def write_run_report(out: Path, summary: dict[str, Any]) -> Path:
    """summary.html for one run (Locust's own report is locust.html beside it)."""
    thr = summary["throughput"]
    verdict = "PASS: SLOs met" if summary["slo"]["met"] else "FAIL: SLOs not met"
    head = {
        "host": summary["host"], "model": summary["model"], "load": summary["load"],
        "processes": summary["processes"], "stop reason": summary["stop_reason"],
        "requests": summary["requests"], "error rate": summary["error_rate"],
        "requests/s": thr["requests_per_s"], "output tok/s": thr["output_tok_per_s"],
        "goodput (req/s meeting SLO)": thr["goodput_requests_per_s"], "lengths": summary["lengths"],
        "length source": summary["length_source"], "Locust report": "locust.html",
    }
    slo_rows = [[k, c.get("value_ms", c.get("value")), c.get("slo_ms", c.get("max")), "ok" if c["ok"] else "FAIL"]
                for k, c in summary["slo"]["checks"].items()]
    return write_html(out / "summary.html", "Load test", verdict, head,
                      tables=[_latency_table(summary), ("SLO checks", ["check", "value", "limit", "result"],
                                                        slo_rows)])


def plot_capacity(out: Path, result: dict[str, Any]) -> list[Path]:
    """latency.png (TTFT/ITL percentiles vs load, SLOs, knee) and throughput.png (req/s, goodput, tok/s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted((s for s in result["steps"] if s.get("summary", {}).get("measured")), key=lambda s: s["load"])
    xs = [s["load"] for s in steps]
    knee = result["capacity"]
    fail = result["first_failing"]
    slo = result["slo"]
    xlabel = "concurrent users" if result["mode"] == "users" else "offered rate (req/s)"
    paths = []

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for pct, style in (("p50", ":"), ("p95", "-"), ("p99", "--")):
        ax1.plot(xs, [s["summary"]["ttft_ms"][pct] for s in steps], style, marker="o", label=f"TTFT {pct}")
        ax2.plot(xs, [s["summary"]["itl_ms"][pct] for s in steps], style, marker="o", label=f"ITL {pct}")
    ax1.axhline(slo["ttft_p95_ms"], color="red", lw=1, label="TTFT p95 SLO")
    ax2.axhline(slo["itl_p95_ms"], color="red", lw=1, label="ITL p95 SLO")
    for ax, title in ((ax1, "Time to first token"), (ax2, "Inter-token latency")):
        if knee is not None:
            ax.axvline(knee, color="green", ls="--", lw=1.2, label=f"capacity {knee:g}")
        if fail is not None:
            ax.axvline(fail, color="grey", ls=":", lw=1, label=f"first failing {fail:g}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "latency.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(xs, [s["summary"]["throughput"]["requests_per_s"] for s in steps], marker="o", label="requests/s")
    ax.plot(xs, [s["summary"]["throughput"]["goodput_requests_per_s"] for s in steps], marker="s",
            label="goodput (req/s meeting SLO)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("requests/s")
    ax3 = ax.twinx()
    ax3.plot(xs, [s["summary"]["throughput"]["output_tok_per_s"] for s in steps], color="purple", marker="^",
             ls="--", label="output tok/s")
    ax3.set_ylabel("tokens/s")
    if knee is not None:
        ax.axvline(knee, color="green", ls="--", lw=1.2, label=f"capacity {knee:g}")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax3.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    ax.set_title("Throughput against load")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / "throughput.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def write_capacity_report(out: Path, result: dict[str, Any], images: list[Path]) -> Path:
    knee = result["capacity"]
    verdict = (f"PASS: capacity {knee:g} {result['mode']} meets the SLOs" if knee is not None
               else "FAIL: even the smallest load misses the SLOs")
    head = {"host": result["host"], "model": result["model"], "mode": result["mode"], "SLO": result["slo"],
            "capacity": knee, "first failing load": result["first_failing"],
            "goodput at capacity (req/s)": result.get("goodput_at_capacity"),
            "complete": result["complete"], "steps run": len(result["steps"]), "wall s": result["wall_s"]}
    rows = []
    for s in result["steps"]:
        sm = s.get("summary") or {}
        thr = sm.get("throughput") or {}
        rows.append([s["index"], s["phase"], s["load"], "yes" if s["passed"] else "no", s["stop_reason"],
                     (sm.get("requests") or {}).get("total"), _fmt((sm.get("ttft_ms") or {}).get("p95")),
                     _fmt((sm.get("itl_ms") or {}).get("p95")), sm.get("error_rate"), thr.get("requests_per_s"),
                     thr.get("goodput_requests_per_s"), thr.get("output_tok_per_s"), s["why"]])
    table = ("Steps", ["#", "phase", "load", "meets SLO", "stop", "requests", "TTFT p95", "ITL p95", "error rate",
                       "req/s", "goodput", "tok/s", "why"], rows)
    return write_html(out / "capacity.html", "Capacity search", verdict, head, images=images, tables=[table])
