#!/usr/bin/env bash
# Alertmanager 0.25 from Debian (prometheus-alertmanager) on loopback for jobdiagd's tests and demos.
#   alertmanager.sh check                            -- binary installed (installs the package as root)
#   alertmanager.sh start NAME CONFIG [PORT]         -- one instance on 127.0.0.1:PORT (free port if omitted or
#                                                       empty), gossip off; waits for /-/ready
#   alertmanager.sh start NAME CONFIG PORT CPORT PEER...
#                                                    -- one HA peer: gossip on 127.0.0.1:CPORT, joining PEER
#                                                       (127.0.0.1:PORT, repeatable); waits until gossip settled
#   alertmanager.sh start-pair NAME CONFIG           -- two peers NAME-0 and NAME-1 gossiping on loopback (free
#                                                       ports); waits until both are settled and see each other
#   alertmanager.sh stop NAME | stop-pair NAME       -- stop by PID (SIGKILL after 15 s)
#   alertmanager.sh port NAME | cluster-port NAME    -- print its web / gossip port
# State (pid, ports, log, storage with silences and the notification log) lives under
# $JOBDIAGD_SVC_DIR/alertmanager-NAME*; a restart with the same NAME keeps its storage.
# ALERTMANAGER_PEER_TIMEOUT (default 15s, Alertmanager's own) is how long a peer waits for the one
# before it to notify; ALERTMANAGER_GOSSIP_INTERVAL (default 200ms) sets gossip and settle speed;
# ALERTMANAGER_WEB_CONFIG names a --web.config.file (basic auth, TLS) for the instances.
set -euo pipefail

SVC=${JOBDIAGD_SVC_DIR:-/tmp/jobdiagd-svc}
AM=${ALERTMANAGER_BIN:-/usr/bin/prometheus-alertmanager}
PEER_TIMEOUT=${ALERTMANAGER_PEER_TIMEOUT:-15s}
GOSSIP_INTERVAL=${ALERTMANAGER_GOSSIP_INTERVAL:-200ms}
WEB_CONFIG=${ALERTMANAGER_WEB_CONFIG:-}

