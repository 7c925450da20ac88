#!/usr/bin/env bash
# Idempotent start/stop/status for the local Docker engine and a loopback registry on a host
# without systemd (CI machine, test VMs). Shared by the image stage and the Ansible stage.
#
#   scripts/services.sh start  [docker] [registry]   # default: both
#   scripts/services.sh stop   [docker] [registry]
#   scripts/services.sh status [docker] [registry]   # rc 0 = all requested running, 3 = not
#   scripts/services.sh restart [docker] [registry]
#
# - docker:   Debian docker.io's dockerd, started as
#             `dockerd --storage-driver=overlay2 --bridge=none --iptables=false`
#             (no bridge networks on this machine: run containers/builds with --network=host).
# - registry: Debian docker-registry (distribution 2.8) on $REGISTRY_ADDR (127.0.0.1:5000).
# Missing packages are installed with apt-get (waiting up to 300 s for the dpkg lock).
# An engine/registry that is already answering (started by someone else) is reused, never killed:
# `stop` only stops processes whose pid this script recorded.
#
# Environment (all optional):
#   SERVICES_STATE_DIR  pid files, generated config        (default /run/fleet-services)
#   SERVICES_LOG_DIR    daemon logs                          (default /var/log/fleet-services)
#   DOCKER_HOST_SOCK    engine socket                        (default /var/run/docker.sock)
#   DOCKER_DATA_ROOT    dockerd --data-root                  (default /var/lib/docker)
#   REGISTRY_ADDR       registry listen address              (default 127.0.0.1:5000)
#   REGISTRY_DATA       registry storage directory           (default /var/lib/docker-registry)
#   SERVICES_WAIT_S     readiness timeout per service        (default 60)
set -euo pipefail

STATE_DIR=${SERVICES_STATE_DIR:-/run/fleet-services}
LOG_DIR=${SERVICES_LOG_DIR:-/var/log/fleet-services}
DOCKER_SOCK=${DOCKER_HOST_SOCK:-/var/run/docker.sock}
DOCKER_DATA_ROOT=${DOCKER_DATA_ROOT:-/var/lib/docker}
REGISTRY_ADDR=${REGISTRY_ADDR:-127.0.0.1:5000}
REGISTRY_DATA=${REGISTRY_DATA:-/var/lib/docker-registry}
WAIT_S=${SERVICES_WAIT_S:-60}
ALL_SERVICES=(docker registry)

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] error: %s\n' "$*" >&2; exit 1; }

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root to manage $1"; }

apt_install() {
  need_root "packages ($*)"
  log "installing $* with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  local opts=(-o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
  if ! apt-get "${opts[@]}" install -y --no-install-recommends "$@" >>"$LOG_DIR/apt.log" 2>&1; then
    apt-get "${opts[@]}" update >>"$LOG_DIR/apt.log" 2>&1 || true
    apt-get "${opts[@]}" install -y --no-install-recommends "$@" >>"$LOG_DIR/apt.log" 2>&1 ||
      die "apt-get install $* failed (see $LOG_DIR/apt.log)"
  fi
}

