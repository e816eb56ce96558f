"""Memory reads (get, query, history): the caller's right, the read rates, and what of the AMP
namespace the caller may see (`ReadPolicy`)."""

from __future__ import annotations

from broker.core.clock import Clock
from broker.core.errors import MempError
from broker.core.grammar import compile_pattern, validate_key, validate_namespace
from broker.core.models import Entry, Page
from broker.runtime.settings import Settings
from broker.services.activity import AgentActivity
from broker.services.auth import Principal
from broker.services.fields import check_limit, decode_cursor, encode_cursor
from broker.services.limits import FairShare
from broker.services.namespaces import NamespaceRegistry
from broker.services.visibility import ReadPolicy
from broker.storage.entries import EntryStore


class MemoryReads:
    """Checks, authorises and runs memory reads against the store."""

    def __init__(self, settings: Settings, store: EntryStore, namespaces: NamespaceRegistry,
                 activity: AgentActivity, clock: Clock, cells: ReadPolicy,
                 fair_share: FairShare) -> None:
        self.settings = settings
        self.fair_share = fair_share
        self.store = store
        self.namespaces = namespaces
        self.activity = activity
        self.clock = clock
        self.cells = cells

    async def _readable(self, principal: Principal, namespace: str, key: str | None,
                        permission: str = "read", rate: bool = True) -> None:
        """Check a read: the namespace, the caller's right, the key, and the read rates (a
        stream's snapshot pages are not reads: its stream is counted instead; `rate` False:
        the caller takes the tokens itself)."""
        validate_namespace(namespace)
        await self.namespaces.require(principal, permission, namespace)
        if key is not None:
            validate_key(key, self.settings.max_key_bytes)
        if permission != "subscribe" and rate:
            limits = (await self.namespaces.state(namespace)).config.limits
            await self.fair_share.check_read(principal, namespace, limits, self.clock())

    async def get(self, principal: Principal, namespace: str, key: str) -> Entry:
        """One entry; its read rate is checked in the same script call that reads it."""
        await self._readable(principal, namespace, key, rate=False)
        now = self.clock()
        limits = (await self.namespaces.state(namespace)).config.limits
        gate = self.fair_share.read_gate(principal, namespace, limits, now)
        if gate is None:
            entry = await self.store.get(namespace, key, now)
        else:
            entry, refused = await self.store.get_held(namespace, key, now, gate)
            if refused is not None:
                raise self.fair_share.refuse_read(gate, refused, now)
        self.activity.seen(namespace, principal.agent_id, now)
        if entry is None or (self.cells.guards(namespace) and not self.cells.shows(
                self.cells.viewer(principal), entry, now)):
            raise MempError("not_found", f"no entry at key {key!r}", {"key": key})
        return entry

    async def query(self, principal: Principal, namespace: str, pattern_text: str,
                    cursor: str | None = None, limit: int | None = None,
                    permission: str = "read") -> Page:
        await self._readable(principal, namespace, None, permission)
        pattern = compile_pattern(pattern_text, self.settings.max_key_bytes)
        limit = check_limit(limit, self.settings.default_query_limit,
                            self.settings.max_query_limit)
        after = decode_cursor(cursor)
        now = self.clock()
        self.activity.seen(namespace, principal.agent_id, now)
        matched: list[str] = []
        scanned = 0
        more = True
        while more and len(matched) < limit and scanned < self.settings.max_query_scan:
            batch = limit - len(matched) if pattern.is_prefix or pattern.is_exact \
                else max(256, limit)
            keys, more = await self.store.scan_keys(namespace, pattern, after, batch)
            scanned += len(keys)
            for name in keys:
                after = name
                if pattern.matches(name):
                    matched.append(name)
                    if len(matched) == limit:
                        more = more or name != keys[-1]
                        break
        entries = await self.store.get_many(namespace, matched, now)
        if self.cells.guards(namespace):
            entries = self.cells.shown(self.cells.viewer(principal), entries, now)
        next_cursor = encode_cursor(after) if more and after is not None else None
        return Page(entries=entries, next_cursor=next_cursor)

    async def history(self, principal: Principal, namespace: str, key: str,
                      limit: int | None = None) -> list[Entry]:
        await self._readable(principal, namespace, key)
        kept = (await self.namespaces.state(namespace)).config.history_limit
        most = max(self.settings.history_limit if kept is None else kept, 1)
        limit = check_limit(limit, most, most)
        versions = await self.store.history(namespace, key, limit)
        if not self.cells.guards(namespace):
            return versions
        shown = self.cells.history(self.cells.viewer(principal), versions, self.clock())
        if shown is None:
            raise MempError("not_found", f"no entry at key {key!r}", {"key": key})
        return shown
