"""Waiting in tests for something another process or thread does."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(check: Callable[[], T], timeout_s: float, what: str) -> T:
    """check()'s first true value, polled every 0.1 s; an AssertionError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)
    return value
