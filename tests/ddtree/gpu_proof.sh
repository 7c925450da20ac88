#!/usr/bin/env bash
# Runs on the GPU machine from the repo root: unpacks the carried sglang 0.5.23
# (cp312) twice, applies the carried patched files to one copy, then runs the GPU
# test against the unpatched and the patched copy, and the cost bench on the patched.
set -u
C=.carry/ddtree; W=${WORK:-/tmp/ddtree}; O=${OUT:-/tmp/ddtree-out}
mkdir -p $W/unpatched $W/patched $W/site $O
python3 -m pip install -q --no-index --no-deps --no-compile --target $W/site $C/whl/*.whl 2>&1 | tail -2
tar -C $W/unpatched -xzf $C/sglang-0.5.23-cp312.tgz
tar -C $W/patched -xzf $C/sglang-0.5.23-cp312.tgz && tar -C $W/patched -xzf $C/patched-files.tgz
export PYTHONPATH=$W/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt
python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)' | tee -a $O/gpu.txt
for v in ${VARIANTS:-patched unpatched}; do
  DDTREE_SGLANG_PATH=$W/$v DDTREE_SGLANG_LABEL=$v DDTREE_RESULTS=$O/results-$v.jsonl \
    timeout ${TEST_TIMEOUT:-240} python3 -m pytest -p no:cacheprovider -q tests/ddtree/test_tree_verify_gpu.py \
    -o addopts="" -m gpu --timeout 600 ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-} 2>&1 | tail -${TAIL:-25} > $O/pytest-$v.txt
  tail -5 $O/pytest-$v.txt
done
if [ "${BENCH:-1}" = 1 ]; then
  DDTREE_SGLANG_PATH=$W/patched DDTREE_BENCH_OUT=$O/bench.json timeout 200 python3 bench/ddtree_verify_cost.py 2>&1 | grep -v Warn | tail -12
fi
