"""Benchmarks run as their own processes (python -m seis.benchmarks.NAME)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def engine_failures_shown() -> Iterator[None]:
    """An engine's failure ends the benchmark with its message made printable (seis.tables.printable): the message
    quotes the engine, its error and its stderr's tail, and an engine tree (--engine, --snapshot) may be an agent's,
    whose escape sequences would otherwise reach the operator's terminal in the traceback."""
    from ..engine_host import EngineError
    from ..tables import printable

    try:
        yield
    except EngineError as e:
        raise SystemExit(f"an engine failed: {printable(str(e))}") from None
