"""Tools for the local cluster, the chart and tests (scripts; importable for tests)."""
