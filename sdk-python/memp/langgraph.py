"""LangGraph's long-term memory on a MEMP broker: `MempStore` and `AsyncMempStore` are
`BaseStore`s whose items are entries of one MEMP namespace, so graphs in other processes (and
any other MEMP client) share them, see them change and keep their history.

An item `(label, ..., label), key` is the entry at `[prefix/]label/.../label/@key` (each part
percent-encoded), its value the item's dict; with `index`, also an AMP cell the broker ranks
by meaning (`_langgraph_recall`). Needs `pip install -e './sdk-python[langgraph]'`.

    from memp.langgraph import MempStore
    store = MempStore(api_key=..., namespace="my-app")   # or MempStore(client=MEMP(...))
    graph = builder.compile(store=store)"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote, unquote

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)

from memp import _langgraph_recall as recall
from memp.aclient import AsyncMEMP
from memp.client import MEMP
from memp.errors import NotFound, PreconditionFailed
from memp.models import CellSearchPage, Entry, Page

__all__ = ["AsyncMempStore", "MempStore"]

_ITEM = "@"  # starts an item's key segment; encoded labels never contain it
_PAGE = 1000  # entries per query page while scanning


# The store's logic is written once, as generators that yield the MEMP calls they need and
# receive their results; MempStore and AsyncMempStore only perform those calls.
class _Call:
    pass


class _Get(_Call):
    def __init__(self, key: str) -> None:
        self.key = key


class _Page(_Call):
    def __init__(self, pattern: str, cursor: str | None) -> None:
        self.pattern = pattern
        self.cursor = cursor


class _Put(_Call):
    def __init__(self, key: str, value: dict[str, Any], ttl_seconds: int | None,
                 if_version: int | None = None) -> None:
        self.key = key
        self.value = value
        self.ttl_seconds = ttl_seconds
        self.if_version = if_version


class _Delete(_Call):
    def __init__(self, key: str) -> None:
        self.key = key


Steps = Generator[object, Any, Any]  # _Call, or a recall call


class _Layout:
    """Where items live: `[prefix/]label/.../label/@key`."""

    def __init__(self, prefix: str) -> None:
        self.root = [quote(part, safe="") for part in prefix.strip("/").split("/") if part]

    def key(self, namespace: tuple[str, ...], key: str) -> str:
        return "/".join([*self.root, *(quote(label, safe="") for label in namespace),
                         _ITEM + quote(key, safe="")])

    def pattern(self, labels: tuple[str, ...]) -> str:
        """Every item under these namespace labels."""
        return "/".join([*self.root, *(quote(label, safe="") for label in labels), "*"])

    def item(self, memp_key: str) -> tuple[tuple[str, ...], str] | None:
        """The namespace and key an entry's key names; None for entries that are no item."""
        parts = memp_key.split("/")
        if parts[:len(self.root)] != self.root or len(parts) < len(self.root) + 2:
            return None
        *labels, last = parts[len(self.root):]
        if not last.startswith(_ITEM) or any(_ITEM in label for label in labels):
            return None
        return tuple(unquote(label) for label in labels), unquote(last[len(_ITEM):])


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _item(namespace: tuple[str, ...], key: str, entry: Entry) -> Item:
    return Item(value=entry.value, key=key, namespace=namespace,
                created_at=_time(entry.created_at), updated_at=_time(entry.updated_at))


def _seconds(ttl_minutes: float | None) -> int | None:
    """LangGraph's TTLs are minutes; the broker's whole seconds (at least one)."""
    return None if ttl_minutes is None else max(1, math.ceil(ttl_minutes * 60))


