#!/usr/bin/env bash
# The test command (README, .ci/run): set up system packages + venv, then lint, type-check,
# check the import floors (docs/architecture.md) and run the whole suite. Tests that need
# Slurm / Prometheus / sshd start them through scripts/services/*.sh themselves (session
# fixtures) and stop them at the end. Arguments go to pytest: `scripts/test.sh --unit` runs only
# the tests that need no service (tests/README.md); CI runs it without arguments, so everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check daemon sim tests bench
.venv/bin/mypy
.venv/bin/lint-imports --no-logo
# --unit runs on two pytest-xdist workers (JOBDIAGD_TEST_WORKERS to change it): the no-service
# tests share no state (temp dirs, port 0, env through monkeypatch). On the idle 2-core machine
# (1288 tests) one process took 183 s, two workers 106 s; on a loaded one the extra worker does
# not pay. The full run (CI) stays in one process: the service tests share leased services
# (the Slurm cluster) and real-time budgets.
args=("$@")
for a in "$@"; do
  if [ "$a" = "--unit" ]; then
    args=(-n "${JOBDIAGD_TEST_WORKERS:-2}" "${args[@]}")
    # A developer's loop: the fuzz targets try 1/5 of CI's inputs (tests/helpers/fuzz.py).
    export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-quick}"
    break
  fi
done
exec .venv/bin/pytest -q -p no:cacheprovider "${args[@]}"
