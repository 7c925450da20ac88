#!/usr/bin/env bash
# Splits the embedded SmolLM2 GGUF into .carry/gguf/p0..p3/partN (10, 9, 20 MiB and the rest), sized so each
# rides with one call of tests/ddtree/gpu_session.sh under the 64 MiB carry: p0 with install1 (.carry/sglang/p1),
# p1 with install2 (.carry/sglang/p2 + .carry/gate-py), p2 with install3 (.carry/sglang/p3), p3 with gate30.
set -euo pipefail
M=$(.venv/bin/python -c "from sglfleet.pipeline.embedded import default_model_path; print(default_model_path())")
[ -f "$M" ] || { echo "no embedded model (make setup)" >&2; exit 2; }
rm -rf .carry/gguf; mkdir -p .carry/gguf/p0 .carry/gguf/p1 .carry/gguf/p2 .carry/gguf/p3
MiB=1048576
dd if="$M" of=.carry/gguf/p0/part0 bs=$MiB count=10 status=none
dd if="$M" of=.carry/gguf/p1/part1 bs=$MiB skip=10 count=9 status=none
dd if="$M" of=.carry/gguf/p2/part2 bs=$MiB skip=19 count=20 status=none
dd if="$M" of=.carry/gguf/p3/part3 bs=$MiB skip=39 status=none
cat .carry/gguf/p*/part* | cmp - "$M" && du -sm .carry/gguf/p*
