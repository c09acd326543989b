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
# The tests run on pytest-xdist workers (tests/README.md, "Parallel runs"). --unit: two workers
# (JOBDIAGD_TEST_WORKERS to change it): the no-service tests are CPU-bound, so more workers than
# the machine's 2 cores do not pay. The full run (CI): five workers. Most service tests wait on
# real time (a daemon ticking, a job stepping, a retry backing off), so five overlap their
# waits on 2 cores; tests that must not overlap share a worker (xdist groups, --dist loadgroup:
# the shared Slurm cluster's tests, a module's module-scoped fixture), and the longest start
# first (tests/helpers/parallel.py). Measured: tests/README.md.
# Bytecode caches (__pycache__, gitignored) are written even where the environment turns them
# off (PYTHONDONTWRITEBYTECODE=1, as container images set it): otherwise every xdist worker
# compiles the package and rewrites the tests' asserts from source again while collecting (6 s
# of CPU instead of 2.5), and so does each daemon and CLI the tests start (0.6 s instead of 0.8).
export PYTHONDONTWRITEBYTECODE=
args=("$@")
workers=${JOBDIAGD_TEST_WORKERS:-5}
for a in "$@"; do
  if [ "$a" = "--unit" ]; then
    workers=${JOBDIAGD_TEST_WORKERS:-2}
    # A developer's loop: the fuzz targets try 1/5 of CI's inputs (tests/helpers/fuzz.py).
    export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-quick}"
    break
  fi
done
exec .venv/bin/pytest -q -p no:cacheprovider -n "$workers" --dist loadgroup "${args[@]}"
