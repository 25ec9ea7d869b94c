"""Prefect tasks: one thin wrapper per session step. Retries, timeouts and the GPU concurrency limit live here;
the work itself lives in the `seis` library."""
