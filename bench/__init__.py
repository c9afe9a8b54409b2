"""Benchmarks: reproducible measurements, kept apart from the tests (see docs/performance.md)."""
