#!/usr/bin/env bash
# CI fragment for the rollout stage (issue #6), called by .ci/run after `make setup`.
# Installs what the rollout tests need and extracts the Ansible collections; the tests' own fixtures
# start dockerd/registry (scripts/services.sh), the netns SSH hosts and the containers.
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
# sshd for the netns test hosts, python3-requests for community.docker in the hosts' /usr/bin/python3.
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends \
  openssh-server openssh-client iproute2 python3-requests docker.io docker-registry >/dev/null
# Collections: Galaxy is unreachable; take exactly the three we use out of the `ansible` wheel (PyPI).
coll=.cache/ansible-collections
if [[ ! -f $coll/ansible_collections/community/docker/MANIFEST.json ]]; then
  mkdir -p .cache/wheels "$coll"
  .venv/bin/pip download -q --no-deps -d .cache/wheels ansible==12.3.0
  .venv/bin/python - "$coll" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(".cache/wheels/ansible-12.3.0-py3-none-any.whl")
keep = tuple(f"ansible_collections/{c}/" for c in ("community/docker", "ansible/posix", "community/general"))
z.extractall(sys.argv[1], [m for m in z.namelist() if m.startswith(keep)])
PY
fi
.venv/bin/pip install -q ansible-lint==26.10.1
echo "::: rollout stage prepare took $(( $(date +%s) - t0 ))s"
