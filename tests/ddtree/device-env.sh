#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/on-device.sh installed /tmp/site once (same machine,
# still warm): the environment it exports, without reinstalling (p2/p3 need not be carried).
S=${SITE:-/tmp/site}
export NO_DUAL_GEMM=1 PYTHONPATH=$S PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
export FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_WORKSPACE_BASE=/tmp/fijit MAX_JOBS=$(nproc)
CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); export CUDA_HOME
