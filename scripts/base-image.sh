#!/usr/bin/env bash
# Bootstrap a Debian bookworm base image with Python and import it into the local Docker engine.
# No registry can be pulled from on the CI machine, so every image built here starts FROM this.
#
#   scripts/base-image.sh [--force] [--name NAME] [--include pkg,pkg...]
#
# Default image: local/bookworm-py:latest with python3, python3-venv, python3-pip, ca-certificates.
# Idempotent: the image is labelled with a hash of its recipe (suite, mirror, packages, this
# script's bootstrap settings); if an image with that name and recipe hash exists, nothing is done.
# Uses mmdebstrap (preferred, streams a tarball straight into `docker import`), else debootstrap.
# Missing tools are installed with apt-get; the engine is started with scripts/services.sh.
#
# Environment: BASE_IMAGE_NAME, BASE_SUITE (bookworm), BASE_MIRROR (host apt mirror or
# deb.debian.org), BASE_EXTRA_PACKAGES (comma list), DOCKER (client binary), DOCKER_HOST_SOCK.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=${BASE_IMAGE_NAME:-local/bookworm-py:latest}
SUITE=${BASE_SUITE:-bookworm}
MIRROR=${BASE_MIRROR:-}
PACKAGES="python3,python3-venv,python3-pip,ca-certificates"
EXTRA=${BASE_EXTRA_PACKAGES:-}
FORCE=0
DOCKER_SOCK=${DOCKER_HOST_SOCK:-/var/run/docker.sock}

log() { printf '[base-image] %s\n' "$*" >&2; }
die() { printf '[base-image] error: %s\n' "$*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --force) FORCE=1 ;;
    --name) NAME=${2:?--name needs a value}; shift ;;
    --include) EXTRA=${2:?--include needs a value}; shift ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'" ;;
  esac
  shift
done
[[ $NAME == *:* ]] || NAME="$NAME:latest"
[[ -z $EXTRA ]] || PACKAGES="$PACKAGES,$EXTRA"
[[ $PACKAGES =~ ^[a-z0-9.+,-]+$ ]] || die "bad package list '$PACKAGES'"
[[ $(id -u) -eq 0 ]] || die "must run as root (bootstrapping a root filesystem)"

if [[ -z $MIRROR ]]; then
  # Same mirror the host uses (deb822 or one-line sources), so no new network path is needed.
  MIRROR=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list 2>/dev/null | head -n1 | awk '{print $2}' || true)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi

if [[ -x /usr/bin/docker ]]; then DOCKER=${DOCKER:-/usr/bin/docker}; else DOCKER=${DOCKER:-docker}; fi
dk() { "$DOCKER" -H "unix://$DOCKER_SOCK" "$@"; }
dk info >/dev/null 2>&1 || "$here/services.sh" start docker
dk info >/dev/null 2>&1 || die "no Docker engine on $DOCKER_SOCK"

# Anything that changes the produced filesystem goes into the recipe hash.
RECIPE_VERSION=2
recipe="v$RECIPE_VERSION suite=$SUITE mirror=$MIRROR variant=minbase packages=$PACKAGES"
recipe_sha=$(printf '%s' "$recipe" | sha256sum | cut -c1-16)
if [[ $FORCE -eq 0 ]]; then
  have=$(dk image inspect --format '{{index .Config.Labels "org.fleet.base.recipe"}}' "$NAME" 2>/dev/null || true)
  if [[ $have == "$recipe_sha" ]]; then
    log "$NAME is up to date (recipe $recipe_sha); use --force to rebuild"
    exit 0
  fi
  [[ -z $have ]] || log "$NAME exists with recipe '$have', rebuilding for $recipe_sha"
fi

apt_opts=(-o DPkg::Lock::Timeout=300)
ensure_tool() {
  command -v "$1" >/dev/null 2>&1 && return 0
  log "installing $1"
  DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y --no-install-recommends "$1" >/dev/null 2>&1 ||
    { apt-get "${apt_opts[@]}" update >/dev/null 2>&1 || true
      DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y --no-install-recommends "$1" >/dev/null; }
}

created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
changes=(
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  --change 'ENV LANG=C.UTF-8'
  --change 'CMD ["/bin/bash"]'
  --change "LABEL org.fleet.base.recipe=$recipe_sha"
  --change "LABEL org.opencontainers.image.title=$NAME"
  --change "LABEL org.opencontainers.image.created=$created"
  --change "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase + $PACKAGES (bootstrapped, docker-imported)\""
)
# Leave out docs/manuals/locales and apt lists: smaller image, identical behaviour.
dpkg_excludes=(path-exclude=/usr/share/doc/* path-include=/usr/share/doc/*/copyright
  path-exclude=/usr/share/man/* path-exclude=/usr/share/info/* path-exclude=/usr/share/locale/*
  path-include=/usr/share/locale/locale.alias)

tmp_tag="$NAME.partial-$$"
start=$SECONDS
ensure_tool mmdebstrap || true
if command -v mmdebstrap >/dev/null 2>&1; then
  log "bootstrapping $SUITE with mmdebstrap from $MIRROR (+ $PACKAGES)"
  mm_opts=(--variant=minbase --include="$PACKAGES" --mode=root --format=tar --quiet
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log')
  for d in "${dpkg_excludes[@]}"; do mm_opts+=(--dpkgopt="$d"); done
  # Stream the tarball straight into the engine; import under a temporary tag, retag on success.
  mmdebstrap "${mm_opts[@]}" "$SUITE" - "$MIRROR" | dk import "${changes[@]}" - "$tmp_tag" >/dev/null
else
  ensure_tool debootstrap
  command -v debootstrap >/dev/null 2>&1 || die "neither mmdebstrap nor debootstrap could be installed"
  root=$(mktemp -d /var/tmp/base-image.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  log "bootstrapping $SUITE with debootstrap from $MIRROR (+ $PACKAGES) in $root"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >/dev/null
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/usr/share/doc "$root"/usr/share/man
  tar -C "$root" --numeric-owner -c . | dk import "${changes[@]}" - "$tmp_tag" >/dev/null
fi

# Prove the image is usable before it gets the real name.
if ! dk run --rm --network=host "$tmp_tag" python3 -c \
  'import venv, ensurepip, ssl, sys; print(sys.version.split()[0])' >/dev/null; then
  dk rmi "$tmp_tag" >/dev/null 2>&1 || true
  die "imported image fails its python3/venv/ssl check"
fi
dk tag "$tmp_tag" "$NAME"
dk rmi "$tmp_tag" >/dev/null
size=$(dk image inspect --format '{{.Size}}' "$NAME")
log "built $NAME (recipe $recipe_sha, $((size / 1048576)) MB) in $((SECONDS - start)) s"
