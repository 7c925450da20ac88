"""CLI: build / inspect SGLang images.

    python -m sglfleet.images build --target pcie|nvlink [--profile ci|production | --config FILE]
                           [--push REGISTRY/REPO] [--rc N] [--arch-list "10.3a"] [--no-cache] [--json FILE]
    python -m sglfleet.images inspect IMAGE       labels + /opt/provenance of a built image
    python -m sglfleet.images targets             the targets and their FlashInfer arch lists

Exit codes: 0 ok, 1 build/push failed, 2 bad input (unknown target, bad config, no engine).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from sglfleet.images.build import build, connect
from sglfleet.images.config import TARGETS, load_image_config
from sglfleet.pipeline.errors import UsageError, cli_main


def cmd_build(args: argparse.Namespace) -> int:
    if args.target not in TARGETS:
        raise UsageError(f"unknown target '{args.target}' (known: {', '.join(TARGETS)})")
    overrides: dict = {"target": args.target}
    if args.arch_list:
        overrides["arch_list"] = args.arch_list
    if args.base_image:
        overrides["base_image"] = args.base_image
    if args.name:
        overrides["name"] = args.name
    if args.build_target:
        overrides["build_target"] = args.build_target
    cfg = load_image_config(args.profile, args.config, overrides)
    res = build(cfg, push=args.push or None, rc=args.rc, nocache=args.no_cache)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({**asdict(res), "config": cfg.model_dump()}, indent=2) + "\n")
    print(res.tags[0] if not res.pushed else f"{res.pushed[0]}@{res.digest}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    client = connect()
    try:
        img = client.images.get(args.image)
    except Exception as exc:  # docker.errors.ImageNotFound / APIError
        raise UsageError(f"no image {args.image}: {exc}") from None
    print(json.dumps(img.labels, indent=2, sort_keys=True))
    out = client.containers.run(args.image, ["sh", "-c", "for f in /opt/provenance/*; do echo \"== $f\"; "
                                             "head -c 4000 \"$f\"; echo; done"],
                                remove=True, network_mode="host")
    print(out.decode(errors="replace"))
    return 0


def cmd_targets(_: argparse.Namespace) -> int:
    for name, spec in TARGETS.items():
        print(f"{name}\t{spec.arch_list}\t{spec.description}")
    return 0


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglfleet.images", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (and push) an image with the Docker SDK")
    b.add_argument("--target", required=True, help=f"one of: {', '.join(TARGETS)}")
    b.add_argument("--profile", help="images/profiles/<name>.yaml (ci, production)")
    b.add_argument("--config", help="a YAML file with ImageConfig fields")
    b.add_argument("--push", default="", help="registry/repo to push to, e.g. 127.0.0.1:5000/sglang-fleet")
    b.add_argument("--rc", type=int, help="release-candidate number (default: next free)")
    b.add_argument("--arch-list", help="override FlashInfer arch list (must keep the target's primary arch)")
    b.add_argument("--base-image", help="override the base image")
    b.add_argument("--name", help="image name when not pushing (default sglang-fleet)")
    b.add_argument("--build-target", choices=["toolchain", "sglang", "jit", "image"],
                   help="stop at this Dockerfile stage (default image); labels are checked for `image` only")
    b.add_argument("--no-cache", action="store_true")
    b.add_argument("--json", help="write the build result here")
    i = sub.add_parser("inspect", help="labels and provenance files of an image")
    i.add_argument("image")
    sub.add_parser("targets", help="list targets")
    args = ap.parse_args(argv)
    return {"build": cmd_build, "inspect": cmd_inspect, "targets": cmd_targets}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
