"""The embedded engine's decode speed by compute threads, alone and beside busy processes (issue 28).

    python bench/embedded_threads.py [--threads 1,2] [--hogs 0,1,2] [--tokens 64] [--repeats 2] [--out FILE.json]

For each thread count it starts the embedded model (SmolLM2-135M on llama.cpp, pipeline.embedded.EmbeddedServer)
once, then for each hog count starts that many busy-loop processes at nice 0 and sends the same greedy chat
request `--repeats` times: decode tok/s from llama.cpp's own timings (`timings.predicted_per_second`) and the
request's wall time, median over the repeats. llama.cpp's threads meet at a barrier after every op, so when the
machine has fewer free cores than threads, each op waits for the thread the scheduler preempted: this shows how
much that costs on the machine it runs on. The JSON carries the command, date and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "bench"))
from gate_under_load import HOG  # noqa: E402 - the same busy loop as the gate's load bench

from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer  # noqa: E402
from sglfleet.pipeline.procs import free_port as _free_port  # noqa: E402

PROMPT = "Write a short poem about the sea."


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return vals


def one_request(url: str, tokens: int, timeout_s: float) -> dict[str, Any]:
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/chat/completions", timeout=timeout_s,
                   json={"messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
                         "temperature": 0})
    r.raise_for_status()
    body = r.json()
    return {"wall_s": round(time.monotonic() - t0, 3), "completion_tokens": body["usage"]["completion_tokens"],
            "decode_tok_s": round(float(body["timings"]["predicted_per_second"]), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=_ints, default=[1, 2])
    ap.add_argument("--hogs", type=_ints, default=[0, 1, 2])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    ap.add_argument("--out", default=str(REPO / "docs" / "results" / f"embedded-threads-{time.strftime('%F')}.json"))
    a = ap.parse_args()
    if min(a.threads) < 1 or a.tokens < 1 or a.repeats < 1:
        print("error: --threads, --tokens and --repeats must be >= 1", file=sys.stderr)
        return 2
    doc: dict[str, Any] = {
        "command": "python bench/embedded_threads.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
                    "platform": platform.platform(), "python": platform.python_version()},
        "prompt": PROMPT, "tokens": a.tokens, "repeats": a.repeats, "cells": []}
    with tempfile.TemporaryDirectory(prefix="embedded-threads-") as tmp:
        for threads in a.threads:
            srv = EmbeddedServer(EmbeddedConfig(port=_free_port(), threads=threads), Path(tmp) / f"t{threads}").start()
            try:
                one_request(srv.url, 8, a.timeout)  # warm-up
                for hogs in a.hogs:
                    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
                    try:
                        time.sleep(1.0)
                        runs = [one_request(srv.url, a.tokens, a.timeout) for _ in range(a.repeats)]
                    finally:
                        for p in procs:
                            p.kill()
                            p.wait()
                    cell = {"threads": threads, "hogs": hogs, "runs": runs,
                            "decode_tok_s_median": statistics.median(r["decode_tok_s"] for r in runs),
                            "wall_s_median": statistics.median(r["wall_s"] for r in runs)}
                    doc["cells"].append(cell)
                    print(f"threads={threads} hogs={hogs}: {cell['decode_tok_s_median']:.1f} tok/s, "
                          f"{cell['wall_s_median']:.2f} s", flush=True)
                    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
            finally:
                srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
