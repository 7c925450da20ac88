"""CLI: python -m sglfleet.rollout rollback|status|render|router (the deploy flow is `python -m sglfleet.flow
deploy`)."""

from __future__ import annotations

import argparse
import json
import sys

from sglfleet.pipeline.errors import EXIT_FAIL, EXIT_OK, cli_main
from sglfleet.rollout.config import load


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglfleet.rollout", description=__doc__)
    sub = ap.add_subparsers(dest="action", required=True)
    for name in ("rollback", "status", "render"):
        p = sub.add_parser(name)
        p.add_argument("--hosts", required=True, help="host, group (pcie, nvlink, all) or a,b list")
        p.add_argument("--inventory", help="inventory directory or file (default: rollout config)")
        p.add_argument("--config", help="YAML with a `rollout:` section")
        p.add_argument("--serial", help="rolling batch size (int or N%%)")
        if name == "rollback":
            p.add_argument("--check", action="store_true", help="check/diff mode: change nothing")
        if name == "render":
            p.add_argument("--image", default=None, help="REGISTRY/NAME:TAG")
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p = sub.add_parser("router", help="deploy (or stop) sglang-router on the inventory's sglang_router hosts")
    p.add_argument("--inventory", help="inventory directory or file (default: rollout config)")
    p.add_argument("--config", help="YAML with a `rollout:` section")
    p.add_argument("--stop", action="store_true", help="stop the router instead of deploying it")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    args = ap.parse_args(argv)

    overrides: dict[str, object] = {}
    if getattr(args, "inventory", None):
        overrides["inventory"] = args.inventory
    if getattr(args, "serial", None):
        overrides["serial"] = int(args.serial) if args.serial.isdigit() else args.serial
    cfg = load(args.config, overrides)

    from sglfleet.rollout import deploy as d

    if args.action == "router":
        from sglfleet.rollout.inventory import load_inventory

        res = d.router(cfg, load_inventory(d._abs(cfg.inventory)), state="stopped" if args.stop else "present")
        out = {"rc": res.rc, "state": res.state, "routers": res.routers, "errors": res.errors}
        if args.json:
            print(json.dumps(out, indent=2))
        for h, info in res.routers.items() if not args.stop else ():
            print(f"router {h}: {info.get('url')} ({info.get('fleet_group')}: {', '.join(info.get('workers') or [])})",
                  file=sys.stderr)
        if args.stop and res.ok:
            print(f"router stopped on {', '.join(res.routers)}", file=sys.stderr)
        for h, msgs in res.errors.items():
            print(f"router {h}: FAILED {'; '.join(msgs)[:600]}", file=sys.stderr)
        return EXIT_OK if res.ok else EXIT_FAIL
    if args.action == "rollback":
        rc, run_dir = d.rollback(cfg, args.hosts, check=args.check)
        if args.json:
            print((run_dir / "report.json").read_text())
        return rc
    if args.action == "render":
        from sglfleet.rollout.serve_args import check_serve_command

        rendered = d.render(cfg, args.hosts, args.image)
        for host, spec in sorted(rendered.items()):  # the DDTree rules deploy runs: bad input, exit 2, one line
            check_serve_command(host, [str(x) for x in ((spec or {}).get("command") or [])],
                                (spec or {}).get("env") or {})  # the host's env: its overlap opt-in
        print(json.dumps(rendered, indent=2))
        return EXIT_OK
    rc, hosts = d.status(cfg, args.hosts)
    if args.json:
        print(json.dumps(hosts, indent=2))
    else:
        cols = ("host", "fabric", "running_image", "healthy", "current", "previous", "endpoint")
        print("  ".join(f"{c:<12}" for c in cols))
        for row in hosts.values():
            line = "  ".join(f"{row.get(c, '')!s:<12}" for c in cols)
            print(line + ("" if row.get("reachable") else "  UNREACHABLE"))
    return rc if rc == EXIT_OK else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
