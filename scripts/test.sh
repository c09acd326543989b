#!/usr/bin/env bash
# The test command (README, .ci/run): set up system packages + venv, then lint, type-check,
# check the import floors (docs/architecture.md) and run the whole suite. Tests that need
# Slurm / Prometheus / sshd start them through scripts/services/*.sh themselves (session
# fixtures) and stop them at the end. Arguments go to pytest: `scripts/test.sh --unit` runs only
# the tests that need no service (tests/README.md); CI runs it without arguments, so everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check daemon tests bench
.venv/bin/mypy
.venv/bin/lint-imports --no-logo
exec .venv/bin/pytest -q -p no:cacheprovider "$@"
