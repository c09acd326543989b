#!/usr/bin/env bash
# sshd on 127.0.0.1 (port $SSHD_PORT, default 2222) with its own ed25519 host and client keys under
# $JOBDIAGD_SVC_DIR/sshd (default /tmp/jobdiagd-svc/sshd). Never touches ~/.ssh or the system sshd.
#   sshd.sh check   -- sshd/ssh-keygen installed (installs openssh-server as root when missing)
#   sshd.sh start   -- create keys/config if needed, start sshd in the background, wait until it listens
#   sshd.sh stop    -- stop the sshd started by this script (by PID)
#   sshd.sh status  -- exit 0 when running
#   sshd.sh env     -- print SSHD_PORT, SSH_KEY, SSH_KNOWN_HOSTS, SSH_USER for clients
set -euo pipefail

SVC=${JOBDIAGD_SVC_DIR:-/tmp/jobdiagd-svc}
DIR=$SVC/sshd
PORT=${SSHD_PORT:-2222}
PIDFILE=$DIR/sshd.pid
SSHD=${SSHD_BIN:-/usr/sbin/sshd}

check() {
  if [ -x "$SSHD" ] && command -v ssh-keygen >/dev/null; then
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "sshd.sh: openssh-server missing and not root; run scripts/setup.sh as root" >&2
    return 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null
}

running() {
  [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

listening() {
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

prepare() {
  mkdir -p "$DIR"
  chmod 700 "$DIR"
  # Nothing creates the privilege-separation directory on these machines.
  mkdir -p /run/sshd
  [ -f "$DIR/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/ssh_host_ed25519_key" -C jobdiagd-host
  [ -f "$DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/id_ed25519" -C jobdiagd-client
  cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
  chmod 600 "$DIR/authorized_keys"
  echo "[127.0.0.1]:$PORT $(cut -d' ' -f1,2 "$DIR/ssh_host_ed25519_key.pub")" >"$DIR/known_hosts"
  cat >"$DIR/sshd_config" <<CFG
ListenAddress 127.0.0.1
Port $PORT
HostKey $DIR/ssh_host_ed25519_key
PidFile $PIDFILE
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile $DIR/authorized_keys
AllowTcpForwarding yes
StrictModes no
LogLevel INFO
CFG
}

start() {
  check
  if running; then
    echo "sshd.sh: already running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"
    return 0
  fi
  prepare
  "$SSHD" -t -f "$DIR/sshd_config"
  "$SSHD" -D -e -f "$DIR/sshd_config" >>"$DIR/sshd.log" 2>&1 &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 100); do
    if listening; then
      echo "sshd.sh: listening on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"
      return 0
    fi
    if ! running; then break; fi
    sleep 0.05
  done
  echo "sshd.sh: sshd did not start; log:" >&2
  tail -20 "$DIR/sshd.log" >&2 || true
  return 1
}

stop() {
  if running; then
    pid=$(cat "$PIDFILE")
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  fi
  rm -f "$PIDFILE"
}

env_out() {
  echo "SSHD_PORT=$PORT"
  echo "SSH_KEY=$DIR/id_ed25519"
  echo "SSH_KNOWN_HOSTS=$DIR/known_hosts"
  echo "SSH_USER=$(id -un)"
}

case "${1:-}" in
  check) check ;;
  start) start ;;
  stop) stop ;;
  status) running ;;
  env) env_out ;;
  *) echo "usage: $0 check|start|stop|status|env" >&2; exit 2 ;;
esac
