#!/usr/bin/env bash
# Builds .carry-fi/ (git-ignored) for the FlashInfer GPU proof on the lent H200, under
# the 64 MiB carry limit together with .carry/ddtree/whl (the sglang deps, 32 MB):
#   fislim.tgz        flashinfer-python 0.7.2 unpacked; JIT sources kept only where the
#                     proof compiles (data/csrc top-level files, include, cccl, spdlog);
#                     dropped: data/csrc/*/ subtrees, data/cutlass (FA2 prefill and
#                     packbits include neither: checked with nvcc -M), cudnn_frost JSONs
#   sglang-slim.tgz   sglang 0.5.23 cp312 unpacked, without multimodal_gen/test and the
#                     Rust server extensions (sglang/srt/rust_extensions/*.so)
#   patched-files.tgz the files the series changes, from `python -m sglfleet.patches apply`
#   mutant-files.tgz  triton_backend.py with tests/ddtree/mutants/seeds-block-size-indexing.patch
#                     applied on top of the series (the GPU proof's "mutant" variant)
# Usage: bash tests/ddtree/make_flashinfer_carry.sh   (from the repo root, needs PyPI)
set -eu
PY=${PY:-.venv/bin/python}
D=.carry-fi; T=$(mktemp -d)
mkdir -p $D
grep -qx '/.carry-fi/' .git/info/exclude 2>/dev/null || echo '/.carry-fi/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d $T/whl flashinfer-python==0.7.2
python3 -m pip install -q --no-deps --no-compile --target $T/fi $T/whl/flashinfer_python-0.7.2-py3-none-any.whl
find $T/fi/flashinfer/data/csrc -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
rm -rf $T/fi/flashinfer/data/cutlass $T/fi/flashinfer/fused_moe/backends/cudnn_frost/artifacts
find $T/fi -name __pycache__ -prune -exec rm -rf {} +
tar -C $T/fi -czf $D/fislim.tgz flashinfer flashinfer_python-0.7.2.dist-info
mkdir -p $T/sg
tar -C $T/sg -xzf .carry/ddtree/sglang-0.5.23-cp312.tgz
tar -C $T/sg --exclude='sglang/srt/rust_extensions/*.so' -czf $D/sglang-slim.tgz sglang
rm -rf $T/sg && mkdir -p $T/sg && tar -C $T/sg -xzf $D/sglang-slim.tgz
$PY -m sglfleet.patches apply --root $T/sg
(cd $T/sg && tar -czf - sglang/srt/speculative/tree_verify.py sglang/srt/layers/attention/triton_backend.py \
  sglang/srt/layers/attention/flashinfer_backend.py sglang/srt/speculative/dflash_utils.py \
  sglang/srt/model_executor/runner/decode_cuda_graph_runner.py sglang/srt/arg_groups/fields/spec.py) > $D/patched-files.tgz
# the seeds' bug put back on top of the series (GPU proof variant "mutant", MUTANT_TGZ)
R=$PWD; (cd $T/sg && patch -p1 --fuzz=0 --batch -s -i "$R/tests/ddtree/mutants/seeds-block-size-indexing.patch" \
  && tar -czf - sglang/srt/layers/attention/triton_backend.py) > $D/mutant-files.tgz
rm -rf $T
du -cb $D/* .carry/ddtree/whl | tail -1
