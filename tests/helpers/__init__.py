"""Shared test helpers (service fixtures) importable from any test package."""
