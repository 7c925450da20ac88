#!/usr/bin/env bash
# Builds .carry/locust-py/: Locust and the packages it needs that the GPU machine's image (Python 3.12)
# lacks, as cp312 manylinux wheels at the versions this checkout's .venv runs (make setup).
# Run from the repo root; needs PyPI.
set -euo pipefail
D=.carry/locust-py
v() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf "$D"; mkdir -p "$D"
pkgs=()
for p in locust gevent geventhttpclient greenlet zope.event zope.interface brotli configargparse flask flask-cors \
         flask-login python-engineio python-socketio bidict simple-websocket wsproto itsdangerous blinker; do
  pkgs+=("$p==$(v "$p")")
done
python3 -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux1_x86_64 -d "$D" "${pkgs[@]}"
ls "$D" | wc -l; du -sh "$D"
