#!/usr/bin/env bash
# CI fragment for the images stage (issue #4), called by .ci/run after `make setup`.
# Proves on a 2-core CPU-only machine, through a real Docker engine:
#   - the base image can be bootstrapped (mmdebstrap/debootstrap + docker import);
#   - the sglang patch series applies to the pinned PyPI sources with zero fuzz (make patches-check)
#     and, inside the real Dockerfile, to the installed sglang wheel;
#   - FlashInfer JIT (sampling = curand user, full module + link; tree-verify custom-mask prefill
#     kernel object) compiles for sm_120f (pcie) and sm_103a (nvlink) with the image's nvcc and
#     curand headers from NVIDIA's CUDA 13 PyPI wheels.
# The production image (CUDA devel base, full sglang deps, all FlashInfer modules) is `make image`
# on a build host; see docs/images.md for what only that proves.
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
step() { echo "::: images: $* ($(( $(date +%s) - t0 ))s)"; }

step "services"
scripts/services.sh start docker registry
step "base image"
scripts/base-image.sh
step "patches-check"
make --no-print-directory patches-check
step "image-ci shared stages"
make --no-print-directory image-ci-shared
step "image-ci ${IMAGE_CI_TARGETS:-pcie nvlink} (parallel)"
make --no-print-directory -j2 image-ci   # lines carry the target name; no output sync, so they stream
step "done"
echo "::: images stage took $(( $(date +%s) - t0 ))s"
