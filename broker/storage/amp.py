"""The AMP bridge's records beside the cells' MEMP entries: per-cell index records, due-time
sets for the lifecycle engine, creation order and the term index for search, and the writes
that change a cell and its indexes in one script call. The AMP rules that decide what goes
into an update (decay, due times, readers) are the bridge's; this module only stores them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from broker.core.doorbell import Doorbell
from broker.storage import layout, resend, scripts
from broker.storage.amp_status import (
    CELL_STATUS,
    STATUS_CALL,
    STATUS_KEYS,
    TRANSITIONS,
    StatusChange,
    status_calls,
)
from broker.storage.amp_vectors import logged
from broker.storage.client import Backend, ScriptCall, text
from broker.storage.entries import (
    COMMON_FILES,
    ENTRY_KEYS,
    NAMESPACE_KEYS,
    WRITE,
    WRITE_FILES,
    EntryStore,
)
from broker.storage.fairshare import GATE, GATE_KEYS, Gate, open_gate
from broker.storage.records import (
    CorruptRecord,
    RawHash,
    WriteOutcome,
    WriteRequest,
    live_entry,
    skipped,
)
from broker.storage.scripts import Fields

RECORD_FIELDS = ("key", "status", "ref", "count", "accessed")
COMMIT_CHUNK = 50  # changes per amp_commit.lua call: a few milliseconds of Redis at most

CELL_INDEX_KEYS = Fields("cell_index_keys", ("created", *(f"due_{t}" for t in TRANSITIONS),
                                             "recheck", "unposted",
                                             "unembedded"))
CELL_PREFIXES = Fields("cell_prefixes", ("entry_prefix", "record_prefix", "term_prefix"))
CHANGE = Fields("change", ("writes",))
CELL_UPDATE = Fields("cell_update", (
    "id", "key", "version", "status", "ref", "count", "accessed", "created",
    *(f"due_{t}" for t in TRANSITIONS), "recheck", "readers", "expires"), rest="terms")
CELL_LOAD = Fields("cell_load", ("entry_prefix",), rest="fields")
CELL_READ_KEYS = Fields("cell_read_keys", ("record", "recheck"))
CELL_READ = Fields("cell_read", ("entry_prefix", "id", "agent", "now"), rest="fields")
CELL_TOUCH_KEYS = Fields("cell_touch_keys", ("recheck",), rest="records", counted=False)
CELL_TOUCH = Fields("cell_touch", ("id", "now"))
CELL_POST_KEYS = Fields("cell_post_keys", ("unposted",))
CELL_POST = Fields("cell_post", ("record_prefix", "term_prefix", "limit"))
CELL_TERMS_KEYS = Fields("cell_terms_keys", ("unposted",), rest="term_sets",
                         counted=False)
CELL_TERMS = Fields("cell_terms", ("record_prefix",), rest="terms")


@dataclass(slots=True)
class CellRecord:
    """What the indexes know about a cell without reading its entry."""

    id: str
    key: str
    status: str
    ref: int
    count: int
    accessed: int | None

    @classmethod
    def from_values(cls, cell_id: str, values: Sequence[bytes | None]) -> CellRecord:
        """From the values of RECORD_FIELDS, in that order (an HMGET reply)."""
        key, status, ref, count, accessed = values
        try:
            if key is None or status is None or ref is None:
                raise ValueError("key, status or ref missing")
            return cls(cell_id, key.decode(), status.decode(), int(ref), int(count or 0),
                       int(accessed) if accessed else None)
        except ValueError as exc:
            raise CorruptRecord(f"stored index record of AMP cell {cell_id}: {exc}") from None


@dataclass(slots=True)
class IndexUpdate:
    """What one cell's write (or the engine's look at it) changes in its indexes."""

    id: str
    key: str  # the cell's MEMP key
    status: str
    ref: int  # the decay reference time the writer saw
    # The entry version the update describes; it applies only while the entry still holds
    # it. A write committed with the update fills it in.
    version: int | None = None
    count: int | None = None  # the access count to set (create, import)
    accessed: int | None = None
    created: int | None = None  # creation time, when not yet in the creation order
    dues: dict[str, int] = field(default_factory=dict)  # transition -> when it is due
    recheck: bool | None = None  # True: mark for the engine; False: clear; None: keep
    readers: Sequence[str] = ()  # globs of the agents that may read the cell
    expires: int | None = None
    terms: Sequence[str] | None = None  # None: the searchable text did not change

    def args(self) -> list[Any]:
        def opt(value: int | None) -> int | str:
            return "" if value is None else value

        return CELL_UPDATE.pack(
            id=self.id, key=self.key, version=opt(self.version), status=self.status,
            ref=self.ref, count=opt(self.count), accessed=opt(self.accessed),
            created=opt(self.created),
            **{f"due_{t}": self.dues.get(t, "") for t in TRANSITIONS},
            recheck="" if self.recheck is None else ("1" if self.recheck else "0"),
            readers=" ".join(self.readers), expires=opt(self.expires),
            terms=None if self.terms is None else list(self.terms))


# A cell's index keys, its namespace's prefixes and one update, as a script's KEYS and ARGV.
CellBlocks = tuple[list[Any], list[Any], list[Any]]


def _loaded(cell_id: str, row: list[Any]) -> tuple[CellRecord, RawHash]:
    """A record and its entry's fields from a row of amp_load.lua or amp_read.lua."""
    raw = row[len(RECORD_FIELDS)]
    return (CellRecord.from_values(cell_id, row[:len(RECORD_FIELDS)]),
            dict(zip(raw[::2], raw[1::2], strict=True)))


