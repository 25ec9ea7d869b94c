"""Benchmarks run as their own processes (python -m seis.benchmarks.NAME)."""
