#!/usr/bin/env bash
# SSH test hosts for the Ansible rollout, each in its own network namespace.
#
#   scripts/testhosts.sh start N [DIR]   # hosts rt1..rtN, state in DIR (default runs/testhosts)
#   scripts/testhosts.sh stop [DIR]      # stop the sshds this script started, delete the namespaces
#   scripts/testhosts.sh cut NAME [DIR]  # make host NAME unreachable: link down + its processes killed
#   scripts/testhosts.sh status [DIR]
#
# Host k gets namespace rt<k>, a veth pair 10.231.<k>.1 (root side) <-> 10.231.<k>.2 (namespace side) and
# an sshd (its own config and host key) listening on 10.231.<k>.2:22. Root logs in with the key DIR/id_ed25519.
# DIR/hosts.tsv lists "name<TAB>ssh address<TAB>gateway" for the inventory writer (testbed/testbed.py).
#
# Differences from production (see docs/rollout.md): the namespaces have their own network stack and
# hostname view, but share the filesystem and the ONE Docker engine of this machine (the engine socket is
# a file). Containers run with --network=host in the root namespace, so each test host is given its own
# container name, port, state dir and the gateway address (10.231.<k>.1) to reach its own server.
set -euo pipefail

PREFIX=${TESTHOSTS_PREFIX:-rt}
NET=${TESTHOSTS_NET:-10.231}  # host k: $NET.k.1 (root side) / $NET.k.2 (namespace)
die() { printf 'testhosts: error: %s\n' "$*" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || die "must run as root (ip netns)"
SSHD=/usr/sbin/sshd
# What the hosts need, installed here when missing, so `make demo` on a fresh machine prepares its own fleet
# (scripts/test-prepare.sh installs the same for the tests): sshd and ssh, ip, and requests for the hosts'
# /usr/bin/python3 (community.docker's modules import it; the hosts share this machine's filesystem).
# apt waits up to 300 s for the dpkg lock.
HOST_PKGS=(openssh-server openssh-client iproute2 python3-requests)
need_pkgs() {
  local missing=() p
  for p in "${HOST_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  command -v apt-get >/dev/null 2>&1 || die "${missing[*]} missing and no apt-get here: install them"
  local log=${TESTHOSTS_APT_LOG:-/tmp/testhosts-apt.log} opts=(-o DPkg::Lock::Timeout=300)
  printf 'testhosts: installing %s with apt-get (log: %s)\n' "${missing[*]}" "$log" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
    apt-get "${opts[@]}" update >>"$log" 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y --no-install-recommends "${missing[@]}" >>"$log" 2>&1 ||
      die "apt-get install ${missing[*]} failed (see $log)"
  fi
  [[ -x $SSHD ]] || die "$SSHD still missing after installing openssh-server"
}

start() {
  local n=$1 dir=$2
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 64 ]] || die "N must be 1..64, got '$n'"
  mkdir -p "$dir" /run/sshd
  dir=$(cd "$dir" && pwd)
  [[ -f $dir/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C rollout-tests -f "$dir/id_ed25519"
  [[ -f $dir/ssh_host_ed25519_key ]] || ssh-keygen -q -t ed25519 -N '' -f "$dir/ssh_host_ed25519_key"
  cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
  chmod 600 "$dir/authorized_keys" "$dir/id_ed25519" "$dir/ssh_host_ed25519_key"
  : >"$dir/hosts.tsv"
  local k
  for ((k = 1; k <= n; k++)); do
    local ns=$PREFIX$k ha=vh$PREFIX$k hb=vn$PREFIX$k gw=$NET.$k.1 addr=$NET.$k.2
    if ! ip netns list | grep -qw "$ns"; then
      ip netns add "$ns"
      ip link add "$ha" type veth peer name "$hb"
      ip link set "$hb" netns "$ns"
      ip addr add "$gw/30" dev "$ha"
      ip link set "$ha" up
      ip netns exec "$ns" ip addr add "$addr/30" dev "$hb"
      ip netns exec "$ns" ip link set "$hb" up
      ip netns exec "$ns" ip link set lo up
    fi
    ip link set "$ha" up  # `cut` takes it down
    cat >"$dir/sshd_$ns.conf" <<EOF
ListenAddress $addr
Port 22
HostKey $dir/ssh_host_ed25519_key
PidFile $dir/sshd_$ns.pid
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
MaxSessions 64
# As on a real host: without it Ansible's file transfers try sftp, then scp, and only then fall back to piping.
Subsystem sftp internal-sftp
MaxStartups 64:30:128
LogLevel ERROR
EOF
    if ! { [[ -s $dir/sshd_$ns.pid ]] && kill -0 "$(cat "$dir/sshd_$ns.pid")" 2>/dev/null; }; then
      # Processes in the namespace that this DIR did not start: another (or a killed) run owns it.
      [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] ||
        die "namespace $ns is in use by another run (stop it with its DIR, or set TESTHOSTS_PREFIX/TESTHOSTS_NET)"
      ip netns exec "$ns" "$SSHD" -f "$dir/sshd_$ns.conf" -E "$dir/sshd_$ns.log"
    fi
    printf '%s\t%s\t%s\n' "$ns" "$addr" "$gw" >>"$dir/hosts.tsv"
  done
  # Wait until every sshd accepts a login.
  local deadline=$((SECONDS + 30))
  for ((k = 1; k <= n; k++)); do
    until ssh -q -i "$dir/id_ed25519" -o BatchMode=yes -o StrictHostKeyChecking=no \
      -o UserKnownHostsFile=/dev/null -o ConnectTimeout=2 "root@$NET.$k.2" true 2>/dev/null; do
      ((SECONDS < deadline)) || die "sshd in $PREFIX$k not answering (see $dir/sshd_$PREFIX$k.log)"
      sleep 0.2
    done
  done
  echo "testhosts: $n host(s) up, inventory data in $dir/hosts.tsv"
}

stop() {
  local dir=$1 f ns pid
  shopt -s nullglob
  for f in "$dir"/sshd_*.pid; do
    pid=$(cat "$f" 2>/dev/null || true)
    [[ $pid =~ ^[0-9]+$ ]] && kill "$pid" 2>/dev/null || true
    rm -f "$f"
  done
  for f in "$dir"/sshd_*.conf; do
    ns=$(basename "$f" .conf); ns=${ns#sshd_}
    if ip netns list | grep -qw "$ns"; then
      # Sessions the sshd forked live in the namespace too; they are ours (started through our sshd).
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
      ip link del "vh$ns" 2>/dev/null || true
      ip netns del "$ns"
    fi
  done
  echo "testhosts: stopped"
}

cut() {
  local ns=$1 dir=$2 pid
  ip netns list | grep -qw "$ns" || die "no test host '$ns'"
  ip link set "vh$ns" down
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  rm -f "$dir/sshd_$ns.pid"
  echo "testhosts: $ns cut off"
}

status() {
  local dir=$1 line ns addr gw
  [[ -f $dir/hosts.tsv ]] || { echo "testhosts: none"; return 3; }
  while IFS=$'\t' read -r ns addr gw; do
    if [[ -s $dir/sshd_$ns.pid ]] && kill -0 "$(cat "$dir/sshd_$ns.pid")" 2>/dev/null; then
      echo "$ns $addr up"
    else
      echo "$ns $addr down"
    fi
  done <"$dir/hosts.tsv"
}

action=${1:-}
case $action in
  start) [[ $# -ge 2 ]] || die "usage: $0 start N [DIR]"; need_pkgs; start "$2" "${3:-runs/testhosts}" ;;
  stop) stop "${2:-runs/testhosts}" ;;
  cut) [[ $# -ge 2 ]] || die "usage: $0 cut NAME [DIR]"; cut "$2" "${3:-runs/testhosts}" ;;
  status) status "${2:-runs/testhosts}" ;;
  *) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
