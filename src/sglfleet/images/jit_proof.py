"""Build-time FlashInfer JIT proof, run inside the image build (no GPU needed to compile).

Compiles, with the image's nvcc and CUDA headers, for every arch in FLASHINFER_CUDA_ARCH_LIST:

* the sampling module (sampling.cu + renorm.cu include curand.h / curand_kernel.h) - proves the
  curand headers are on FlashInfer's JIT include path and that the link (-lcudart, -lcuda) works;
* the paged batch-prefill module a tree verify runs through (FlashInfer FA2 backend, custom mask:
  sglang's flashinfer backend passes the tree mask as `custom_mask` in TARGET_VERIFY).

scope=full builds whole modules into FlashInfer's JIT cache (FLASHINFER_WORKSPACE_BASE), so the
first request does not compile. scope=ci builds the sampling module fully and, for attention, only
the custom-mask paged kernel object (the kernel a tree verify executes), to fit a 2-core CI budget.

Exit 0 only if every requested object/module was produced; prints one JSON line per step and a
summary to $FI_PROOF_OUT (default /opt/provenance/flashinfer-jit.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MASK_CUSTOM = 2  # flashinfer MaskMode::kCustom


def _log(**kv: object) -> None:
    print(json.dumps(kv), flush=True)


def _ninja(build_dir: Path, targets: list[str]) -> None:
    jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
    cmd = ["ninja", "-C", str(build_dir), "-f", str(build_dir / "build.ninja"), "-j", jobs, *targets]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
        raise RuntimeError(f"ninja failed in {build_dir}:\n{tail}")


def _assert_up_to_date(build_dir: Path) -> None:
    """The cache must be complete: FlashInfer re-runs ninja on first use, which must find no work."""
    cmd = ["ninja", "-n", "-C", str(build_dir), "-f", str(build_dir / "build.ninja")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0 or "no work to do" not in out.stdout:
        raise RuntimeError(f"JIT cache in {build_dir} is not up to date; first use would recompile:\n"
                           f"{out.stdout[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scope", choices=["full", "ci"], default="full")
    ap.add_argument("--head-dims", default=os.environ.get("FI_HEAD_DIMS", "128"),
                    help="space/comma separated head dims for the prefill module")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--out", default=os.environ.get("FI_PROOF_OUT", "/opt/provenance/flashinfer-jit.json"))
    args = ap.parse_args()

    arch_list = os.environ.get("FLASHINFER_CUDA_ARCH_LIST", "").strip()
    if not arch_list:
        print("error: FLASHINFER_CUDA_ARCH_LIST is not set (the image sets it per TARGET)", file=sys.stderr)
        return 2

    import torch
    from flashinfer.jit import env as jit_env
    from flashinfer.jit import sampling
    from flashinfer.jit.attention import gen_batch_prefill_module
    from flashinfer.jit.core import current_compilation_context

    archs = sorted(f"{a}{b}" for a, b in current_compilation_context.TARGET_CUDA_ARCHS)
    _log(step="context", arch_list=arch_list, targets=archs, jit_dir=str(jit_env.FLASHINFER_JIT_DIR),
         cuda_home=os.environ.get("CUDA_HOME"), torch=torch.__version__)
    summary: dict[str, object] = {"arch_list": arch_list, "targets": archs, "scope": args.scope,
                                  "jit_dir": str(jit_env.FLASHINFER_JIT_DIR), "modules": []}

    t = time.monotonic()
    spec = sampling.gen_sampling_module()
    spec.build(verbose=False)
    so = spec.jit_library_path
    if not Path(so).is_file():
        raise RuntimeError(f"sampling module built but {so} is missing")
    _assert_up_to_date(spec.build_dir)
    _log(step="sampling", library=str(so), bytes=Path(so).stat().st_size, seconds=round(time.monotonic() - t, 1))
    summary["modules"].append({"name": spec.name, "library": str(so), "bytes": Path(so).stat().st_size})

    dtype = getattr(torch, args.dtype)
    for hd in [int(x) for x in args.head_dims.replace(",", " ").split()]:
        t = time.monotonic()
        spec = gen_batch_prefill_module("fa2", dtype, dtype, dtype, torch.int32, hd, hd, 0, False, False, False)
        if args.scope == "full":
            spec.build(verbose=False)
            so = Path(spec.jit_library_path)
            if not so.is_file():
                raise RuntimeError(f"prefill module built but {so} is missing")
            _assert_up_to_date(spec.build_dir)
            produced = {"library": str(so), "bytes": so.stat().st_size}
        else:
            spec.write_ninja()
            obj = next((s for s in spec.sources if f"paged_kernel_mask_{MASK_CUSTOM}" in Path(s).name), None)
            if obj is None:
                raise RuntimeError(f"{spec.name}: no paged custom-mask kernel source among {spec.sources}")
            # Same object naming as flashinfer.jit.cpp_ext: <source dir>_<stem>.cuda.o, absolute path.
            out = (spec.build_dir / f"{Path(obj).parent.name}_{Path(obj).stem}.cuda.o").resolve()
            _ninja(spec.build_dir, [str(out)])
            if not out.is_file():
                raise RuntimeError(f"{out} was not produced")
            produced = {"object": str(out), "bytes": out.stat().st_size}
        _log(step="batch_prefill", head_dim=hd, seconds=round(time.monotonic() - t, 1), **produced)
        summary["modules"].append({"name": spec.name, **produced})

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
