"""The broker's one clock, injectable for tests."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def system_clock() -> int:
    """Unix time in milliseconds."""
    return time.time_ns() // 1_000_000
