"""What a caller gets when a request fails: one mapping, for REST, protocol messages and MCP,
from what the services raised to the broker's error, logged once per kind. The store out of
reach is a 503 with `Retry-After` (saying whether a write was applied), and a warning through
the process's outage throttle; out of memory has a throttle of its own (Redis still answers,
so no outage begins); a corrupt record is a 500 naming it, and an error line."""

from __future__ import annotations

import logging

from broker.core.errors import MempError, corrupt_record
from broker.runtime.logs import Throttle
from broker.storage.client import STORE_DOWN, out_of_memory, store_down
from broker.storage.records import CorruptRecord

log = logging.getLogger("memp")
OUTAGE_LOG_SECONDS = 30.0  # while the store is out of reach, one warning per this many seconds

# What a request may fail with: the broker's own refusals and the store's failures.
FAILURES: tuple[type[Exception], ...] = (MempError, CorruptRecord, *STORE_DOWN)


class Failures:
    """Turns a failure into the error the caller gets, logging what an operator must see."""

    def __init__(self) -> None:
        store = logging.getLogger("memp.store")
        self.outage = Throttle(store, OUTAGE_LOG_SECONDS)  # the store watch ends it
        self.store_full = Throttle(store, OUTAGE_LOG_SECONDS)

    def throttle(self, exc: BaseException) -> Throttle:
        """Where a store failure's warning goes: out of memory has its own throttle."""
        return self.store_full if out_of_memory(exc) else self.outage

    def error(self, exc: Exception, where: str) -> MempError:
        """The error for `exc` (one of FAILURES), raised while serving `where`."""
        if isinstance(exc, MempError):
            return exc
        if isinstance(exc, CorruptRecord):
            log.error("corrupt record on %s: %s", where, exc)
            return corrupt_record(exc)
        if out_of_memory(exc):  # Redis answers: no outage, whose end the store watch would say
            self.store_full.failure("Redis is out of memory, refusing writes: %s", exc)
        else:
            self.outage.failure("store unavailable, answering 503: %s", exc)
        return store_down(exc)
