#!/usr/bin/env bash
# Builds .carry/proof/ for the kernel-level GPU proof (tests/ddtree/gpu_proof.sh) on the lent H200, from
# the shared recipe's sglang 0.5.23 (.carry/sglang/p1/sglang-slim.tgz, bash ../shared/gpu/make-carry.sh):
#   patched-files.tgz  every file the patch series changes, after `python -m sglfleet.patches apply`
#   mutant-files.tgz   triton_backend.py with tests/ddtree/mutants/seeds-block-size-indexing.patch on top
# It is what the 2026-12-01 proof ran with (docs/results/gpu-proof-2026-12-01.json.gz); the steps `proof`
# and `proof-fi` of tests/ddtree/gpu_session.sh use it. Run from the repo root.
set -euo pipefail
PY=${PY:-.venv/bin/python}
SRC=.carry/sglang/p1/sglang-slim.tgz
D=.carry/proof
[ -f "$SRC" ] || { echo "missing $SRC: run bash ../shared/gpu/make-carry.sh first" >&2; exit 2; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
mkdir -p "$T/orig" "$T/pat" "$D"
tar -C "$T/orig" -xzf "$SRC"
cp -a "$T/orig/." "$T/pat/"
"$PY" -m sglfleet.patches apply --root "$T/pat" | tail -1
(cd "$T" && diff -rq orig pat || true) | sed -n 's|^Files orig/\(.*\) and pat/.* differ$|\1|p; s|^Only in pat/\{0,1\}\([^:]*\): \(.*\)$|\1/\2|p' \
  | sed 's|^/||' > "$T/list"
[ -s "$T/list" ] || { echo "the series changed no file" >&2; exit 1; }
(cd "$T/pat" && tar -czf - -T "$T/list") > "$D/patched-files.tgz"
cp -a "$T/pat" "$T/mut"
patch -d "$T/mut" -p1 --fuzz=0 --batch -s -i "$PWD/tests/ddtree/mutants/seeds-block-size-indexing.patch"
(cd "$T/mut" && tar -czf - sglang/srt/layers/attention/triton_backend.py) > "$D/mutant-files.tgz"
echo "files changed by the series:"; sed 's/^/  /' "$T/list"
ls -la "$D"
