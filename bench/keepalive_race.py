"""The router's upstream errors without a client error: a pooled connection the server closed at its keep-alive.

docs/rollout.md's open item: sglang-router counts an upstream error or two in `make demo` (its log: `Failed to send
typed request ... error sending request`) while no client sees one. The candidate: the router keeps idle upstream
connections in its pool for far longer than the server keeps them open (llama.cpp's HTTP server, like SGLang's
uvicorn at its default `SGLANG_TIMEOUT_KEEP_ALIVE`, closes an idle connection after 5 s), so a request sent on a
pooled connection in the instant the server closes it fails on the wire, and the router retries it elsewhere.

This puts one sglang-router (round robin, the product's command line: sglfleet.rollout.router.command) in front of
one server and sends bursts of `--burst` concurrent chat requests, each burst `gap` seconds after the previous one
answered, for every gap of the grid (`--reps` each). Per burst: the clients' status codes and the router's new
`Failed to send` log lines. Servers (`--servers`, comma separated):

  embedded       the embedded target (llama.cpp's server, the test bed's engine): keep-alive 5 s, fixed
  uvicorn-S      a small OpenAI-shaped app on uvicorn, SGLang's HTTP server, with timeout_keep_alive=S seconds

`--pool-probe`: also watches how long the router keeps idle upstream connections (for a uvicorn server whose
keep-alive is over 60 s: the established connections to it counted once a second for `--probe-s` after a burst;
`router_pool_idle_s` is the last second all of them were still open, whoever closed them then).

    python bench/keepalive_race.py --servers embedded,uvicorn-5,uvicorn-65 --out docs/results/keepalive-race-X.json

Exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import re
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.history import raw_header  # noqa: E402
from testbed.childserver import ChildServer  # noqa: E402

FAILED = "Failed to send"
BODY = {"model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0}


def app() -> Any:
    """The OpenAI-shaped app the uvicorn server runs: what the router asks a worker (health, models, chat)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({})

    async def models(_: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(_: Request) -> JSONResponse:
        return JSONResponse({"id": "c", "object": "chat.completion", "model": "m",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    return Starlette(routes=[Route("/health", health), Route("/v1/models", models),
                             Route("/v1/chat/completions", chat, methods=["POST"])])


class Uvicorn(ChildServer):
    """The app on uvicorn in a child process (`serve` mode of this script) on 127.0.0.1:port: the test bed's
    ChildServer life cycle (ready on /health, stopped with its process group)."""

    label = "uvicorn"
    ready_timeout_s = 30.0

    def __init__(self, port: int, keep_alive: int, log: Path) -> None:
        super().__init__(port, log)
        self.keep_alive = keep_alive

    def command(self) -> list[str]:
        return [sys.executable, __file__, "serve", "--port", str(self.port), "--keep-alive", str(self.keep_alive)]


def grid(lo: float, hi: float, step: float) -> list[float]:
    n = round((hi - lo) / step)
    return [round(lo + i * step, 4) for i in range(n + 1)]


def established(port: int) -> int:
    """Established TCP connections to 127.0.0.1:port (the server's side of each)."""
    import psutil

    return sum(1 for c in psutil.net_connections("tcp")
               if c.status == "ESTABLISHED" and c.laddr and c.laddr.port == port)


def race(server: str, url: str, router_port: int, log: Path, gaps: list[float], reps: int, burst: int,
         probe_port: int | None, probe_s: float = 75.0) -> dict[str, Any]:
    import httpx

    from sglfleet.pipeline.procs import free_port
    from sglfleet.rollout.router import RouterProcess

    def failed() -> int:
        return log.read_text(encoding="utf-8", errors="replace").count(FAILED) if log.is_file() else 0

    rows: list[dict[str, Any]] = []
    with RouterProcess(router_port, [url], prometheus_port=free_port(), log=log) as r, \
            cf.ThreadPoolExecutor(burst) as pool, ExitStack() as stack:
        clients = [stack.enter_context(httpx.Client(timeout=60)) for _ in range(burst)]

        def one_burst() -> list[int]:
            futs = [pool.submit(lambda c: c.post(r.url + "/v1/chat/completions", json=BODY).status_code, c)
                    for c in clients]
            return sorted(f.result() for f in futs)

        time.sleep(3)  # the router's first health checks
        one_burst()
        before_all = failed()
        for n, g in enumerate(gaps, 1):
            for _ in range(reps):
                time.sleep(g)
                b = failed()
                codes = one_burst()
                time.sleep(0.2)  # the router's log line lands
                rows.append({"gap_s": g, "codes": codes, "router_failed_sends": failed() - b})
                one_burst()  # the next gap counts from here: every pooled connection fresh
            print(f"[{server}] gap {g:.3f} s ({n}/{len(gaps)}): router failed sends so far "
                  f"{failed() - before_all}", flush=True)
        probe = None
        if probe_port is not None:
            one_burst()
            t0, series = time.monotonic(), []
            while time.monotonic() - t0 < probe_s:
                series.append((round(time.monotonic() - t0, 1), established(probe_port)))
                time.sleep(1)
            open_at = [t for t, n in series if n >= burst]
            probe = {"established_each_second": series,
                     "router_pool_idle_s": max(open_at) if open_at else None}
    sent = sum(len(x["codes"]) for x in rows)
    return {"server": server, "bursts": len(rows), "client_requests": sent,
            "client_errors": sum(1 for x in rows for c in x["codes"] if c != 200),
            "router_failed_sends": sum(x["router_failed_sends"] for x in rows),
            "bursts_with_failed_sends": sum(1 for x in rows if x["router_failed_sends"]),
            "hit_gaps_s": sorted({x["gap_s"] for x in rows if x["router_failed_sends"]}),
            "rows": rows, "pool_probe": probe}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        sp = argparse.ArgumentParser()
        sp.add_argument("serve")
        sp.add_argument("--port", type=int, required=True)
        sp.add_argument("--keep-alive", type=int, required=True)
        s = sp.parse_args(args)
        import uvicorn

        uvicorn.run(app(), host="127.0.0.1", port=s.port, log_level="warning", timeout_keep_alive=s.keep_alive)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="embedded,uvicorn-5,uvicorn-65")
    ap.add_argument("--lo", type=float, default=4.990)
    ap.add_argument("--hi", type=float, default=5.012)
    ap.add_argument("--step", type=float, default=0.001)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--burst", type=int, default=4)
    ap.add_argument("--pool-probe", action="store_true")
    ap.add_argument("--probe-s", type=float, default=75.0, help="how long --pool-probe watches")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(args)
    kinds = [s for s in a.servers.split(",") if s]
    bad = [s for s in kinds if s != "embedded" and not re.fullmatch(r"uvicorn-\d+", s)]
    if bad or not kinds or a.step <= 0 or a.hi < a.lo or a.lo <= 0 or a.reps < 1 or a.burst < 1 or a.probe_s <= 0:
        print(f"error: bad arguments (servers {bad or kinds}; the grid needs 0 < lo <= hi, step > 0; reps, burst >= 1)",
              file=sys.stderr)
        return 2
    from sglfleet.pipeline.embedded import EmbeddedConfig, EmbeddedServer
    from sglfleet.pipeline.procs import free_port

    gaps = grid(a.lo, a.hi, a.step)
    out: dict[str, Any] = {**raw_header("bench/keepalive_race.py", args), "gaps_s": gaps, "reps": a.reps,
                           "burst": a.burst, "results": []}
    tmp = Path(tempfile.mkdtemp(prefix="keepalive-race-"))
    for kind in kinds:
        port = free_port()
        if kind == "embedded":
            server: Any = EmbeddedServer(EmbeddedConfig(port=port), tmp / kind)
        else:
            server = Uvicorn(port, int(kind.split("-")[1]), tmp / f"{kind}.log")
        with server as srv:
            probe = port if a.pool_probe and kind.startswith("uvicorn-") and int(kind.split("-")[1]) > 60 else None
            res = race(kind, srv.url, free_port(), tmp / f"router-{kind}.log", gaps, a.reps, a.burst, probe,
                       a.probe_s)
        out["results"].append(res)
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        print(f"[{kind}] {res['router_failed_sends']} router failed sends in {res['bursts']} bursts "
              f"({res['client_requests']} client requests, {res['client_errors']} client errors); "
              f"gaps hit: {res['hit_gaps_s']}", flush=True)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
