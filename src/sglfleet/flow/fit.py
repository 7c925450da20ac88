"""Image <-> fleet: the image's labels, read from the registry (or the air-gapped tarball) before anything
changes, must fit every targeted host group: target (pcie = SM120, nvlink = SM103), FlashInfer arch,
sglang version and the patch series this repository holds for that version."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

from sglfleet.images.config import TARGETS
from sglfleet.patches import load_series, series_dir_for
from sglfleet.pipeline.errors import UsageError
from sglfleet.rollout.inventory import Inventory

LABEL_TARGET = "org.fleet.target"
LABEL_ARCH = "org.fleet.cuda.arch"
LABEL_SGLANG = "org.sglang.version"
LABEL_SERIES = "org.fleet.patch-series.sha256"
LABEL_ENGINE = "org.fleet.engine"


def series_sha(version: str) -> str:
    d = series_dir_for(version)
    if not d.is_dir():
        raise UsageError(f"no patch series for sglang {version} in this repository ({d}): cannot check the image")
    return load_series(d).sha256


def expected(hostvars: dict[str, Any]) -> dict[str, str]:
    """What a host's group requires of the image it runs."""
    fabric = str(hostvars.get("fabric", ""))
    engine = str(hostvars.get("serve_engine", "sglang"))
    out = {"fabric": fabric, "engine": engine}
    if engine == "sglang":
        version = str(hostvars.get("image_sglang_version") or "")
        if not version:
            raise UsageError("the inventory sets no image_sglang_version: cannot check the image against the fleet")
        out.update(sglang=version, series=series_sha(version), arch=TARGETS[fabric].required_arch
                   if fabric in TARGETS else "")
    return out


def mismatches(labels: dict[str, str], want: dict[str, str]) -> list[str]:
    """Human-readable reasons why an image with `labels` must not run on a host wanting `want`."""
    why: list[str] = []
    targets = [t.strip() for t in labels.get(LABEL_TARGET, "").split(",") if t.strip()]
    if not targets:
        why.append(f"the image has no {LABEL_TARGET} label (not built by `make image`)")
    elif want["fabric"] not in targets:
        why.append(f"built for {','.join(targets)}, the host group is {want['fabric']}")
    if want["engine"] == "sglang":
        archs = labels.get(LABEL_ARCH, "").split()
        if want.get("arch") and want["arch"] not in archs:
            why.append(f"FlashInfer arch {labels.get(LABEL_ARCH) or 'unlabelled'} lacks {want['arch']} "
                       f"(needed on {want['fabric']})")
        if labels.get(LABEL_SGLANG) != want["sglang"]:
            why.append(f"sglang {labels.get(LABEL_SGLANG) or 'unlabelled'}, the fleet runs {want['sglang']}")
        if labels.get(LABEL_SERIES) != want["series"]:
            got = (labels.get(LABEL_SERIES) or "unlabelled")[:12]
            why.append(f"patch series {got}, this repository's series for sglang {want['sglang']} is "
                       f"{want['series'][:12]}")
    elif labels.get(LABEL_ENGINE, "sglang") != want["engine"]:
        why.append(f"engine {labels.get(LABEL_ENGINE, 'sglang')}, the hosts run {want['engine']}")
    return why


def check(image: str, labels: dict[str, str], inv: Inventory, hosts: list[str]) -> dict[str, Any]:
    """Raise UsageError (one line) when the image does not fit any targeted host; else the check's record."""
    bad: dict[str, list[str]] = {}
    groups: dict[str, list[str]] = {}
    for h in hosts:
        want = expected(inv.hostvars.get(h, {}))
        reasons = mismatches(labels, want)
        key = "; ".join(reasons)
        if reasons:
            bad.setdefault(key, []).append(h)
        groups.setdefault(want["fabric"], []).append(h)
    if bad:
        parts = [f"{', '.join(hs)}: {why}" for why, hs in bad.items()]
        raise UsageError(f"image {image} does not fit the fleet, nothing was changed: " + " | ".join(parts))
    return {"image": image, "labels": {k: v for k, v in labels.items() if k.startswith(("org.fleet", "org.sglang"))},
            "groups": groups, "ok": True}


def tarball_labels(path: str | Path) -> dict[str, str]:
    """Labels of the image in a `docker save` tarball (its config JSON; no layer is read)."""
    try:
        with tarfile.open(path) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
            cfg = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
    except (tarfile.TarError, KeyError, ValueError, TypeError, OSError) as exc:
        raise UsageError(f"{path} is not a `docker save` image tarball ({type(exc).__name__})") from None
    return dict((cfg.get("config") or {}).get("Labels") or {})