check() {
  if [ -x "$AM" ]; then
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "alertmanager.sh: $AM missing and not root; run scripts/setup.sh as root" >&2
    return 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus-alertmanager >/dev/null
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

valid_name() {
  [[ $1 =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "alertmanager.sh: bad name $1" >&2; return 2; }
}

valid_port() {
  [[ $1 =~ ^[0-9]{1,5}$ ]] && [ "$1" -le 65535 ] || { echo "alertmanager.sh: bad port $1" >&2; return 2; }
}

# HTTP status of /-/ready (000: no answer). Behind basic auth a 401 still says it is up.
ready_code() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$1/-/ready" 2>/dev/null || true
}

# "<cluster status> <peer count>" from /api/v2/status ("disabled 0" for a single instance).
cluster_state() {
  curl -fsS --max-time 2 "http://127.0.0.1:$1/api/v2/status" 2>/dev/null | python3 -c '
import json, sys
c = json.load(sys.stdin).get("cluster") or {}
print(c.get("status", "?"), len(c.get("peers") or []))' 2>/dev/null || echo "down 0"
}

# Ready: /-/ready answers and, for a peer, its gossip has settled with at least $3 members.
# Alertmanager holds every notification until its gossip settled, so tests must not start before.
wait_ready() {
  local port=$1 pid=$2 peers=${3:-0}
  for _ in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || return 1
    local code
    code=$(ready_code "$port")
    if [ "$code" = 200 ] || { [ "$code" = 401 ] && [ -n "$WEB_CONFIG" ]; }; then
      [ "$peers" -eq 0 ] && return 0
      read -r state n <<<"$(cluster_state "$port")"
      if [ "$state" = ready ] && [ "$n" -ge "$peers" ]; then return 0; fi
    fi
    sleep 0.05
  done
  return 1
}

running_pid() {
  local pidf="$SVC/alertmanager-$1.pid"
  [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null && cat "$pidf"
}

launch() {
  # launch NAME CONFIG PORT [CPORT PEER...]: start in the background and record pid/ports.
  local name=$1 cfg=$2 port=$3
  shift 3
  local cluster=(--cluster.listen-address=)
  local cport=""
  if [ $# -gt 0 ]; then
    cport=$1
    shift
    valid_port "$cport"
    cluster=(--cluster.listen-address="127.0.0.1:$cport" --cluster.peer-timeout="$PEER_TIMEOUT"
      --cluster.gossip-interval="$GOSSIP_INTERVAL")
    local peer
    for peer in "$@"; do
      [[ $peer =~ ^127\.0\.0\.1:[0-9]{1,5}$ ]] || { echo "alertmanager.sh: peers must be 127.0.0.1:PORT, got $peer" >&2; return 2; }
      cluster+=(--cluster.peer="$peer")
    done
  fi
  local web=()
  [ -z "$WEB_CONFIG" ] || web=(--web.config.file="$WEB_CONFIG")
  local dir="$SVC/alertmanager-$name"
  mkdir -p "$dir/data"
  "$AM" --config.file="$cfg" --storage.path="$dir/data" --web.listen-address="127.0.0.1:$port" \
    "${cluster[@]}" "${web[@]}" >>"$SVC/alertmanager-$name.log" 2>&1 &
  echo $! >"$SVC/alertmanager-$name.pid"
  echo "$port" >"$SVC/alertmanager-$name.port"
  if [ -n "$cport" ]; then echo "$cport" >"$SVC/alertmanager-$name.cport"; else rm -f "$SVC/alertmanager-$name.cport"; fi
}

fail_start() {
  local name=$1
  echo "alertmanager.sh: $name did not become ready; log:" >&2
  tail -20 "$SVC/alertmanager-$name.log" >&2 || true
  stop "$name"
  return 1
}

start() {
  local name=$1 cfg=$2 port=${3:-}
  shift $(($# < 3 ? $# : 3))
  valid_name "$name"
  [ -f "$cfg" ] || { echo "alertmanager.sh: no config file $cfg" >&2; return 2; }
  check
  mkdir -p "$SVC"
  local pid
  if pid=$(running_pid "$name"); then
    echo "alertmanager.sh: $name already running (pid $pid)"
    return 0
  fi
  [ -n "$port" ] || port=$(free_port)
  valid_port "$port"
  launch "$name" "$cfg" "$port" "$@"
  pid=$(cat "$SVC/alertmanager-$name.pid")
  # A peer is ready once its gossip settled (it may be the first of its cluster to start).
  wait_ready "$port" "$pid" $(($# > 0 ? 1 : 0)) || fail_start "$name"
  echo "alertmanager.sh: $name ready on 127.0.0.1:$port (pid $pid)"
}

start_pair() {
  local name=$1 cfg=$2
  valid_name "$name"
  [ -f "$cfg" ] || { echo "alertmanager.sh: no config file $cfg" >&2; return 2; }
  check
  mkdir -p "$SVC"
  local p0 p1 c0 c1
  p0=$(free_port) p1=$(free_port) c0=$(free_port) c1=$(free_port)
  launch "$name-0" "$cfg" "$p0" "$c0" "127.0.0.1:$c1"
  launch "$name-1" "$cfg" "$p1" "$c1" "127.0.0.1:$c0"
  wait_ready "$p0" "$(cat "$SVC/alertmanager-$name-0.pid")" 2 || { stop "$name-1"; fail_start "$name-0"; }
  wait_ready "$p1" "$(cat "$SVC/alertmanager-$name-1.pid")" 2 || { stop "$name-0"; fail_start "$name-1"; }
  echo "alertmanager.sh: pair $name ready on 127.0.0.1:$p0 and 127.0.0.1:$p1 (gossip $c0 <-> $c1)"
}

stop() {
  # stop NAME...: one after the other. A peer leaving while the other is up is acked at once; two
  # peers leaving together each wait 10 s for the other's ack.
  local name pid
  for name in "$@"; do
    valid_name "$name"
    if pid=$(running_pid "$name"); then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$SVC/alertmanager-$name.pid" "$SVC/alertmanager-$name.port" "$SVC/alertmanager-$name.cport"
  done
}

case "${1:-}" in
  check) check ;;
  start) shift; [ $# -ge 2 ] || { echo "usage: $0 start NAME CONFIG [PORT [CPORT PEER...]]" >&2; exit 2; }; start "$@" ;;
  start-pair) [ $# -eq 3 ] || { echo "usage: $0 start-pair NAME CONFIG" >&2; exit 2; }; start_pair "$2" "$3" ;;
  stop) [ $# -eq 2 ] || { echo "usage: $0 stop NAME" >&2; exit 2; }; stop "$2" ;;
  stop-pair) [ $# -eq 2 ] || { echo "usage: $0 stop-pair NAME" >&2; exit 2; }; stop "$2-0" "$2-1" ;;
  port) valid_name "$2"; cat "$SVC/alertmanager-$2.port" ;;
  cluster-port) valid_name "$2"; cat "$SVC/alertmanager-$2.cport" ;;
  *)
    echo "usage: $0 check|start NAME CONFIG [PORT [CPORT PEER...]]|start-pair NAME CONFIG|stop NAME|stop-pair NAME|port NAME|cluster-port NAME" >&2
    exit 2
    ;;
esac
