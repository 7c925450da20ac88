"""CLI for the SGLang patch series.

    python -m sglfleet.patches check [--version V] [--against V|--no-drift] [--json FILE]
        validate series + manifest, apply to sglang==V from PyPI with zero fuzz (scratch copy),
        then report drift against the newest sglang release (or --against V)
    python -m sglfleet.patches apply --root SITE_PACKAGES [--series-dir DIR]
        apply to an installed tree in place (what the image build runs); all-or-nothing
    python -m sglfleet.patches show [--series-dir DIR]
        list the series and print its sha256 (the image's provenance label)

Exit codes: 0 ok, 1 a patch does not apply cleanly (reject, fuzz, already applied), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from sglfleet import paths
from sglfleet.patches import (
    DEFAULT_CACHE,
    DEFAULT_VERSION,
    ApplyError,
    ApplyReport,
    PatchError,
    apply_series,
    drift,
    fetch_sglang,
    load_series,
    newest_release,
    series_dir_for,
)


def _series_dir(args: argparse.Namespace) -> Path:
    return Path(args.series_dir) if args.series_dir else series_dir_for(args.version)


def _print_apply(rep: ApplyReport, label: str) -> None:
    for r in rep.results:
        status = "ok" if r.ok else f"FAILED: {r.problem}"
        extra = f" (offsets: {'; '.join(r.offsets)})" if r.offsets and r.ok else ""
        print(f"  {r.name}: {status}{extra}")
        if not r.ok and r.output:
            print("    " + r.output.replace("\n", "\n    "))
    if not rep.results:
        print("  (series is empty)")
    print(f"{label}: {'applied cleanly' if rep.ok else 'DOES NOT APPLY'} (series sha256 {rep.series_sha256})")


def cmd_show(args: argparse.Namespace) -> int:
    series = load_series(_series_dir(args))
    for p in series.patches:
        print(f"{p.name}\t{p.entry.purpose}")
    print(f"sha256 {series.sha256}")
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    series = load_series(_series_dir(args))
    rep = apply_series(series, Path(args.root), dry_run=args.dry_run)
    _print_apply(rep, f"sglang {series.version} series -> {args.root}")
    if args.record and rep.ok and not args.dry_run:
        rec = Path(args.record)
        rec.parent.mkdir(parents=True, exist_ok=True)
        rec.write_text(json.dumps({"sglang": series.version, "series_sha256": series.sha256,
                                   "patches": [p.name for p in series.patches]}, indent=2) + "\n")
    if not rep.ok:
        raise ApplyError(f"patch series for sglang {series.version} does not apply with zero fuzz")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    series = load_series(_series_dir(args))
    if series.unlisted:
        raise PatchError(f"{series.directory}: patch files not listed in series: {', '.join(series.unlisted)}")
    root = paths.CHECKOUT_ROOT  # the tests a manifest names are in a checkout only
    missing_tests = sorted({t for p in series.patches for t in p.entry.test_paths
                            if root is not None and not (root / t).is_file()})
    if missing_tests:
        raise PatchError(f"manifest names tests that do not exist: {', '.join(missing_tests)}")
    cache = Path(args.cache)
    root = fetch_sglang(series.version, cache)
    print(f"sglang {series.version} sources from PyPI: {root}")
    rep = apply_series(series, root, dry_run=True)
    _print_apply(rep, f"pinned sglang {series.version}")
    result: dict = {"pinned": series.version, "series_sha256": series.sha256,
                    "apply": [asdict(r) for r in rep.results], "ok": rep.ok}
    if rep.ok and not args.no_drift:
        newest = args.against or newest_release()
        if newest == series.version:
            print(f"drift: {newest} is the newest sglang release; nothing to compare")
            result["drift"] = {"newest": newest, "clean": True, "same_as_pinned": True}
        else:
            d = drift(series, newest, cache)
            print(f"drift against sglang {newest}:")
            for r in d.results:
                state = "applies" if r.ok else f"FAILS ({r.problem})"
                offs = f", offsets: {'; '.join(r.offsets)}" if r.offsets else ""
                print(f"  {r.name}: {state}{offs}")
            not_reached = len(series.patches) - len(d.results)
            if not_reached:
                print(f"  ({not_reached} later patch(es) not tried after the first failure)")
            if d.changed_files:
                print("  upstream changed files the series touches: " + ", ".join(d.changed_files))
            print(f"drift: {'none' if d.clean else 'YES, rebase the series before moving the pin'}")
            result["drift"] = {"newest": newest, "clean": d.clean, "changed_files": d.changed_files,
                               "apply": [asdict(r) for r in d.results]}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"patches check finished in {time.monotonic() - t0:.1f} s")
    if not rep.ok:
        raise ApplyError(f"patch series for sglang {series.version} does not apply with zero fuzz")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglfleet.patches", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--version", default=DEFAULT_VERSION, help="pinned sglang version (default %(default)s)")
    common.add_argument("--series-dir", help="series directory (default patches/sglang-<version>)")
    c = sub.add_parser("check", parents=[common], help="apply to PyPI sources with zero fuzz; report drift")
    c.add_argument("--against", help="compare with this release instead of the newest on PyPI")
    c.add_argument("--no-drift", action="store_true", help="skip the drift report")
    c.add_argument("--cache", default=str(DEFAULT_CACHE), help="download/unpack cache (default %(default)s)")
    c.add_argument("--json", help="write the result as JSON here")
    a = sub.add_parser("apply", parents=[common], help="apply in place to a tree containing sglang/")
    a.add_argument("--root", required=True, help="directory that contains the sglang/ package")
    a.add_argument("--dry-run", action="store_true")
    a.add_argument("--record", help="write a JSON record (version, sha256, patches) here on success")
    sub.add_parser("show", parents=[common], help="list the series and its sha256")
    args = ap.parse_args(argv)
    try:
        return {"check": cmd_check, "apply": cmd_apply, "show": cmd_show}[args.cmd](args)
    except PatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
