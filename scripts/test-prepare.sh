#!/usr/bin/env bash
# Everything `make test` needs besides the venv, prepared idempotently; on a prepared machine every step
# is a check that takes well under a second. As root (CI is root): the Debian packages, dockerd, the
# plain and the TLS+htpasswd registries, the bootstrapped base image, the CI images of both targets
# (tests/images), sshd for the netns test hosts (the rollout tests start the hosts themselves). The
# Ansible collections come with `make setup`. Not root: says which tests will skip, changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
step() { echo "::: test-prepare: $* ($(( $(date +%s) - t0 ))s)"; }
if [[ $(id -u) -ne 0 ]]; then
  echo "test-prepare: not root: Docker, registry and SSH-host tests will skip (run make test as root to include them)"
  exit 0
fi
PKGS=(docker.io docker-registry mmdebstrap debootstrap iproute2 openssh-server openssh-client python3-requests
      patch ca-certificates curl apache2-utils)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  step "apt: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
step "services"
scripts/services.sh start docker registry tlsregistry
targets=${IMAGE_CI_TARGETS:-pcie nvlink}
# A CI image is current when it exists AND was built from these inputs (Dockerfile, image scripts, the
# patch series, the DDTree plugin): an image left by an older checkout is rebuilt, not reused.
inputs=$(cd src/sglfleet && cat images/Dockerfile images/*.sh images/*.py __init__.py paths.py patches/__init__.py \
           patches/__main__.py patches/sglang-0.5.23/* patches/ddtree/pyproject.toml patches/ddtree/sglang_ddtree/*.py \
           | sha256sum | cut -c1-32)
marks=${CI_IMAGE_MARKS:-/var/cache/sglang-fleet-ci}
need_images=0
for t in $targets; do
  docker image inspect "sglang-fleet-ci:0.5.23-$t-rc1" >/dev/null 2>&1 || need_images=1
  [[ "$(cat "$marks/ci-image-$t.inputs" 2>/dev/null)" == "$inputs" ]] || need_images=1
done
step "disk"
# A machine that runs the suite again and again must not fill up: our own dangling images (earlier builds of
# the base and CI images, by their labels) go first; pytest keeps only failed tests' directories of the last
# run (pyproject.toml). Then every filesystem the suite writes to needs room for one run at its peak, measured
# on a fresh machine 2026-12-01: about 2.6 GiB under TMPDIR, 8.3 GiB for Docker while the CI images build
# (docs/results/ci-run-2026-12-01-0a2bec1-disk-usage.log).
for label in org.fleet.target org.fleet.base.recipe; do
  docker image prune -f --filter "label=$label" >/dev/null
done
tmp_dir=${TMPDIR:-/tmp}
docker_root=$(docker info -f '{{.DockerRootDir}}')
need_tmp=${TEST_MIN_FREE_GIB_TMP:-4}
need_docker=${TEST_MIN_FREE_GIB_DOCKER:-4}
if ((need_images)); then need_docker=${TEST_MIN_FREE_GIB_BUILD:-10}; fi  # the CI images build below: its peak
free_gib() { df -P -k "$1" | awk 'NR==2 {print int($4 / 1048576)}'; }
short=()
(( $(free_gib "$tmp_dir") >= need_tmp )) || short+=("$(free_gib "$tmp_dir") GiB free for TMPDIR $tmp_dir (needs $need_tmp)")
(( $(free_gib "$docker_root") >= need_docker )) ||
  short+=("$(free_gib "$docker_root") GiB free for Docker's $docker_root (needs $need_docker)")
if ((${#short[@]})); then
  printf 'test-prepare: not enough disk: %s\n' "${short[@]}" >&2
  echo "test-prepare: nothing was deleted beyond our own dangling images; free space (docker system df" \
       "shows what Docker holds) or point TMPDIR elsewhere, then run make test again" >&2
  exit 2
fi
step "base image"
scripts/base-image.sh
if ((need_images)); then
  step "CI images ($targets): building from inputs $inputs (minutes on 2 cores: 449 s measured 2026-12-01)"
  bash .ci/stages/images.sh
  mkdir -p "$marks"
  for t in $targets; do echo "$inputs" > "$marks/ci-image-$t.inputs"; done
fi
step "done"
