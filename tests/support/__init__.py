"""Shared test helpers: inputs, manifest entries, roots and pipelines (no test module imports another)."""
