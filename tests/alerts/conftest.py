"""Fixtures for the alert tests: real Alertmanagers and the webhook they deliver to."""

from tests.helpers.alertmanager import (  # noqa: F401  (fixture re-exports)
    alertmanager,
    alertmanager_pair,
    am_dir,
    webhook,
)
