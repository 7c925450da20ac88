#!/usr/bin/env bash
# Runs on the GPU machine from the repo root: unpacks the carried sglang 0.5.23
# (cp312) twice, applies the carried patched files to one copy, then runs the GPU
# test against the unpatched and the patched copy, and the cost bench on the patched.
#
# Defaults are the Triton proof (carry .carry/ddtree). The FlashInfer proof uses a
# smaller carry: FLASHINFER_TGZ (a tar of flashinfer-python 0.7.2 unpacked, JIT
# sources only for what the proof compiles) is unpacked into the same site dir,
# its kernels are JIT-compiled first (tests/ddtree/flashinfer_jit_warmup.py), e.g.
#   CARRY=.carry-fi WHL=.carry/ddtree/whl SGLANG_TGZ=.carry-fi/sglang-slim.tgz \
#   FLASHINFER_TGZ=.carry-fi/fislim.tgz PYTEST_K=flashinfer BENCH=0 bash tests/ddtree/gpu_proof.sh
set -u
C=${CARRY:-.carry/ddtree}; W=${WORK:-/tmp/ddtree}; O=${OUT:-/tmp/ddtree-out}
WHL=${WHL:-$C/whl}; SGLANG_TGZ=${SGLANG_TGZ:-$C/sglang-0.5.23-cp312.tgz}; PATCHED_TGZ=${PATCHED_TGZ:-$C/patched-files.tgz}
mkdir -p $W/unpatched $W/patched $W/site $O
python3 -m pip install -q --no-index --no-deps --no-compile --target $W/site $WHL/*.whl 2>&1 | tail -2
tar -C $W/unpatched -xzf $SGLANG_TGZ
tar -C $W/patched -xzf $SGLANG_TGZ && tar -C $W/patched -xzf $PATCHED_TGZ
export PYTHONPATH=$W/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt
python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)' | tee -a $O/gpu.txt
if [ -n "${FLASHINFER_TGZ:-}" ]; then
  tar -C $W/site -xzf $FLASHINFER_TGZ
  export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0} FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$W/fijit}
  export PATH=$PATH:/usr/local/cuda/bin MAX_JOBS=${MAX_JOBS:-$(nproc)}
  command -v nvcc >/dev/null && export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
  (nvcc --version | tail -2; echo "CUDA_HOME=$CUDA_HOME MAX_JOBS=$MAX_JOBS nproc=$(nproc)") | tee -a $O/gpu.txt
  timeout ${JIT_TIMEOUT:-420} python3 tests/ddtree/flashinfer_jit_warmup.py > $O/jit.log 2>&1
  echo "jit rc=$?" >> $O/jit.log; tail -3 $O/jit.log
fi
for v in ${VARIANTS:-patched unpatched}; do
  DDTREE_SGLANG_PATH=$W/$v DDTREE_SGLANG_LABEL=$v DDTREE_RESULTS=$O/results-$v.jsonl \
    timeout ${TEST_TIMEOUT:-240} python3 -m pytest -p no:cacheprovider -q tests/ddtree/test_tree_verify_gpu.py \
    -o addopts="" -m gpu --timeout 600 ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-} 2>&1 | tail -${TAIL:-25} > $O/pytest-$v.txt
  tail -5 $O/pytest-$v.txt
done
if [ "${BENCH:-1}" = 1 ]; then
  DDTREE_SGLANG_PATH=$W/patched DDTREE_BENCH_OUT=$O/bench.json timeout 200 python3 bench/ddtree_verify_cost.py 2>&1 | grep -v Warn | tail -12
fi
