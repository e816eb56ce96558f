"""Waiting for what a test expects: liveness asserted with a margin a loaded machine cannot
break, never a timing (timing belongs in bench/)."""

from __future__ import annotations

import time
from collections.abc import Callable

WAIT = 15.0  # seconds any single expectation may take before the test fails


def wait_until(condition: Callable[[], object], what: str, timeout: float = WAIT,
               step: float = 0.02, *, ignoring: tuple[type[Exception], ...] = ()) -> float:
    """Poll `condition` until it holds; the seconds that took. An exception of `ignoring`
    counts as not yet; past `timeout` seconds, TimeoutError naming `what`."""
    start = time.monotonic()
    while True:
        try:
            if condition():
                return time.monotonic() - start
        except ignoring:
            pass
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out waiting for {what} ({timeout:g} s)")
        time.sleep(step)
