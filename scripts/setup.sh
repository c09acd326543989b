#!/usr/bin/env bash
# Set up everything jobdiagd and its tests need on a fresh Debian machine:
# the system services the integration tests run for real (Slurm, munge, Prometheus,
# promtool, Alertmanager, sshd) and a virtualenv in .venv with the package installed editable.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

SYSTEM_PACKAGES=(slurm-wlm munge prometheus prometheus-alertmanager openssh-server openssh-client systemd)

missing=()
for pkg in "${SYSTEM_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.jobdiagd-installed
# The package and, beside it, the simulator (sim/: tests, demo and bench import jobdiagd_sim;
# a wheel of jobdiagd does not carry it), both editable.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ sim/pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]' -e ./sim 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c 'import jobdiagd, jobdiagd_sim'
  touch "$stamp"
fi
echo "setup: ok ($(.venv/bin/python --version))"
