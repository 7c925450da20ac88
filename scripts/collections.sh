#!/usr/bin/env bash
# Install the Ansible collections the playbooks use (src/sglfleet/ansible/requirements.yml) into .cache/ansible-collections.
# Galaxy is not reachable here: the same versions ship inside the `ansible` wheel on PyPI; only the listed
# collections are extracted (16 MB instead of the 547 MB full install). Idempotent: a no-op when every listed
# collection is present at its pinned version.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
exec "$PY" -m sglfleet.rollout.collections install
