"""Benchmarks: reproducible measurements, kept apart from the tests (see README, Performance)."""
