"""python -m testbed.corruptible serve --port P [--fault F] [--budget B] [--topk K] [--target-only] [--threads N]

Exit codes: 0 after a clean stop, 2 for bad arguments (one `error:` line)."""

from __future__ import annotations

import argparse
import os
import sys

FAULT_NAMES = ("mask_width", "rope_offset", "stale_kv", "foreign_kv", "row_stride", "no_residual",
               "verify_temperature", "heldout_a", "heldout_b", "stop_step_end", "row_params", "shared_rng",
               "step_rng_replay", "heldout_c", "heldout_d", "heldout_e")  # engine.FAULTS, kept
# here too so that argument parsing needs no numpy import (BLAS threads are set before numpy loads)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m testbed.corruptible", description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    s = sub.add_parser("serve", help="serve the engine over an OpenAI-compatible HTTP API")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--fault", choices=FAULT_NAMES,
                   help="inject one fault: a verify-pass fault, or a sampler fault only T>0 shows (default: none)")
    s.add_argument("--budget", type=int, help="drafted nodes per verify pass (w = budget + 1)")
    s.add_argument("--topk", type=int, help="children per tree node at most")
    s.add_argument("--target-only", action="store_true", help="no speculation: the target-only baseline")
    s.add_argument("--threads", type=int, default=1,
                   help="BLAS threads (default 1: on shared cores more threads spin and run many times slower)")
    s.add_argument("--n-ctx", type=int)
    args = ap.parse_args(argv)
    if not 1 <= args.port <= 65535:
        ap.error(f"--port must be within 1..65535, got {args.port}")
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    from sglfleet.pipeline.config import build_model
    from sglfleet.pipeline.errors import UsageError
    from testbed.corruptible.engine import EngineConfig

    values = {k: v for k, v in {"fault": args.fault, "budget": args.budget, "topk": args.topk,
                                "n_ctx": args.n_ctx}.items() if v is not None}
    if args.target_only:
        values["speculative"] = False
    try:
        cfg = build_model(EngineConfig, values, "command line")
        from testbed.corruptible.server import serve

        serve(cfg, args.host, args.port)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
