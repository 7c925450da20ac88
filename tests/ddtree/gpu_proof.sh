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
#
# Variant "mutant" = patched + tests/ddtree/mutants/seeds-block-size-indexing.patch
# (the seeds' bug put back), from MUTANT_TGZ (files patched here, as PATCHED_TGZ) or,
# without it, `patch -p1` on the machine; its pytest runs with DDTREE_MUTANT=seeds.
# JOBS="triton:patched triton:unpatched triton:mutant flashinfer:patched ..." runs
# each backend:variant as its own pytest process, all at once on the one GPU
# (flashinfer jobs start when the JIT warm-up is done); results go to
# $OUT/results-BACKEND-VARIANT.jsonl (per cell, as they finish), logs to $OUT/logs.tgz,
# tables to $OUT/summary.md (render_results.py --all on their concatenation).
set -u
C=${CARRY:-.carry/ddtree}; W=${WORK:-/tmp/ddtree}; O=${OUT:-/tmp/ddtree-out}
WHL=${WHL:-$C/whl}; SGLANG_TGZ=${SGLANG_TGZ:-$C/sglang-0.5.23-cp312.tgz}; PATCHED_TGZ=${PATCHED_TGZ:-$C/patched-files.tgz}
mkdir -p $W/unpatched $W/patched $W/site $W/logs $O; rm -f $W/failed
# PREPARED=1: the site dir and the unpatched / patched / mutant trees are already in $W (an earlier call
# on the same warm machine unpacked them: tests/ddtree/gpu_session.sh proof-setup); only the tests run
if [ -z "${PREPARED:-}" ]; then
python3 -m pip install -q --no-index --no-deps --no-compile --target $W/site $WHL/*.whl 2>&1 | tail -2
tar -C $W/unpatched -xzf $SGLANG_TGZ
tar -C $W/patched -xzf $SGLANG_TGZ && tar -C $W/patched -xzf $PATCHED_TGZ
fi
if [ -z "${PREPARED:-}" ] && [[ " ${VARIANTS:-} ${JOBS:-} " == *mutant* ]]; then
  cp -a $W/patched $W/mutant
  if [ -n "${MUTANT_TGZ:-}" ]; then tar -C $W/mutant -xzf $MUTANT_TGZ
  else patch -d $W/mutant -p1 --fuzz=0 --batch -i "$PWD/tests/ddtree/mutants/seeds-block-size-indexing.patch"; fi
  grep -c "MUTANT seeds" $W/mutant/sglang/srt/layers/attention/triton_backend.py | sed 's/^/mutant markers: /'
fi
export PYTHONPATH=$W/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt
python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)' | tee -a $O/gpu.txt
if [ -n "${FLASHINFER_TGZ:-}" ]; then
  tar -C $W/site -xzf $FLASHINFER_TGZ
  export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0} FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$W/fijit}
  export PATH=$PATH:/usr/local/cuda/bin MAX_JOBS=${MAX_JOBS:-$(nproc)}
  command -v nvcc >/dev/null && export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
  (nvcc --version | tail -2; echo "CUDA_HOME=$CUDA_HOME MAX_JOBS=$MAX_JOBS nproc=$(nproc)") | tee -a $O/gpu.txt
  if [ -n "${JOBS:-}" ]; then  # warm up while the triton jobs run
    (timeout ${JIT_TIMEOUT:-420} python3 tests/ddtree/flashinfer_jit_warmup.py > $W/logs/jit.log 2>&1
     echo "jit rc=$?" >> $W/logs/jit.log) & JIT_PID=$!
  else
    timeout ${JIT_TIMEOUT:-420} python3 tests/ddtree/flashinfer_jit_warmup.py > $O/jit.log 2>&1
    echo "jit rc=$?" >> $O/jit.log; tail -3 $O/jit.log
  fi
fi
run_job() {  # backend variant
  local k; [ "$1" = flashinfer ] && k=flashinfer || k="not flashinfer"
  if [ "$1" = flashinfer ] && [ -n "${JIT_PID:-}" ]; then  # a sibling: poll, not wait
    until grep -q "^jit rc=" $W/logs/jit.log 2>/dev/null; do sleep 1; done; tail -2 $W/logs/jit.log
  fi
  local t0=$SECONDS
  DDTREE_SGLANG_PATH=$W/$2 DDTREE_SGLANG_LABEL=$2 DDTREE_RESULTS=$O/results-$1-$2.jsonl \
    DDTREE_MUTANT=$([ "$2" = mutant ] && echo seeds) \
    timeout ${TEST_TIMEOUT:-240} python3 -m pytest -p no:cacheprovider -q tests/ddtree/test_tree_verify_gpu.py \
    -o addopts="" -m gpu --timeout 600 -k "$k" ${PYTEST_ARGS:-} > $W/logs/pytest-$1-$2.txt 2>&1
  local rc=$?
  echo "== $1 $2: rc=$rc $((SECONDS - t0)) s: $(tail -1 $W/logs/pytest-$1-$2.txt)"
  # a run where nothing passed (all skipped, or nothing collected) proves nothing: fail it
  grep -Eq "[0-9]+ passed" <(tail -1 $W/logs/pytest-$1-$2.txt) || echo "$1:$2 ran no passing test" >> $W/failed
}
if [ -n "${JOBS:-}" ]; then
  pids=""
  for j in $JOBS; do run_job ${j%%:*} ${j#*:} & pids="$pids $!"; done
  wait $pids
  cat $O/results-*-*.jsonl > $W/results-all.jsonl
  tar -C $W -czf $O/logs.tgz logs
  python3 tests/ddtree/render_results.py $W/results-all.jsonl --all > $O/summary.md 2>&1
  grep -h "^Summary" $O/summary.md
fi
for v in ${VARIANTS:-$([ -n "${JOBS:-}" ] || echo patched unpatched)}; do
  DDTREE_SGLANG_PATH=$W/$v DDTREE_SGLANG_LABEL=$v DDTREE_RESULTS=$O/results-$v.jsonl \
    DDTREE_MUTANT=$([ "$v" = mutant ] && echo seeds) \
    timeout ${TEST_TIMEOUT:-240} python3 -m pytest -p no:cacheprovider -q tests/ddtree/test_tree_verify_gpu.py \
    -o addopts="" -m gpu --timeout 600 ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-} 2>&1 | tail -${TAIL:-25} > $O/pytest-$v.txt
  tail -5 $O/pytest-$v.txt
  grep -Eq "[0-9]+ passed" <(tail -1 $O/pytest-$v.txt) || echo "$v ran no passing test" >> $W/failed
done
if [ "${BENCH:-1}" = 1 ]; then
  DDTREE_SGLANG_PATH=$W/patched DDTREE_BENCH_OUT=$O/bench.json timeout 200 python3 bench/ddtree_verify_cost.py 2>&1 | grep -v Warn | tail -12
fi
if [ -s $W/failed ]; then cat $W/failed; exit 1; fi
