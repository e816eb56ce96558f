"""Merging AMP cells (amp_merge.lua): the new cell's write and the sources' status changes in
one script call, all or nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from broker.storage import layout, resend, scripts
from broker.storage.amp import (
    CELL_INDEX_KEYS,
    CELL_PREFIXES,
    CELL_UPDATE,
    CellIndexStore,
    IndexUpdate,
)
from broker.storage.amp_status import CELL_STATUS, STATUS_CALL, StatusChange
from broker.storage.entries import ENTRY_KEYS, NAMESPACE_KEYS, WRITE, WRITE_FILES
from broker.storage.fairshare import GATE, GATE_KEYS, Gate
from broker.storage.records import WriteOutcome, WriteRequest


@dataclass(slots=True)
class MergeVerdict:
    """What a merge call did: `ok`; or the source that changed since it was read (`changed`,
    nothing written); or the new cell's write refused by its gate (`refused`)."""

    ok: bool
    changed: str | None = None
    refused: WriteOutcome | None = None


class CellMergeStore:
    """Writes merges of one namespace's cells."""

    def __init__(self, index: CellIndexStore) -> None:
        self.index = index
        self._script = scripts.register(
            index.redis, [*WRITE_FILES, *resend.FILES, "amp_index.lua", "amp_merge.lua"],
            [resend.SENT_KEYS, resend.SENT, CELL_INDEX_KEYS, NAMESPACE_KEYS, GATE_KEYS,
             ENTRY_KEYS, CELL_PREFIXES, GATE, WRITE, CELL_UPDATE, STATUS_CALL, CELL_STATUS])

    async def merge(self, update: IndexUpdate, request: WriteRequest,
                    sources: Sequence[StatusChange], gate: Gate) -> MergeVerdict:
        """Write the new cell (`update`, `request`, held to `gate`) and apply the sources'
        status changes, in one call: nothing is written unless every source is still the
        version it was read at and the gate admits the write."""
        index, ns = self.index, self.index.namespace
        index_keys, prefixes, update_args = index.blocks(update)
        sent_keys, sent = resend.blocks(ns)
        keys = [*sent_keys, *index_keys, *NAMESPACE_KEYS.pack(
            index=layout.index(ns), ttl=layout.expiries(ns), log=layout.changelog(ns),
            meta=layout.meta(ns), usage=layout.usage(ns), audit=layout.audit(ns)),
            *gate.keys, *ENTRY_KEYS.pack(entry=layout.entry(ns, update.key),
                                         history=layout.history(ns, update.key))]
        args = [*sent, *prefixes, *gate.args, *index.entries.write_args(ns, update.key, request),
                *update_args, *STATUS_CALL.pack(
                    now=request.now, agent=request.agent_id,
                    history_limit=index.entries.history_limit,
                    log_maxlen=index.entries.changelog_maxlen)]
        for change in sources:
            keys += ENTRY_KEYS.pack(entry=layout.entry(ns, change.key),
                                    history=layout.history(ns, change.key))
            args += change.args()
        await index.entries.note_namespace(ns)
        # The call keeps its first reply for a second sending: safe to send again.
        try:
            reply = await index.backend.call(self._script, keys, args, durable=True,
                                             replayable=True)
        finally:
            index.marked.ring()
        verdict = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if verdict == "ok":
            return MergeVerdict(ok=True)
        if verdict == "changed":
            return MergeVerdict(ok=False, changed=reply[1].decode())
        detail = reply[1] if len(reply) > 1 else None
        return MergeVerdict(ok=False, refused=WriteOutcome.decode(["ok", detail]) if detail
                            else WriteOutcome(verdict, {}, False))
