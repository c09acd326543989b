#!/usr/bin/env bash
# Live demo on a fresh machine: a simulated MaxText job trains, then hangs; jobdiagd's daemon
# (default console notifier) pages the hang with its triage within about a minute, then prints
# the job-end report when the job is cancelled. No Slurm needed (outputs-root discovery mode).
#   scripts/demo.sh [--step-time 1] [--hang-after 25] [--dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
exec .venv/bin/python -m jobdiagd_sim.demo "$@"
