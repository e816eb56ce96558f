"""What MEMP paths show of the AMP namespace, which belongs to AMP (docs/amp.md).

Through REST, messages, query, history, snapshots, live events and shares, a cell is shown only
to a caller that `/amp` would let read it: one that may act for any agent there (the admin key,
`impersonate` or `admin` on the namespace), or whose own agent AMP's policy lets read the cell.
A deleted or expired cell is shown to no one, and no MEMP write or delete reaches the namespace:
cells change only through `/amp`, so AMP's state machine cannot be bypassed."""

from __future__ import annotations

import msgspec

from broker.amp.cells import MemoryCell, decode_stored_cell, parse_time
from broker.amp.rules import readers
from broker.core.errors import MempError
from broker.core.models import Entry
from broker.core.nesting import TooDeep
from broker.services.auth import Principal
from broker.services.visibility import Readers, Viewer


def _cell(entry: Entry) -> MemoryCell | None:
    if entry.value is None:
        return None
    try:
        return decode_stored_cell(entry.value)
    except (msgspec.DecodeError, TooDeep):  # not a cell AMP can read: nothing to show
        return None


def _hidden(cell: MemoryCell, now: int) -> bool:
    life = cell.lifecycle
    if life.status == "deleted":
        return True
    try:
        return life.expires_at is not None and parse_time(life.expires_at, "expires_at") <= now
    except MempError:
        return False


class CellVisibility:
    """AMP's read policy for MEMP reads and events of the AMP namespace (a `ReadPolicy`)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def guards(self, namespace: str) -> bool:
        return namespace == self.namespace

    def refuse_write(self, namespace: str) -> None:
        if namespace == self.namespace:
            raise MempError(
                "forbidden", f"namespace {namespace!r} holds AMP memory cells: create, change "
                "and delete them through /amp (admins repair with POST /amp/import)",
                {"namespace": namespace, "use": "/amp"})

    def viewer(self, principal: Principal) -> Viewer:
        return Viewer(principal.agent_id or "",
                      everything=principal.can("impersonate", self.namespace))

    def shows(self, viewer: Viewer, entry: Entry, now: int) -> bool:
        """Whether `viewer` may see this version of a cell's entry."""
        cell = _cell(entry)
        if cell is None or _hidden(cell, now):
            return False
        return viewer.may_read(tuple(readers(cell)))

    def shown(self, viewer: Viewer, entries: list[Entry], now: int) -> list[Entry]:
        return [e for e in entries if self.shows(viewer, e, now)]

    def history(self, viewer: Viewer, versions: list[Entry], now: int) -> list[Entry] | None:
        """The versions `viewer` may see, or None when the cell itself is hidden from it (it is
        deleted, expired or unreadable now: then none of its past is shown either)."""
        if not versions or not self.shows(viewer, versions[0], now):
            return None
        return [v for v in versions if self.shows(viewer, v, now)]

    def audience(self, entry: Entry, kind: str) -> tuple[Entry, str, Readers]:
        """A change event as subscribers of the AMP namespace get it, and the globs of the
        agents it goes to (beside those who see everything). A cell's soft delete is sent as a
        `delete` without its content: the cell is gone from every MEMP read."""
        cell = _cell(entry)
        if cell is None:
            return entry, kind, ()
        audience = tuple(readers(cell))
        if cell.lifecycle.status == "deleted":
            return msgspec.structs.replace(entry, value=None, deleted=True), "delete", audience
        return entry, kind, audience
