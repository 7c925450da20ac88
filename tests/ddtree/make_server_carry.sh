#!/usr/bin/env bash
# Builds .carry/ddtree-srv/: wheels of the sglang-ddtree plugin (src/sglfleet/patches/ddtree) and of the
# TEST-ONLY oracle drafter (tests/ddtree/oracle), for tests/ddtree/serve_matrix.py on the GPU
# machine (carry it with .carry/sglang/p2 and p3). Run from the repo root.
set -euo pipefail
D=.carry/ddtree-srv
rm -rf "$D"; mkdir -p "$D"
for p in src/sglfleet/patches/ddtree tests/ddtree/oracle; do
  python3 -m pip wheel -q --no-deps -w "$D" "$p"
  rm -rf "$p/build" "$p"/*.egg-info
done
ls -la "$D"