def _verdict(raw: Any) -> bool | WriteOutcome:
    """One write's verdict from amp_commit.lua: applied, lost, or a gate's refusal."""
    if isinstance(raw, list):
        return WriteOutcome.decode(["ok", raw[1]])
    return bool(raw == b"ok")


class CellIndexStore:
    """The AMP records and indexes of one namespace, and the cells' writes."""

    def __init__(self, backend: Backend, entries: EntryStore, namespace: str) -> None:
        self.backend = backend
        self.redis = client = backend.redis
        self.entries = entries
        self.namespace = namespace
        # Rung after every write of this process that marks cells for the background loops
        # (their terms to post, their vectors to make).
        self.marked = Doorbell()
        ns = namespace
        self._load = scripts.register(client, ["amp_load.lua"], [CELL_LOAD])
        self._read = scripts.register(client, ["amp_common.lua", "amp_read.lua"],
                                      [CELL_READ_KEYS, CELL_READ])
        self._touch = scripts.register(client, ["amp_common.lua", "amp_touch.lua"],
                                       [CELL_TOUCH_KEYS, CELL_TOUCH])
        self._commit = scripts.register(
            client, [*WRITE_FILES, *resend.FILES, "amp_index.lua", "amp_commit.lua"],
            [resend.SENT_KEYS, resend.SENT, CELL_INDEX_KEYS, NAMESPACE_KEYS, GATE_KEYS,
             ENTRY_KEYS, CELL_PREFIXES, GATE, CHANGE, WRITE, CELL_UPDATE])
        self._status = scripts.register(
            client, [*COMMON_FILES, "amp_index.lua", "amp_status.lua"],
            [CELL_INDEX_KEYS, STATUS_KEYS, ENTRY_KEYS, CELL_PREFIXES, STATUS_CALL, CELL_STATUS])
        self._post = scripts.register(client, ["amp_post.lua"], [CELL_POST_KEYS, CELL_POST])
        self._match = scripts.register(client, ["amp_match.lua"],
                                       [CELL_TERMS_KEYS, CELL_TERMS])
        self._index_keys = CELL_INDEX_KEYS.pack(
            created=layout.amp_created(ns), recheck=layout.amp_recover(ns),
            unposted=layout.amp_unposted(ns), unembedded=layout.amp_unembedded(ns),
            **{f"due_{t}": layout.amp_due(ns, t) for t in TRANSITIONS})
        self._namespace_keys = NAMESPACE_KEYS.pack(
            index=layout.index(ns), ttl=layout.expiries(ns), log=layout.changelog(ns),
            meta=layout.meta(ns), usage=layout.usage(ns), audit=layout.audit(ns))
        self._prefixes = CELL_PREFIXES.pack(
            entry_prefix=layout.entry_prefix(ns), record_prefix=layout.amp_cell(ns, ""),
            term_prefix=layout.amp_term(ns, ""))

    def blocks(self, update: IndexUpdate) -> CellBlocks:
        """The index keys, prefixes and `update` for a script that indexes a cell it writes
        (an approved proposal: storage/proposals.py)."""
        return list(self._index_keys), list(self._prefixes), update.args()

    def live_entry(self, key: str, raw: RawHash, now: int) -> Any:
        """The cell's MEMP entry from its raw fields, or None when deleted or expired."""
        return live_entry(self.namespace, key, raw, now)

    async def load(self, cell_ids: Iterable[str], *, strict: bool = False
                   ) -> dict[str, tuple[CellRecord, RawHash]]:
        """The cells' index records with their MEMP entries' raw fields, read together in one
        call; cells without a record are left out, and so are (logged) those whose record
        cannot be read, unless `strict` (a read of that very cell: CorruptRecord)."""
        ids = list(cell_ids)
        if not ids:
            return {}
        rows = await self.backend.call(
            self._load, [layout.amp_cell(self.namespace, i) for i in ids],
            CELL_LOAD.pack(entry_prefix=layout.entry_prefix(self.namespace),
                           fields=list(RECORD_FIELDS)))
        loaded = {}
        for cell_id, row in zip(ids, rows, strict=True):
            if not row:
                continue
            try:
                loaded[cell_id] = _loaded(cell_id, row)
            except CorruptRecord as exc:
                if strict:
                    raise
                skipped(exc)
        return loaded

    async def read(self, cell_id: str, agent: str, now: int
                   ) -> tuple[CellRecord, RawHash, int] | None:
        """`load` of one cell that also counts the read when the cell's record lets `agent`
        read it; the count is the new access count, or -1 when the read was not counted."""
        row = await self.backend.call(
            self._read,
            CELL_READ_KEYS.pack(record=layout.amp_cell(self.namespace, cell_id),
                                recheck=layout.amp_recover(self.namespace)),
            CELL_READ.pack(entry_prefix=layout.entry_prefix(self.namespace), id=cell_id,
                           agent=agent, now=now, fields=list(RECORD_FIELDS)))
        if not row:
            return None
        return (*_loaded(cell_id, row), int(row[-1]))

    async def touch(self, reads: list[tuple[str, int]]) -> list[int]:
        """Count reads (cell id, time): each cell's new access count, -1 where it is gone."""
        keys = CELL_TOUCH_KEYS.pack(recheck=layout.amp_recover(self.namespace),
                                    records=[layout.amp_cell(self.namespace, cell_id)
                                             for cell_id, _ in reads])
        args = [value for cell_id, now in reads for value in CELL_TOUCH.pack(id=cell_id, now=now)]
        return [int(c) for c in await self.backend.call(self._touch, keys, args)]

    async def commit(self, changes: Sequence[tuple[IndexUpdate, WriteRequest | None]]
                     ) -> list[bool]:
        """Write cells and update their indexes: each change's write, if it has one, then, if
        the write succeeded, its index update, in one round trip (COMMIT_CHUNK changes per
        script call, so that no call holds Redis long). Returns, per change, whether it was
        applied: False where a write lost its compare-and-set (the cell changed meanwhile)."""
        return [v is True for v in await self._commit_once(changes, open_gate(self.namespace))]

    async def commit_held(self, changes: Sequence[tuple[IndexUpdate, WriteRequest | None]],
                          gate: Gate) -> list[bool | WriteOutcome]:
        """`commit` with every write held to `gate` (its rates and quotas, each write taking
        its tokens in the same script): per change True (applied), False (lost its
        compare-and-set) or the refusal (`rate_limited`, `quota_exceeded`), nothing written.
        As for a put, a byte count not yet exact is counted first and a write over a quota is
        tried once more after expiring the namespace's due entries, without new tokens."""
        verdicts = await self._commit_once(changes, gate)
        again = {at: v.status for at, v in enumerate(verdicts) if isinstance(v, WriteOutcome)
                 and v.status in ("uncounted", "quota_exceeded")}
        if not again:
            return verdicts
        if "uncounted" in again.values():
            await self.entries.fair_share.recount(self.namespace)
        elif not await self.entries.expire_due(
                self.namespace, min(r.now for _, r in changes if r is not None), 1000):
            return verdicts
        retried = await self._commit_once([changes[at] for at in again], replace(gate, cost=0))
        for at, verdict in zip(again, retried, strict=True):
            verdicts[at] = verdict
        return verdicts

    async def _commit_once(self, changes: Sequence[tuple[IndexUpdate, WriteRequest | None]],
                           gate: Gate) -> list[bool | WriteOutcome]:
        if not changes:
            return []
        await self.entries.note_namespace(self.namespace)
        # Each call keeps its first reply for a second sending: safe to send again.
        try:
            replies = await self.backend.run(self._commit_calls(changes, gate, kept=True),
                                             durable=True, replayable=True)
        finally:
            self.marked.ring()
        return self._commit_verdicts(changes, replies)

    async def change_status(self, changes: Sequence[StatusChange], now: int, agent: str,
                            looks: Sequence[IndexUpdate] = ()) -> list[bool]:
        """Apply the lifecycle engine's status changes (amp_status.lua, STATUS_CHUNK per call)
        and, in the same round trip, the index updates of cells it looked at and left
        (`looks`: amp_commit.lua without writes). Returns, per change, whether it was
        applied: False where the cell changed since the engine read it."""
        if not changes and not looks:
            return []
        await self.entries.note_namespace(self.namespace)
        ns = self.namespace
        keys = [*self._index_keys, *STATUS_KEYS.pack(
            log=layout.changelog(ns), meta=layout.meta(ns), usage=layout.usage(ns),
            audit=layout.audit(ns))]
        args = [*self._prefixes, *STATUS_CALL.pack(
            now=now, agent=agent, history_limit=self.entries.history_limit,
            log_maxlen=self.entries.changelog_maxlen)]
        calls = status_calls(self._status, keys, args, ns, changes)
        plain = [(update, None) for update in looks]
        try:
            replies = await self.backend.run([*calls, *self._commit_calls(plain)], durable=True)
        finally:
            self.marked.ring()
        return [v == b"ok" for call in replies[:len(calls)] for v in call]

    def _commit_calls(self, changes: Sequence[tuple[IndexUpdate, WriteRequest | None]],
                      gate: Gate | None = None, *, kept: bool = False) -> list[ScriptCall]:
        """amp_commit.lua's calls for the changes, every write held to `gate` (none: open);
        `kept` calls keep their first reply for a second sending (storage/resend.py)."""
        ns = self.namespace
        gate = gate or open_gate(ns)
        calls: list[ScriptCall] = []
        for at in range(0, len(changes), COMMIT_CHUNK):
            sent_keys, sent = resend.blocks(ns, kept=kept)
            keys: list[Any] = [*sent_keys, *self._index_keys, *self._namespace_keys,
                               *gate.keys]
            args: list[Any] = [*sent, *self._prefixes, *gate.args]
            for update, request in changes[at:at + COMMIT_CHUNK]:
                args += CHANGE.pack(writes="0" if request is None else "1")
                if request is not None:
                    keys += ENTRY_KEYS.pack(entry=layout.entry(ns, update.key),
                                            history=layout.history(ns, update.key))
                    args += self.entries.write_args(ns, update.key, request)
                args += update.args()
            calls.append((self._commit, keys, args))
        return calls

    @staticmethod
    def _commit_verdicts(changes: Sequence[tuple[IndexUpdate, WriteRequest | None]],
                         replies: list[Any]) -> list[bool | WriteOutcome]:
        verdicts = iter([v for call in replies for v in call])
        return [True if request is None else _verdict(next(verdicts)) for _, request in changes]

    async def due(self, transition: str, as_of: int, limit: int) -> list[str]:
        found = await self.redis.zrangebyscore(layout.amp_due(self.namespace, transition),
                                               "-inf", as_of, 0, limit)
        return [text(i) for i in found]

    async def take_recovering(self, limit: int) -> list[str]:
        """Remove and return up to `limit` recheck marks."""
        found = await self.redis.spop(layout.amp_recover(self.namespace), limit)
        return [text(i) for i in found or []]

    def _terms_keys(self, terms: Sequence[str]) -> list[str]:
        ns = self.namespace
        return CELL_TERMS_KEYS.pack(unposted=layout.amp_unposted(ns),
                                    term_sets=[layout.amp_term(ns, t) for t in terms])

    async def by_term(self, terms: Iterable[str]) -> set[str]:
        """The cells whose text has any of the terms, posted to the term sets or not yet."""
        words = list(terms)
        if not words:
            return set()
        found = await self.backend.call(
            self._match, self._terms_keys(words),
            CELL_TERMS.pack(record_prefix=layout.amp_cell(self.namespace, ""), terms=words))
        return {text(i) for i in found}

    async def post(self, limit: int) -> int:
        """Post the changed search terms of up to `limit` cells to the term sets (amp_post.lua);
        returns how many cells it took."""
        return int(await self.backend.call(
            self._post, CELL_POST_KEYS.pack(unposted=layout.amp_unposted(self.namespace)),
            CELL_POST.pack(record_prefix=layout.amp_cell(self.namespace, ""),
                           term_prefix=layout.amp_term(self.namespace, ""), limit=limit)))

    async def term_sizes(self, terms: Sequence[str]) -> dict[str, int]:
        """How many cells each term's set holds (posted terms only)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for term in terms:
                pipe.scard(layout.amp_term(self.namespace, term))
            sizes = await pipe.execute()
        return {term: int(size) for term, size in zip(terms, sizes, strict=True)}

    async def access(self, cell_ids: Sequence[str]) -> list[tuple[str | None, str | None]]:
        """Each cell's status and the globs of the agents that may read it, from its index
        record alone (None for what the record does not hold)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for cell_id in cell_ids:
                pipe.hmget(layout.amp_cell(self.namespace, cell_id), "status", "readers")
            rows = await pipe.execute()
        return [(text(s) if s is not None else None, text(r) if r is not None else None)
                for s, r in rows]

    async def created_between(self, start: int | None, end: int | None, offset: int,
                              limit: int) -> list[str]:
        """Ids by creation time, newest first, optionally bounded by time."""
        found = await self.redis.zrevrangebyscore(
            layout.amp_created(self.namespace), "+inf" if end is None else end,
            "-inf" if start is None else start, start=offset, num=limit)
        return [text(i) for i in found]

    async def _erase_proposals(self, keys: set[str]) -> None:
        """Remove every proposal for these keys: a proposal holds the value it proposed."""
        ns = self.namespace
        ids = [text(i) for i in await self.redis.zrange(layout.proposals(ns), 0, -1)]
        if not ids:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for proposal_id in ids:
                pipe.hget(layout.proposal(ns, proposal_id), "key")
            found = await pipe.execute()
        doomed = [i for i, key in zip(ids, found, strict=True) if key and text(key) in keys]
        if doomed:
            async with self.redis.pipeline(transaction=True) as pipe:
                for proposal_id in doomed:
                    pipe.delete(layout.proposal(ns, proposal_id))
                pipe.zrem(layout.proposals(ns), *doomed)
                pipe.zrem(layout.pending_proposals(ns), *doomed)
                await pipe.execute()

    async def purge(self, cells: dict[str, tuple[str, set[str]]]) -> None:
        """Erase cells for good (cell id -> its MEMP key and the terms of its current text):
        their entries, history and change-log records, then every index entry, including each
        term the record names as posted or to be posted."""
        ids = list(cells)
        async with self.redis.pipeline(transaction=False) as pipe:
            for cell_id in ids:
                pipe.hmget(layout.amp_cell(self.namespace, cell_id), "terms", "posted")
            rows = await pipe.execute()
        await self.entries.erase(self.namespace, [key for key, _ in cells.values()])
        await self._erase_proposals({key for key, _ in cells.values()})
        ns = self.namespace
        async with self.redis.pipeline(transaction=True) as pipe:
            for cell_id, row in zip(ids, rows, strict=True):
                indexed = {w for value in row if value for w in text(value).split()}
                pipe.delete(layout.amp_cell(ns, cell_id))
                pipe.zrem(layout.amp_created(ns), cell_id)
                for transition in TRANSITIONS:
                    pipe.zrem(layout.amp_due(ns, transition), cell_id)
                pipe.srem(layout.amp_recover(ns), cell_id)
                pipe.srem(layout.amp_unposted(ns), cell_id)
                pipe.srem(layout.amp_unembedded(ns), cell_id)
                pipe.delete(layout.amp_vector(ns, cell_id))
                pipe.execute_command(*logged(ns, cell_id))
                for term in cells[cell_id][1] | indexed:
                    pipe.srem(layout.amp_term(ns, term), cell_id)
            await pipe.execute()
