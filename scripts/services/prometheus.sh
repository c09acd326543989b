#!/usr/bin/env bash
# Prometheus 2.42 / promtool from Debian for jobdiagd's tests and for reading a job's TSDB by hand.
#   prometheus.sh check                              -- prometheus + promtool installed (installs the package as root)
#   prometheus.sh start NAME CONFIG DATA_DIR [PORT]  -- background Prometheus on 127.0.0.1:PORT (free port if omitted),
#                                                       pid/port under $JOBDIAGD_SVC_DIR/prometheus-NAME.{pid,port}; waits for /-/ready
#   prometheus.sh stop NAME                          -- stop it (by PID)
#   prometheus.sh port NAME                          -- print its port
#   prometheus.sh view TSDB_DIR [PORT]               -- foreground read-only view of a finished job's TSDB (no scrape targets,
#                                                       100y retention so old blocks survive); use a copy for anything live
set -euo pipefail

SVC=${JOBDIAGD_SVC_DIR:-/tmp/jobdiagd-svc}
PROM=${PROMETHEUS_BIN:-/usr/bin/prometheus}
PROMTOOL=${PROMTOOL_BIN:-/usr/bin/promtool}

check() {
  if [ -x "$PROM" ] && [ -x "$PROMTOOL" ]; then
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "prometheus.sh: prometheus/promtool missing and not root; run scripts/setup.sh as root" >&2
    return 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_ready() {
  local port=$1 pid=$2
  for _ in $(seq 1 200); do
    if curl -fsS "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1; then return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

start() {
  local name=$1 cfg=$2 data=$3 port=${4:-}
  [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "prometheus.sh: bad name $name" >&2; return 2; }
  check
  mkdir -p "$SVC" "$data"
  local pidf="$SVC/prometheus-$name.pid"
  if [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; then
    echo "prometheus.sh: $name already running (pid $(cat "$pidf"))"
    return 0
  fi
  [ -n "$port" ] || port=$(free_port)
  "$PROM" --config.file="$cfg" --storage.tsdb.path="$data" --web.listen-address="127.0.0.1:$port" \
    --storage.tsdb.use-lockfile --log.level=warn >>"$SVC/prometheus-$name.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$pidf"
  echo "$port" >"$SVC/prometheus-$name.port"
  if wait_ready "$port" "$pid"; then
    echo "prometheus.sh: $name ready on 127.0.0.1:$port (pid $pid)"
  else
    echo "prometheus.sh: $name did not become ready; log:" >&2
    tail -20 "$SVC/prometheus-$name.log" >&2 || true
    kill "$pid" 2>/dev/null || true
    rm -f "$pidf"
    return 1
  fi
}

stop() {
  local pidf="$SVC/prometheus-$1.pid"
  if [ -f "$pidf" ]; then
    local pid
    pid=$(cat "$pidf")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    fi
    rm -f "$pidf" "$SVC/prometheus-$1.port"
  fi
}

view() {
  local data=$1 port=${2:-9190}
  check
  local cfg
  cfg=$(mktemp --suffix=.yml)
  printf 'global:\n  scrape_interval: 1h\nscrape_configs: []\n' >"$cfg"
  echo "Open http://localhost:$port"
  exec "$PROM" --config.file="$cfg" --storage.tsdb.path="$data" --storage.tsdb.retention.time=100y \
    --storage.tsdb.use-lockfile --query.lookback-delta=15m --web.listen-address="127.0.0.1:$port"
}

case "${1:-}" in
  check) check ;;
  start) shift; start "$@" ;;
  stop) stop "$2" ;;
  port) cat "$SVC/prometheus-$2.port" ;;
  view) shift; view "$@" ;;
  *) echo "usage: $0 check|start NAME CONFIG DATA [PORT]|stop NAME|port NAME|view DIR [PORT]" >&2; exit 2 ;;
esac
