#!/usr/bin/env bash
# Moves wheels from .carry/sglang/p1/whl to p2/whl (largest first, transformers stays: install1 needs it)
# until p1 plus the working tree that travels with every call fit one call's 64 MiB. The tree grows with
# docs/results; on 2026-12-02 p1 (58.0 MB) + the tree (10.4 MB) were over the limit. Run after
# ../shared/gpu/make-carry.sh, from the repo root. Exit 2 when even an empty p1 would not fit.
set -euo pipefail
C=.carry/sglang
LIMIT=$((64 * 1024 * 1024 - 512 * 1024))  # 0.5 MiB of headroom for untracked files written meanwhile
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
# the GGUF piece that rides with install1 (tests/ddtree/split_gguf.sh; run that first) counts against p1's call
extra=0; [ -d .carry/gguf/p0 ] && extra=$(du -sb .carry/gguf/p0 | cut -f1)
size() { echo $(( $(du -sb "$C/p1" | cut -f1) + extra )); }
for w in $(ls -S "$C/p1/whl"); do
  [ $(( $(size) + tree )) -lt "$LIMIT" ] && break
  case $w in transformers-*) continue ;; esac
  mv "$C/p1/whl/$w" "$C/p2/whl/" && echo "moved $w to p2"
done
total=$(( $(size) + tree ))
if [ "$total" -ge "$LIMIT" ]; then
  echo "error: p1 ($(size) bytes) + the working tree ($tree bytes) exceed one call's carry" >&2; exit 2
fi
echo "p1 + tree: $total bytes (limit $LIMIT)"
