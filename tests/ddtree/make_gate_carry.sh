#!/usr/bin/env bash
# Builds .carry/gate-py/: the pure-Python packages `python -m sglfleet.validation run` needs that the GPU
# machine's image lacks (wordfreq with the lists of textscore.detectors.LANGS only, ftfy, langcodes, locate), copied from
# this checkout's .venv (make setup). pydantic and orjson come with .carry/sglang/p2; httpx, rich,
# jinja2, PyYAML and matplotlib are in the image. Run from the repo root.
set -euo pipefail
D=.carry/gate-py
SP=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$D"; mkdir -p "$D"
for p in wordfreq ftfy langcodes locate; do
  cp -r "$SP/$p" "$D/"
  cp -r "$SP/$p"-*.dist-info "$D/" 2>/dev/null || true
done
find "$D/wordfreq/data" -type f ! -regex '.*_\(en\|fr\|de\|es\|it\|pt\|nl\)\.msgpack\.gz' -delete
find "$D" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$D"
