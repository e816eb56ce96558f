"""What a memory write's outcome becomes for its caller: the entry written, or the error the
client gets (409, 412, 404, 422 for a reused message id), and the warnings that go with it."""

from __future__ import annotations

import msgspec

from broker.core.errors import MempError
from broker.core.models import Entry
from broker.services.idempotency import reused
from broker.storage.records import WriteOutcome


def entry_warnings(entry: Entry) -> list[str]:
    """What a writer should look at: schema violations and flagged merge conflicts."""
    warnings = []
    if entry.schema_violation:
        warnings.append("schema_violation")
    if entry.conflicts is not msgspec.UNSET:
        warnings.append("conflicts")
    return warnings


def settle(outcome: WriteOutcome, namespace: str, key: str, value: bytes | None,
           message_id: str | None) -> Entry:
    """Turn a script's verdict into the entry written, or the error the client gets."""
    if outcome.status == "ok":
        return outcome.entry(namespace, key, value)
    if outcome.status == "reused":
        raise reused(message_id)
    current = outcome.entry(namespace, key)
    if outcome.status == "write_conflict":
        raise MempError(
            "write_conflict",
            "the stored entry wins (newer timestamp or higher agent priority); this write was "
            "not applied",
            {"winner": current},
        )
    if outcome.status == "not_found":
        raise MempError("not_found", f"no entry at key {key!r}", {"key": key})
    raise precondition(None if current.deleted else current, current.version)


def precondition(current: Entry | None, version: int | None = None) -> MempError:
    """412: the entry (or its absence) did not meet the write's condition."""
    details: dict[str, object] = {
        "current_version": version if version is not None else (current.version if current
                                                                 else 0)}
    if current is not None:
        details["current"] = current
    return MempError("precondition_failed", "the entry's version does not match the condition",
                     details)
