"""CLI: python -m rollout deploy|rollback|status|promote|render|build-cpu-image (see rollout/__init__.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.errors import EXIT_FAIL, EXIT_OK, UsageError, cli_main
from rollout import registry
from rollout.config import load


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
    ap = argparse.ArgumentParser(prog="python -m rollout", description=__doc__)
    sub = ap.add_subparsers(dest="action", required=True)
    for name in ("deploy", "rollback", "status", "render"):
        p = sub.add_parser(name)
        p.add_argument("--hosts", required=True, help="host, group (pcie, nvlink, all) or a,b list")
        p.add_argument("--inventory", help="inventory directory or file (default: rollout config)")
        p.add_argument("--config", help="YAML with a `rollout:` section")
        p.add_argument("--serial", help="rolling batch size (int or N%%)")
        if name in ("deploy", "rollback"):
            p.add_argument("--check", action="store_true", help="check/diff mode: change nothing")
        if name in ("deploy", "render"):
            p.add_argument("--image", required=name == "deploy", default=None, help="REGISTRY/NAME:TAG")
        if name == "deploy":
            p.add_argument("--image-tarball", help="air-gapped: docker save tarball to load instead of pulling")
            p.add_argument("--no-gate", action="store_true")
            p.add_argument("--gate-config")
            p.add_argument("--extra-var", "-e", action="append", default=[], help="KEY=VALUE for the playbook")
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p = sub.add_parser("promote")
    p.add_argument("--image", required=True)
    p.add_argument("--report-dir", required=True, help="gate report directory kept beside the promoted image")
    p.add_argument("--config")
    p = sub.add_parser("build-cpu-image")
    p.add_argument("--tag", required=True, help="REGISTRY/NAME:TAG to build and push")
    p.add_argument("--no-push", action="store_true")
    args = ap.parse_args(argv)

    if args.action == "build-cpu-image":
        from rollout import cpuimage

        print(json.dumps(cpuimage.build(args.tag, push=not args.no_push)))
        return EXIT_OK
    overrides: dict[str, object] = {}
    if getattr(args, "inventory", None):
        overrides["inventory"] = args.inventory
    if getattr(args, "serial", None):
        overrides["serial"] = int(args.serial) if args.serial.isdigit() else args.serial
    if getattr(args, "no_gate", False):
        overrides["gate"] = False
    if getattr(args, "gate_config", None):
        overrides["gate_config"] = args.gate_config
    cfg = load(args.config, overrides)

    from rollout import deploy as d

    if args.action == "promote":
        ref = registry.parse_image(args.image)
        if not Path(args.report_dir).is_dir():
            raise UsageError(f"report dir not found: {args.report_dir}")
        info = registry.promote(ref, cfg.promoted_tag, Path(args.report_dir), registry.credentials(cfg.registry_auth),
                                cfg.registry_timeout_s)
        print(json.dumps(info, indent=2))
        return EXIT_OK
    if args.action == "deploy":
        rc, run_dir = d.deploy(cfg, args.hosts, args.image, check=args.check, image_tarball=args.image_tarball,
                               extra_vars=_kv(args.extra_var))
        if args.json:
            print((run_dir / "report.json").read_text())
        return rc
    if args.action == "rollback":
        rc, run_dir = d.rollback(cfg, args.hosts, check=args.check)
        if args.json:
            print((run_dir / "report.json").read_text())
        return rc
    if args.action == "render":
        print(json.dumps(d.render(cfg, args.hosts, args.image), indent=2))
        return EXIT_OK
    rc, out = d.status(cfg, args.hosts)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        cols = ("host", "fabric", "running_image", "healthy", "current", "previous", "endpoint")
        print("  ".join(f"{c:<12}" for c in cols))
        for row in out.values():
            line = "  ".join(f"{row.get(c, '')!s:<12}" for c in cols)
            print(line + ("" if row.get("reachable") else "  UNREACHABLE"))
    return rc if rc == EXIT_OK else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
