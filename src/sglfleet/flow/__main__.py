"""CLI: python -m sglfleet.flow deploy|main|demo (rollback / status / render: python -m sglfleet.rollout).

    python -m sglfleet.flow deploy --hosts HOST_OR_GROUP --image REGISTRY/NAME:TAG [--inventory DIR] [--check]
                          [--image-tarball FILE] [--no-gate] [--no-loadtest] [--gate-config F] [--baseline F]
                          [--loadtest-config F] [--config deployment.yaml] [-e KEY=VALUE] [--target-only]
                          [--api-key-file F | --api-key-env NAME]   the endpoints' key, gate + load test
    python -m sglfleet.flow main   [--out DIR]       the main job on the embedded target (no root, no Docker)
    python -m sglfleet.flow demo   [--out DIR]       the real path on an embedded fleet on this machine (root)

Exit codes: 0 promoted / deployed / unchanged, 1 a stage failed (changed hosts rolled back), 2 bad input
(nothing changed).
"""

from __future__ import annotations

import argparse
import json
import sys

from sglfleet.pipeline.errors import EXIT_OK, UsageError, cli_main


def _kv(items: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise UsageError(f"--extra-var expects KEY=VALUE, got '{it}'")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglfleet.flow", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="action", required=True)
    p = sub.add_parser("deploy", help="deploy -> gate -> load test -> promote or roll back")
    p.add_argument("--hosts", required=True, help="host, group (pcie, nvlink, all) or a,b list")
    p.add_argument("--image", required=True, help="REGISTRY/NAME:TAG")
    p.add_argument("--inventory", help="inventory directory or file (default: rollout config)")
    p.add_argument("--config", help="deployment YAML (`rollout:` section)")
    p.add_argument("--serial", help="rolling batch size (int or N%%)")
    p.add_argument("--check", action="store_true", help="check/diff mode: change nothing")
    p.add_argument("--image-tarball", help="air-gapped: `docker save` tarball to copy and load instead of pulling")
    p.add_argument("--no-gate", action="store_true", help="deploy only: no gate, no load test, no promotion")
    p.add_argument("--no-loadtest", action="store_true", help="promote on the gate alone")
    p.add_argument("--gate-config")
    p.add_argument("--baseline", help="lossless baseline JSON (record-baseline) for the gate's lossless.baseline")
    p.add_argument("--target-only", action="store_true",
                   help="serve IMAGE without speculative decoding, no gate, no promotion: the deployment a "
                        "lossless baseline is recorded from")
    p.add_argument("--loadtest-config", help="YAML whose `loadtest:` section holds the deployment's SLOs")
    p.add_argument("--min-capacity", type=float, help="users that must meet the SLOs (default 1)")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--api-key-file", help="file holding the endpoints' API key, for the gate and the load test")
    key.add_argument("--api-key-env", help="environment variable holding the endpoints' API key")
    p.add_argument("--extra-var", "-e", action="append", default=[], help="KEY=VALUE for the playbook")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    for name in ("main", "demo"):
        q = sub.add_parser(name)
        q.add_argument("--out", help="run directory")
        if name == "main":
            q.add_argument("--port", type=int, default=18080)
            q.add_argument("--skip-loadtest", action="store_true")
    args = ap.parse_args(argv)

    if args.action == "main":
        from sglfleet.flow import mainjob

        return mainjob.run(args.out, args.port, skip_loadtest=args.skip_loadtest)
    if args.action == "demo":
        from sglfleet.flow import demo

        return demo.run(args.out)

    from sglfleet.flow import promote
    from sglfleet.rollout.config import load

    overrides: dict[str, object] = {}
    extra_vars = _kv(args.extra_var)
    if args.target_only:
        if args.baseline or args.gate_config or args.loadtest_config or args.no_loadtest:
            raise UsageError("--target-only deploys without gate and load test: drop --baseline, --gate-config, "
                             "--loadtest-config and --no-loadtest")
        args.no_gate = True
        extra_vars["serve_spec_algorithm"] = "NONE"
        extra_vars["serve_spec_ddtree_overlap"] = False  # the DDTree opt-in needs DDTree (preflight refuses it)
    if args.inventory:
        overrides["inventory"] = args.inventory
    if args.serial:
        overrides["serial"] = int(args.serial) if args.serial.isdigit() else args.serial
    if args.no_gate:
        overrides["gate"] = False
    if args.no_loadtest:
        overrides["loadtest"] = False
    if args.gate_config:
        overrides["gate_config"] = args.gate_config
    if args.baseline:
        overrides["gate_baseline"] = args.baseline
    if args.loadtest_config:
        overrides["loadtest_config"] = args.loadtest_config
    if args.api_key_file or args.api_key_env:  # one source: the command line's replaces the file's
        overrides["api_key_file"], overrides["api_key_env"] = args.api_key_file, args.api_key_env
    if args.min_capacity is not None:
        overrides["min_capacity"] = args.min_capacity
    cfg = load(args.config, overrides)
    rc, run_dir = promote.deploy(cfg, args.hosts, args.image, check=args.check, image_tarball=args.image_tarball,
                                 extra_vars=extra_vars)
    if args.json:
        print((run_dir / "report.json").read_text())
    return rc if rc is not None else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
