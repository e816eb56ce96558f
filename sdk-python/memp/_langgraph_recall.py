"""Recall by meaning for `memp.langgraph`: each indexed item is mirrored by an AMP cell of the
store's agent, so the broker embeds it and ranks it; the item's entry stays the truth."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from memp.errors import ConflictError, InvalidRequest, NotFound
from memp.models import AccessPolicy, CellSearchPage

STORE = "langgraph_store"  # metadata: which store (namespace and prefix) a cell belongs to
ITEM = "langgraph_item"  # metadata: the key of the item's entry
_TEXT = 16 * 1024  # characters of an item's text that are embedded
_QUERY = 1000  # characters of a query the broker takes
_GONE = timedelta(minutes=1)  # an unlinked cell expires after this
WORDLESS = object()  # the answer to a query with no searchable words (the broker's 400)


class Cells:
    """One page of the store's cells: ranked by meaning for a query, or those of one item."""

    def __init__(self, query: str | None, item: str | None, cursor: str | None) -> None:
        self.query = query
        self.item = item
        self.cursor = cursor


class CreateCell:
    def __init__(self, item: str, text: str) -> None:
        self.item = item
        self.text = text


class PatchCell:
    """New text for a cell, or (text None) unlink it from its item and let it expire."""

    def __init__(self, cell_id: str, item: str, text: str | None) -> None:
        self.cell_id = cell_id
        self.item = item
        self.text = text


class RecallIndex:
    """Where and as whom a store's cells live: owned by the agent `owner` (the acting `agent`
    unless told), tagged with the store, readable and writable by `readers` too; `fields` are
    what is embedded."""

    def __init__(self, namespace: str, prefix: str, agent: str, owner: str,
                 fields: Sequence[str], readers: Sequence[str]) -> None:
        self.tag = f"{namespace}/{prefix.strip('/')}"
        self.agent = agent
        self.owner = owner
        self.fields = list(fields)
        self.policy = AccessPolicy(readable_by=list(readers), writable_by=list(readers))

    def text(self, value: dict[str, Any], index: Any) -> str:
        """The text an item is recalled by: its string values (all of them, or those of the
        fields given, `a.b` reaching into objects), one per line; "" when not indexed."""
        if index is False:
            return ""
        fields = self.fields if index is None or index is True else list(index)
        parts: list[str] = []
        for field in fields:
            _strings(_field(value, field), parts)
        return "\n".join(parts)[:_TEXT]

    def search(self, amp: Any, call: Cells) -> Any:
        query = call.query[:_QUERY] if call.query else None
        return amp.search(query, owner_id=self.owner, owner_type="agent",
                          metadata=self._metadata(call.item), include_stale=True,
                          mode="hybrid" if call.query else None, limit=100,
                          cursor=call.cursor, agent=self.agent)

    def create(self, amp: Any, call: CreateCell) -> Any:
        return amp.create(call.text, owner_id=self.owner, owner_type="agent",
                          metadata=self._metadata(call.item), decay_rate=0.0,
                          access_policy=self.policy, agent=self.agent)

    def patch(self, amp: Any, call: PatchCell) -> Any:
        if call.text is not None:
            return amp.patch(call.cell_id, text=call.text, agent=self.agent)
        return amp.patch(call.cell_id, metadata={"langgraph_unlinked": call.item},
                         expires_at=datetime.now(UTC) + _GONE, agent=self.agent)

    def _metadata(self, item: str | None) -> dict[str, str]:
        return {STORE: self.tag} if item is None else {STORE: self.tag, ITEM: item}


def perform(index: RecallIndex, amp: Any, call: Any) -> Any:
    """One cell call, synchronously; a cell gone or archived meanwhile gives None."""
    try:
        if isinstance(call, Cells):
            return index.search(amp, call)
        if isinstance(call, CreateCell):
            return index.create(amp, call)
        return index.patch(amp, call)
    except (NotFound, ConflictError):
        return None
    except InvalidRequest as error:
        return _wordless(error)


async def aperform(index: RecallIndex, amp: Any, call: Any) -> Any:
    """`perform` for the async client."""
    try:
        if isinstance(call, Cells):
            return await index.search(amp, call)
        if isinstance(call, CreateCell):
            return await index.create(amp, call)
        return await index.patch(amp, call)
    except (NotFound, ConflictError):
        return None
    except InvalidRequest as error:
        return _wordless(error)


def _wordless(error: InvalidRequest) -> object:
    """A 400 naming `query`: with the query cut to the broker's length, only one that has no
    searchable words gets it."""
    if error.field != "query":
        raise error
    return WORDLESS


def hits(page: CellSearchPage | object | None) -> list[tuple[str, str, float]]:
    """(item key, cell id, score) of a page's cells, best first."""
    found = []
    for hit in page.results if isinstance(page, CellSearchPage) else ():
        item = hit.cell.content.metadata.get(ITEM)
        if isinstance(item, str):
            found.append((item, hit.cell.id, hit.score))
    return found


def _field(value: Any, path: str) -> Any:
    if path == "$":
        return value
    for name in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(name)
    return value


def _strings(value: Any, into: list[str]) -> None:
    if isinstance(value, str):
        if value.strip():
            into.append(value.strip())
    elif isinstance(value, dict):
        for inner in value.values():
            _strings(inner, into)
    elif isinstance(value, list):
        for inner in value:
            _strings(inner, into)