# pid recorded by us and still alive (and still the same program)?
our_pid() {  # $1 = name, $2 = expected comm
  local f="$STATE_DIR/$1.pid" pid
  [[ -s $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2"* ]] || return 1
  echo "$pid"
}

wait_for() {  # $1 = description, rest = probe command
  local what=$1 deadline=$((SECONDS + WAIT_S)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.3
  done
  log "$what ready"
}

# ---------------------------------------------------------------- docker
docker_cli() {
  # Debian's client matches the Debian engine; any other client talks to it through API negotiation.
  if [[ -x /usr/bin/docker ]]; then echo /usr/bin/docker; else command -v docker || true; fi
}
docker_ready() { local c; c=$(docker_cli); [[ -n $c ]] && "$c" -H "unix://$DOCKER_SOCK" info; }

docker_start() {
  if docker_ready >/dev/null 2>&1; then log "docker: engine already answering on $DOCKER_SOCK"; return 0; fi
  need_root dockerd
  command -v dockerd >/dev/null 2>&1 || apt_install docker.io
  command -v dockerd >/dev/null 2>&1 || die "dockerd not found after installing docker.io"
  # A stale socket/pid from a killed engine makes dockerd refuse to start.
  local pidfile="$STATE_DIR/docker.pid"
  if ! our_pid docker dockerd >/dev/null; then
    if [[ -S $DOCKER_SOCK ]] && ! pgrep -x dockerd >/dev/null; then rm -f "$DOCKER_SOCK"; fi
    rm -f /var/run/docker.pid
    log "docker: starting dockerd (log: $LOG_DIR/dockerd.log)"
    setsid dockerd --storage-driver=overlay2 --bridge=none --iptables=false --ip-masq=false \
      --data-root="$DOCKER_DATA_ROOT" --host="unix://$DOCKER_SOCK" \
      --pidfile="$STATE_DIR/dockerd.daemon.pid" >>"$LOG_DIR/dockerd.log" 2>&1 </dev/null 9>&- &
    echo $! >"$pidfile"
  fi
  if ! wait_for "docker: engine" docker_ready; then
    tail -n 20 "$LOG_DIR/dockerd.log" >&2 || true
    die "docker: engine not ready after ${WAIT_S}s (see $LOG_DIR/dockerd.log)"
  fi
}

docker_stop() {
  local pid
  if pid=$(our_pid docker dockerd); then
    log "docker: stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.3; done
    kill -0 "$pid" 2>/dev/null && { log "docker: still running, sending KILL"; kill -KILL "$pid" || true; }
    rm -f "$STATE_DIR/docker.pid"
  elif docker_ready >/dev/null 2>&1; then
    log "docker: engine is running but was not started by this script; leaving it alone"
  else
    log "docker: not running"
  fi
}

docker_status() {
  if docker_ready >/dev/null 2>&1; then
    local v pid
    v=$("$(docker_cli)" -H "unix://$DOCKER_SOCK" version --format '{{.Server.Version}}' 2>/dev/null || echo '?')
    pid=$(our_pid docker dockerd || echo "external")
    echo "docker: running (engine $v, pid $pid, socket $DOCKER_SOCK)"
  else
    echo "docker: stopped"; return 3
  fi
}

# ---------------------------------------------------------------- registry
registry_ready() { curl -fsS --max-time 2 "http://$REGISTRY_ADDR/v2/" >/dev/null; }

registry_start() {
  if registry_ready 2>/dev/null; then log "registry: already answering on $REGISTRY_ADDR"; return 0; fi
  need_root docker-registry
  [[ -x /usr/bin/docker-registry ]] || apt_install docker-registry
  [[ -x /usr/bin/docker-registry ]] || die "/usr/bin/docker-registry not found after installing"
  mkdir -p "$REGISTRY_DATA"
  local cfg="$STATE_DIR/registry.yml"
  cat >"$cfg" <<EOF
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $REGISTRY_DATA
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
  headers:
    X-Content-Type-Options: [nosniff]
EOF
  serve_registry registry "$cfg" "http://$REGISTRY_ADDR/v2/" registry_ready
}

# serve_registry NAME CONFIG URL READY_FN: start docker-registry with CONFIG unless our NAME instance
# runs, then wait until READY_FN answers (log tail and exit otherwise).
serve_registry() {
  local name=$1 cfg=$2 url=$3 ready=$4
  if ! our_pid "$name" docker-regist >/dev/null; then
    log "$name: starting on $url (log: $LOG_DIR/$name.log)"
    setsid /usr/bin/docker-registry serve "$cfg" >>"$LOG_DIR/$name.log" 2>&1 </dev/null 9>&- &
    echo $! >"$STATE_DIR/$name.pid"
  fi
  if ! wait_for "$name: $url" "$ready"; then
    tail -n 20 "$LOG_DIR/$name.log" >&2 || true
    die "$name: not ready after ${WAIT_S}s (see $LOG_DIR/$name.log)"
  fi
}

# stop_registry NAME: TERM our NAME instance, KILL it after 15 s; 1 when this script did not start one.
stop_registry() {
  local name=$1 pid
  pid=$(our_pid "$name" docker-regist) || return 1
  log "$name: stopping (pid $pid)"
  kill -TERM "$pid"
  local deadline=$((SECONDS + 15))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" || true
  rm -f "$STATE_DIR/$name.pid"
}

registry_stop() {
  if stop_registry registry; then
    :
  elif registry_ready 2>/dev/null; then
    log "registry: running on $REGISTRY_ADDR but not started by this script; leaving it alone"
  else
    log "registry: not running"
  fi
}

registry_status() {
  if registry_ready 2>/dev/null; then
    echo "registry: running (http://$REGISTRY_ADDR, pid $(our_pid registry docker-regist || echo external))"
  else
    echo "registry: stopped"; return 3
  fi
}

# ---------------------------------------------------------------- tlsregistry
# A second registry that behaves like a production one: TLS (a private CA made here) and htpasswd
# logins (bcrypt). CA, key, user and password live under $TLS_DIR (0700); the password file is 0600.
# The engine trusts the CA through /etc/docker/certs.d/$TLS_REGISTRY_ADDR/ca.crt.
TLS_REGISTRY_ADDR=${TLS_REGISTRY_ADDR:-127.0.0.1:5443}
TLS_REGISTRY_DATA=${TLS_REGISTRY_DATA:-/var/lib/docker-registry-tls}
TLS_DIR="$STATE_DIR/tlsregistry"
TLS_USER=${TLS_REGISTRY_USER:-fleet-ci}
tlsregistry_ready() {
  curl -sS --max-time 2 --cacert "$TLS_DIR/ca.crt" -o /dev/null -w '%{http_code}' "https://$TLS_REGISTRY_ADDR/v2/" |
    grep -qx 401
}

tlsregistry_start() {
  if [[ -s $TLS_DIR/ca.crt ]] && tlsregistry_ready 2>/dev/null; then
    log "tlsregistry: already answering on $TLS_REGISTRY_ADDR"; return 0
  fi
  need_root docker-registry
  [[ -x /usr/bin/docker-registry ]] || apt_install docker-registry
  command -v htpasswd >/dev/null 2>&1 || apt_install apache2-utils
  mkdir -p "$TLS_DIR" "$TLS_REGISTRY_DATA"
  chmod 0700 "$TLS_DIR"
  local host=${TLS_REGISTRY_ADDR%:*}
  if [[ ! -s $TLS_DIR/server.crt ]]; then
    log "tlsregistry: making a CA and a server certificate for $host"
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=fleet test CA" \
      -keyout "$TLS_DIR/ca.key" -out "$TLS_DIR/ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$host" -keyout "$TLS_DIR/server.key" \
      -out "$TLS_DIR/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:%s,DNS:localhost\nextendedKeyUsage=serverAuth\n' "$host" >"$TLS_DIR/ext.cnf"
    openssl x509 -req -in "$TLS_DIR/server.csr" -CA "$TLS_DIR/ca.crt" -CAkey "$TLS_DIR/ca.key" \
      -CAcreateserial -days 30 -extfile "$TLS_DIR/ext.cnf" -out "$TLS_DIR/server.crt" 2>/dev/null
  fi
  if [[ ! -s $TLS_DIR/password ]]; then
    (umask 077; openssl rand -hex 16 >"$TLS_DIR/password")
  fi
  htpasswd -Bbc "$TLS_DIR/htpasswd" "$TLS_USER" "$(<"$TLS_DIR/password")" 2>/dev/null
  echo "$TLS_USER" >"$TLS_DIR/user"
  mkdir -p "/etc/docker/certs.d/$TLS_REGISTRY_ADDR"
  cp "$TLS_DIR/ca.crt" "/etc/docker/certs.d/$TLS_REGISTRY_ADDR/ca.crt"
  cat >"$TLS_DIR/registry.yml" <<CFG
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $TLS_REGISTRY_DATA
  delete:
    enabled: true
auth:
  htpasswd:
    realm: fleet-registry
    path: $TLS_DIR/htpasswd
http:
  addr: $TLS_REGISTRY_ADDR
  tls:
    certificate: $TLS_DIR/server.crt
    key: $TLS_DIR/server.key
  headers:
    X-Content-Type-Options: [nosniff]
CFG
  serve_registry tlsregistry "$TLS_DIR/registry.yml" "https://$TLS_REGISTRY_ADDR/v2/ (login required)" tlsregistry_ready
}

tlsregistry_stop() {
  stop_registry tlsregistry || log "tlsregistry: not running (or not started by this script)"
}

tlsregistry_status() {
  if [[ -s $TLS_DIR/ca.crt ]] && tlsregistry_ready 2>/dev/null; then
    echo "tlsregistry: running (https://$TLS_REGISTRY_ADDR, CA $TLS_DIR/ca.crt, user $(<"$TLS_DIR/user"))"
  else
    echo "tlsregistry: stopped"; return 3
  fi
}

# ---------------------------------------------------------------- main
[[ $# -ge 1 ]] || usage
action=$1; shift
services=("$@")
[[ ${#services[@]} -gt 0 ]] || services=("${ALL_SERVICES[@]}")
for s in "${services[@]}"; do
  [[ $s == docker || $s == registry || $s == tlsregistry ]] || die "unknown service '$s' (known: ${ALL_SERVICES[*]})"
done
case $action in start | stop | status | restart) ;; *) die "unknown action '$action' (start|stop|status|restart)" ;; esac

if [[ $action != status ]]; then
  mkdir -p "$STATE_DIR" "$LOG_DIR" 2>/dev/null || die "cannot create $STATE_DIR / $LOG_DIR"
  # Serialise concurrent callers (CI stage and an Ansible play starting services at once).
  exec 9>"$STATE_DIR/.lock"
  flock -w 120 9 || die "another services.sh holds $STATE_DIR/.lock"
fi

rc=0
for s in "${services[@]}"; do
  case $action in
    start) "${s}_start" ;;
    stop) "${s}_stop" ;;
    restart) "${s}_stop"; "${s}_start" ;;
    status) "${s}_status" || rc=3 ;;
  esac
done
exit $rc
