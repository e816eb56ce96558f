"""Proposals: gated writes kept beside the entries until a reviewer decides. Making one and
deciding one (approve, reject, expire) are each one script, so two reviewers approving at once
on two processes cannot both apply it, and an approval writes only while the key still holds
the version the proposal was made against (docs/governance.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.commands.core import AsyncScript

from broker.storage import layout, resend, scripts
from broker.storage.amp import CELL_INDEX_KEYS, CELL_PREFIXES, CELL_UPDATE, CellBlocks
from broker.storage.client import Backend, text
from broker.storage.entries import WRITE, WRITE_FILES, WRITE_KEYS, EntryStore
from broker.storage.fairshare import GATE, GATE_KEYS, Gate
from broker.storage.records import WriteRequest
from broker.storage.scripts import Fields

PROPOSAL_KEYS = Fields("proposal_keys", ("record", "all", "due", "closed"))
# The sweeper's scripts: a namespace's proposal listings and its usage hash.
PURGE_KEYS = Fields("purge_keys", ("all", "closed", "usage"))
PURGE = Fields("purge", ("proposal_prefix", "before", "count"))
ADOPT = Fields("adopt", ("proposal_prefix", "start", "count", "now"))
PROPOSE = Fields("propose", ("id", "base", "doc", "req", "by", "created", "expires",
                             "max_pending"))
DECIDE = Fields("decide", ("id", "decision", "operation", "base", "decided_by", "doc",
                           "details"))
_FILES = (*WRITE_FILES, "delete_entry.lua", "proposal_common.lua")


@dataclass(frozen=True, slots=True)
class StoredProposal:
    status: str
    doc: bytes  # the wire JSON
    req: bytes | None  # what an approval needs to write it (None once decided)
    by: str


class ProposalStore:
    """The proposals of every namespace, on one backend."""

    def __init__(self, backend: Backend, entries: EntryStore) -> None:
        self.backend = backend
        self.redis = client = backend.redis
        self.entries = entries
        self._propose = scripts.register(client, [*_FILES, "propose.lua"],
                                         [WRITE_KEYS, PROPOSAL_KEYS, GATE_KEYS, WRITE, PROPOSE,
                                          GATE])
        self._decide = scripts.register(
            client, [*_FILES, *resend.FILES, "proposal_decide.lua"],
            [resend.SENT_KEYS, resend.SENT, WRITE_KEYS, PROPOSAL_KEYS, GATE_KEYS, WRITE, DECIDE,
             GATE])
        self._decide_cell = scripts.register(
            client, [*WRITE_FILES, *resend.FILES, "delete_entry.lua", "amp_index.lua",
                     "proposal_common.lua", "proposal_decide_cell.lua"],
            [resend.SENT_KEYS, resend.SENT, WRITE_KEYS, PROPOSAL_KEYS, GATE_KEYS,
             CELL_INDEX_KEYS, WRITE, DECIDE, GATE, CELL_PREFIXES, CELL_UPDATE])
        self._purge = scripts.register(client, ["proposal_purge.lua"], [PURGE_KEYS, PURGE])
        self._adopt = scripts.register(client, ["proposal_adopt.lua"], [PURGE_KEYS, ADOPT])

    def _keys(self, namespace: str, key: str, proposal_id: str, req: WriteRequest
              ) -> list[Any]:
        return [*self.entries.write_keys(namespace, key, req.message_id, req.agent_id),
                *PROPOSAL_KEYS.pack(record=layout.proposal(namespace, proposal_id),
                                    all=layout.proposals(namespace),
                                    due=layout.pending_proposals(namespace),
                                    closed=layout.closed_proposals(namespace))]

    async def propose(self, namespace: str, key: str, request: WriteRequest, gate: Gate,
                      **fields: Any) -> tuple[str, str]:
        """Store a pending proposal (PROPOSE fields) if the key is still at `base`, taking
        the tokens of `gate` and fitting its `max_bytes`: ('proposed', id), ('moved', current
        version), ('refused', the encoded refusal: over a rate, `max_pending` or
        `max_bytes`), or a replayed or refused message id ('replay'/'reused', the first
        reply). A namespace whose byte count is not exact is counted first."""
        await self.entries.note_namespace(namespace)
        keys = [*self._keys(namespace, key, fields["id"], request), *gate.keys]
        args = [*self.entries.write_args(namespace, key, request), *PROPOSE.pack(**fields),
                *gate.args]
        # Under a message id the script replays its first reply: safe to send again.
        replayable = bool(request.message_id)
        raw = await self.backend.call(self._propose, keys, args, durable=True,
                                      replayable=replayable)
        if text(raw[0]) == "uncounted":
            await self.entries.fair_share.recount(namespace)
            raw = await self.backend.call(self._propose, keys, args, durable=True,
                                          replayable=replayable)
        return text(raw[0]), text(raw[1])

    async def decide(self, namespace: str, key: str, request: WriteRequest, gate: Gate,
                     cell: CellBlocks | None = None, **fields: Any) -> tuple[str, str]:
        """Approve (writing `request`, held to the quotas of `gate`), reject or expire a
        pending proposal (DECIDE fields). An AMP cell's approval also updates the cell's
        indexes (`cell`, from CellIndexStore.blocks) in the same call. As for a put, a
        namespace whose byte count is not exact is counted first, and an approval over a
        quota is tried once more after expiring the namespace's due entries."""
        keys = [*self._keys(namespace, key, fields["id"], request), *gate.keys]
        args = [*self.entries.write_args(namespace, key, request), *DECIDE.pack(**fields),
                *gate.args]
        script = self._decide
        if cell is not None:
            index_keys, prefixes, update = cell
            keys, args, script = [*keys, *index_keys], [*args, *prefixes, *update], \
                self._decide_cell
        raw = await self._sent(namespace, script, keys, args)
        verdict = text(raw[0])
        if verdict == "uncounted":
            await self.entries.fair_share.recount(namespace)
        elif not (verdict == "quota_exceeded"
                  and await self.entries.expire_due(namespace, request.now, 1000)):
            return verdict, text(raw[1])
        raw = await self._sent(namespace, script, keys, args)
        return text(raw[0]), text(raw[1])

    async def _sent(self, namespace: str, script: AsyncScript, keys: list[Any],
                    args: list[Any]) -> Any:
        """A decision's call, which keeps its first reply for a second sending (a key of its
        own: storage/resend.py), so it is safe to send again."""
        sent_keys, sent = resend.blocks(namespace)
        return await self.backend.call(script, [*sent_keys, *keys], [*sent, *args],
                                       durable=True, replayable=True)

    def _purge_keys(self, namespace: str) -> list[Any]:
        return PURGE_KEYS.pack(all=layout.proposals(namespace),
                               closed=layout.closed_proposals(namespace),
                               usage=layout.usage(namespace))

    async def purge_closed(self, namespace: str, before: int, count: int) -> int:
        """Drop up to `count` proposals closed at or before `before` (ms); how many."""
        return int(await self.backend.call(self._purge, self._purge_keys(namespace), PURGE.pack(
            proposal_prefix=layout.proposal_prefix(namespace), before=before, count=count)))

    async def adopt(self, namespace: str, now: int, count: int = 500) -> int:
        """Bring the namespace's proposals of earlier releases under today's bookkeeping
        (counted, and closed ones set to expire); how many proposals it looked at."""
        start = looked = 0
        while True:
            seen = int(await self.backend.call(
                self._adopt, self._purge_keys(namespace),
                ADOPT.pack(proposal_prefix=layout.proposal_prefix(namespace), start=start,
                           count=count, now=now)))
            looked += seen
            if seen < count:
                return looked
            start += count

    async def load(self, namespace: str, proposal_id: str) -> StoredProposal | None:
        row: Any = await self.redis.hmget(layout.proposal(namespace, proposal_id), "status",
                                          "doc", "req", "by")
        status, doc, req, by = row
        if status is None or doc is None:
            return None
        return StoredProposal(text(status), doc, req, text(by or b""))

    async def newest_first(self, namespace: str, before: tuple[int, str] | None, count: int
                           ) -> list[tuple[str, int]]:
        """Up to `count` proposal ids with their creation times, newest first, after the
        (time, id) cursor `before`."""
        top: Any = f"({before[0]}" if before else "+inf"
        rows: Any = await self.redis.zrevrangebyscore(layout.proposals(namespace), top, "-inf",
                                                      start=0, num=count, withscores=True)
        found = [(text(m), int(s)) for m, s in rows]
        if before is not None:  # the same ms as the cursor: ids before it, newest first
            same: Any = await self.redis.zrevrangebyscore(
                layout.proposals(namespace), before[0], before[0], withscores=True)
            found = sorted([(text(m), int(s)) for m, s in same if text(m) < before[1]],
                           key=lambda r: r[0], reverse=True) + found
        return found[:count]

    async def due(self, namespace: str, now: int, count: int) -> list[str]:
        """Pending proposals whose time is up."""
        rows = await self.redis.zrangebyscore(layout.pending_proposals(namespace), "-inf", now,
                                              0, count)
        return [text(r) for r in rows]

    async def load_many(self, namespace: str, ids: list[str]) -> list[StoredProposal | None]:
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for proposal_id in ids:
                pipe.hmget(layout.proposal(namespace, proposal_id), "status", "doc", "req",
                           "by")
            rows = await pipe.execute()
        return [StoredProposal(text(s), d, r, text(b or b"")) if s and d else None
                for s, d, r, b in rows]
