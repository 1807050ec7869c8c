"""Benchmarks; results are recorded in BENCHMARKS.md."""
