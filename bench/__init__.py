"""Benchmarks of the operator on the local kwok control plane; never part of `make test`
(see bench/README.md)."""