def _matches(value: Any, wanted: Any) -> bool:
    """A filter value against an item's: equality, nested objects field by field, and the
    operators $eq, $ne, $gt, $gte, $lt, $lte."""
    if isinstance(wanted, dict):
        if any(name.startswith("$") for name in wanted):
            return all(_compare(value, op, operand) for op, operand in wanted.items())
        return isinstance(value, dict) and all(_matches(value.get(k), v)
                                               for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return isinstance(value, list | tuple) and len(value) == len(wanted) and all(
            _matches(v, w) for v, w in zip(value, wanted, strict=True))
    return bool(value == wanted)


def _passes(value: dict[str, Any], filter: dict[str, Any] | None) -> bool:
    return not filter or all(_matches(value.get(name), wanted) for name, wanted in filter.items())


def _compare(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(value == operand)
    if op == "$ne":
        return bool(value != operand)
    if op not in ("$gt", "$gte", "$lt", "$lte"):
        raise ValueError(f"unsupported filter operator {op!r}")
    try:
        left, right = float(value), float(operand)
    except (TypeError, ValueError):
        return False
    return {"$gt": left > right, "$gte": left >= right, "$lt": left < right,
            "$lte": left <= right}[op]


def _fits(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = condition.path
    if len(namespace) < len(path):
        return False
    side = namespace[:len(path)] if condition.match_type == "prefix" \
        else namespace[len(namespace) - len(path):]
    return all(want == "*" or want == label for label, want in zip(side, path, strict=True))


class _Logic:
    """The store's operations as steps: reads see the store as it was before the batch, then
    its puts are applied, the last one per item winning (as LangGraph's own stores do)."""

    def __init__(self, prefix: str, index: recall.RecallIndex | None = None) -> None:
        self.layout = _Layout(prefix)
        self.prefix = prefix
        self.index = index

    def batch(self, ops: Iterable[Op]) -> Steps:
        ops = list(ops)
        for op in ops:
            validate_op_namespace(op)
        results: list[Result] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for op in ops:
            if isinstance(op, GetOp):
                results.append((yield from self._get(op)))
            elif isinstance(op, SearchOp):
                results.append((yield from self._search(op)))
            elif isinstance(op, ListNamespacesOp):
                results.append((yield from self._namespaces(op)))
            elif isinstance(op, PutOp):
                puts[(op.namespace, op.key)] = op
                results.append(None)
            else:
                raise ValueError(f"unknown operation {type(op).__name__}")
        for op in puts.values():
            key = self.layout.key(op.namespace, op.key)
            if op.value is None:
                yield _Delete(key)
            else:
                yield _Put(key, dict(op.value), _seconds(op.ttl))
            if self.index is not None:
                text = "" if op.value is None else self.index.text(dict(op.value), op.index)
                yield from self._reindex(key, text)
        return results

    def _reindex(self, key: str, text: str) -> Steps:
        """Point the item's cell at its new text (creating it), or unlink it when the item is
        gone or not indexed."""
        page = yield recall.Cells(None, key, None)
        cells = [cell_id for _, cell_id, _ in recall.hits(page)]
        if not text:
            for cell_id in cells:
                yield recall.PatchCell(cell_id, key, None)
            return
        patched = False
        for cell_id in cells:
            patched = (yield recall.PatchCell(cell_id, key, text)) is not None or patched
        if not patched:
            yield recall.CreateCell(key, text)

    def _refresh(self, key: str, entry: Entry) -> Steps:
        """Start an item's TTL again (a write of the same value, unless it changed since)."""
        if entry.ttl_seconds is not None:
            yield _Put(key, entry.value, entry.ttl_seconds, if_version=entry.version)

    def _get(self, op: GetOp) -> Steps:
        key = self.layout.key(op.namespace, op.key)
        entry: Entry | None = yield _Get(key)
        if entry is None:
            return None
        if op.refresh_ttl:
            yield from self._refresh(key, entry)
        return _item(op.namespace, op.key, entry)

    def _scan(self, labels: tuple[str, ...]) -> Steps:
        """Every item under these labels, in key order."""
        found: list[tuple[tuple[str, ...], str, Entry]] = []
        cursor = None
        while True:
            page: Page = yield _Page(self.layout.pattern(labels), cursor)
            for entry in page.entries:
                named = self.layout.item(entry.key)
                if named is not None and isinstance(entry.value, dict):
                    found.append((*named, entry))
            cursor = page.next_cursor
            if cursor is None:
                return found

    def _search(self, op: SearchOp) -> Steps:
        """Items under the prefix whose values match the filter, `offset` then `limit`: by
        meaning for a `query` when the store indexes, else in key order with no score (a
        query ranks nothing without an index, as in LangGraph's in-memory store)."""
        ranked = None
        if op.query and self.index is not None:
            ranked = yield from self._recall(op)
        if ranked is None:
            found = yield from self._scan(op.namespace_prefix)
            ranked = [(namespace, key, entry, None) for namespace, key, entry in found
                      if _passes(entry.value, op.filter)]
        chosen = ranked[op.offset:op.offset + op.limit]
        if op.refresh_ttl:
            for namespace, key, entry, _ in chosen:
                yield from self._refresh(self.layout.key(namespace, key), entry)
        return [SearchItem(namespace, key, entry.value, _time(entry.created_at),
                           _time(entry.updated_at), score)
                for namespace, key, entry, score in chosen]

    def _recall(self, op: SearchOp) -> Steps:
        """The first `offset + limit` items the broker's hybrid recall ranks best for the
        query, under the prefix and passing the filter; each read from its entry, so an item
        deleted or expired meanwhile is left out. None for a query with no searchable words
        (all punctuation): it ranks nothing, so items come as without a query."""
        wanted = op.offset + op.limit
        ranked: list[tuple[tuple[str, ...], str, Entry, float | None]] = []
        seen: set[str] = set()
        cursor = None
        while True:
            page = yield recall.Cells(op.query, None, cursor)
            if page is recall.WORDLESS:
                return None
            for memp_key, _, score in recall.hits(page):
                named = self.layout.item(memp_key)
                if memp_key in seen or named is None or \
                        named[0][:len(op.namespace_prefix)] != op.namespace_prefix:
                    continue
                seen.add(memp_key)
                entry: Entry | None = yield _Get(memp_key)
                if entry is not None and isinstance(entry.value, dict) and \
                        _passes(entry.value, op.filter):
                    ranked.append((*named, entry, score))
                    if len(ranked) >= wanted:
                        return ranked
            cursor = page.next_cursor if isinstance(page, CellSearchPage) else None
            if cursor is None:
                return ranked

    def _namespaces(self, op: ListNamespacesOp) -> Steps:
        conditions = op.match_conditions or ()
        fixed: tuple[str, ...] = ()
        for condition in conditions:  # a literal prefix narrows the scan
            if condition.match_type == "prefix":
                for label in condition.path:
                    if label == "*":
                        break
                    fixed += (label,)
                break
        found = yield from self._scan(fixed)
        namespaces = {namespace for namespace, _, _ in found
                      if all(_fits(condition, namespace) for condition in conditions)}
        if op.max_depth is not None:
            namespaces = {namespace[:op.max_depth] for namespace in namespaces}
        return sorted(namespaces)[op.offset:op.offset + op.limit]


class MempStore(BaseStore):
    """A LangGraph `BaseStore` on a MEMP broker (synchronous). Pass a `MEMP` client, or the
    arguments to make one (api_key, namespace, base_url, ...; the MEMP_* environment fills
    in the rest). `prefix` keeps the store's items under a key prefix of the namespace;
    `ttl` is LangGraph's TTL configuration (minutes; reads refresh by default). `index`
    (True, or the fields to embed) makes `search(..., query=...)` rank by meaning through
    AMP cells that `agent` (default: the client's registered agent) acts on, owned by `owner`
    (default: `agent`) and shared with the `readers` (agent globs)."""

    supports_ttl = True

    def __init__(self, client: MEMP | None = None, *, prefix: str = "",
                 ttl: TTLConfig | None = None, index: bool | Sequence[str] = False,
                 agent: str | None = None, owner: str | None = None,
                 readers: Sequence[str] = (), **options: Any) -> None:
        self.client = client if client is not None else MEMP(**options)
        self._owned = client is None
        self.ttl_config = ttl
        self._logic = _Logic(prefix, _index(self.client, prefix, index, agent, owner,
                                            readers))

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        steps = self._logic.batch(ops)
        try:
            call = next(steps)
            while True:
                call = steps.send(_perform(self.client, self._logic.index, call))
        except StopIteration as done:
            results: list[Result] = done.value
            return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """The synchronous store's batch, in a worker thread."""
        import asyncio

        return await asyncio.to_thread(self.batch, list(ops))

    def close(self) -> None:
        if self._owned:
            self.client.close()

    def __enter__(self) -> MempStore:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False


class AsyncMempStore(BaseStore):
    """A LangGraph `BaseStore` on a MEMP broker for async graphs, over `AsyncMEMP`; see
    `MempStore`. The synchronous methods are not available: use the `a*` ones."""

    supports_ttl = True

    def __init__(self, client: AsyncMEMP | None = None, *, prefix: str = "",
                 ttl: TTLConfig | None = None, index: bool | Sequence[str] = False,
                 agent: str | None = None, owner: str | None = None,
                 readers: Sequence[str] = (), **options: Any) -> None:
        self.client = client if client is not None else AsyncMEMP(**options)
        self._owned = client is None
        self.ttl_config = ttl
        self._logic = _Logic(prefix, _index(self.client, prefix, index, agent, owner,
                                            readers))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        steps = self._logic.batch(ops)
        try:
            call = next(steps)
            while True:
                call = steps.send(await _aperform(self.client, self._logic.index, call))
        except StopIteration as done:
            results: list[Result] = done.value
            return results

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        raise NotImplementedError("AsyncMempStore is asynchronous: use abatch, aget, aput, "
                                  "asearch, ... (or MempStore)")

    async def aclose(self) -> None:
        if self._owned:
            await self.client.aclose()

    async def __aenter__(self) -> AsyncMempStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _index(client: MEMP | AsyncMEMP, prefix: str, index: bool | Sequence[str],
           agent: str | None, owner: str | None, readers: Sequence[str]
           ) -> recall.RecallIndex | None:
    if index is False:
        return None
    agent = agent or (client.agent.id if client.agent is not None else None)
    if agent is None:
        raise ValueError("an indexed store needs an agent: pass agent=, or register the client")
    fields = ["$"] if index is True else list(index)
    return recall.RecallIndex(client.namespace or "", prefix, agent, owner or agent, fields,
                              readers)


def _perform(client: MEMP, index: recall.RecallIndex | None, call: Any) -> Any:
    if index is not None and not isinstance(call, _Call):
        return recall.perform(index, client.amp, call)
    memory = client.memory
    if isinstance(call, _Get):
        try:
            return memory.get_entry(call.key)
        except NotFound:
            return None
    if isinstance(call, _Page):
        return memory.page(call.pattern, call.cursor, _PAGE)
    if isinstance(call, _Put):
        try:
            return memory.put(call.key, call.value, call.ttl_seconds,
                              if_version=call.if_version)
        except PreconditionFailed:
            return None  # changed since it was read: the newer write stands
    if isinstance(call, _Delete):
        try:
            return memory.delete(call.key)
        except NotFound:
            return None
    raise TypeError(call)  # pragma: no cover


async def _aperform(client: AsyncMEMP, index: recall.RecallIndex | None, call: Any) -> Any:
    if index is not None and not isinstance(call, _Call):
        return await recall.aperform(index, client.amp, call)
    memory = client.memory
    if isinstance(call, _Get):
        try:
            return await memory.get_entry(call.key)
        except NotFound:
            return None
    if isinstance(call, _Page):
        return await memory.page(call.pattern, call.cursor, _PAGE)
    if isinstance(call, _Put):
        try:
            return await memory.put(call.key, call.value, call.ttl_seconds,
                                    if_version=call.if_version)
        except PreconditionFailed:
            return None
    if isinstance(call, _Delete):
        try:
            return await memory.delete(call.key)
        except NotFound:
            return None
    raise TypeError(call)  # pragma: no cover
