"""The lifecycle engine's status changes of AMP cells (amp_status.lua): what one change
carries, and the script calls of a batch. Each change is a compare-and-set on the entry
version the engine decided from (docs/amp.md, "Lifecycle")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.storage import layout
from broker.storage.client import ScriptCall
from broker.storage.entries import ENTRY_KEYS, content_hash
from broker.storage.records import RawHash
from broker.storage.scripts import Fields

TRANSITIONS = ("stale", "archive", "expire", "purge")  # the lifecycle due sets, by name
STATUS_CHUNK = 100  # status changes per amp_status.lua call: a few milliseconds of Redis
STATUS_KEYS = Fields("status_keys", ("log", "meta", "usage", "audit"))
STATUS_CALL = Fields("status_call", ("now", "agent", "history_limit", "log_maxlen"))
CELL_STATUS = Fields("cell_status", (
    "id", "key", "version", "entry_id", "created", "ttl", "exp",  # the version decided from
    "status", "value", "content_hash", "grow", "clear",  # the new version
    "ref", *(f"due_{t}" for t in TRANSITIONS), "recheck"))  # its index update
# Fields a status change stores empty (priority: '0'): an earlier writer's schema errors,
# merge conflicts, priority and approval are not the engine's.
_CLEARED = {b"sv": b"", b"cf": b"", b"pr": b"0", b"apb": b"", b"pid": b""}


@dataclass(slots=True)
class StatusChange:
    """The lifecycle engine moving one cell to another status (amp_status.lua): compare-and-set
    on the version in `stored`, the value with its new status, and what changes in its
    indexes."""

    id: str
    key: str  # the cell's MEMP key
    stored: RawHash  # the entry's fields as the engine read them
    status: str
    value: bytes  # the cell with its new status, as stored
    ref: int  # the decay reference time the engine saw
    dues: dict[str, int]  # transition -> when it is due, in the new status
    recheck: bool | None  # True: mark for the engine; False: clear; None: keep

    def args(self) -> list[Any]:
        stored = self.stored
        return CELL_STATUS.pack(
            id=self.id, key=self.key, version=stored[b"ver"], entry_id=stored.get(b"id", b""),
            created=stored.get(b"ca", b""), ttl=stored.get(b"ttl", b""),
            exp=stored.get(b"exp", b""), status=self.status, value=self.value,
            content_hash=content_hash(self.value),
            grow=len(self.value) - len(stored.get(b"val", b"")),
            clear="1" if any(stored.get(name, b"") != empty for name, empty in _CLEARED.items())
            else "0",
            ref=self.ref, **{f"due_{t}": self.dues.get(t, "") for t in TRANSITIONS},
            recheck="" if self.recheck is None else ("1" if self.recheck else "0"))


def status_calls(script: Any, keys: list[Any], args: list[Any], namespace: str,
                 changes: Sequence[StatusChange]) -> list[ScriptCall]:
    """The amp_status.lua calls for `changes`, STATUS_CHUNK per call, after the given head of
    keys (index keys, STATUS_KEYS) and arguments (prefixes, STATUS_CALL)."""
    calls: list[ScriptCall] = []
    for at in range(0, len(changes), STATUS_CHUNK):
        chunk_keys, chunk_args = list(keys), list(args)
        for change in changes[at:at + STATUS_CHUNK]:
            chunk_keys += ENTRY_KEYS.pack(entry=layout.entry(namespace, change.key),
                                          history=layout.history(namespace, change.key))
            chunk_args += change.args()
        calls.append((script, chunk_keys, chunk_args))
    return calls
