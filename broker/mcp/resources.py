"""MCP resources: every entry is `memp://{namespace}/{key}` (its text is the entry's value),
and `memp://{namespace}?pattern=...` lists the entries a pattern matches. Reads go through
MemoryService with the caller's principal, like every other read."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote_to_bytes, urlsplit

import mcp_types as types
import msgspec

from broker.core.errors import MempError
from broker.core.grammar import validate_namespace
from broker.core.models import Entry, encode
from broker.services.auth import Principal
from broker.services.memory import MemoryService

SCHEME = "memp"
JSON = "application/json"
PAGE = 100  # resources per resources/list page

TEMPLATES = [
    types.ResourceTemplate(
        name="entry", title="Memory entry", uri_template=f"{SCHEME}://{{namespace}}/{{+key}}",
        mime_type=JSON,
        description="One entry of shared memory; its text is the entry's JSON value, and its "
                    "_meta.memp the version, writer and times. Subscribe to hear when it "
                    "changes."),
    types.ResourceTemplate(
        name="query", title="Entries matching a pattern",
        uri_template=f"{SCHEME}://{{namespace}}{{?pattern,cursor}}", mime_type=JSON,
        description="The entries whose keys match a pattern ('customer/*'; '*' for all), in "
                    "key order, as JSON with next_cursor for the next page. Subscribe to hear "
                    "when any of them changes."),
]


@dataclass(frozen=True, slots=True)
class Target:
    """What a `memp://` URI names: one key, or a pattern (with a page cursor, and a filter
    its subscriptions apply)."""

    namespace: str
    key: str | None = None
    pattern: str = "*"
    cursor: str | None = None
    filter: str | None = None

    @property
    def watched(self) -> str:
        """The pattern a subscription to this URI follows."""
        return self.key if self.key is not None else self.pattern


def entry_uri(namespace: str, key: str) -> str:
    return f"{SCHEME}://{namespace}/" + "/".join(quote(s, safe="") for s in key.split("/"))


def parse_uri(uri: str) -> Target:
    """A `memp://` URI's namespace and key, or pattern; `invalid_request` otherwise."""
    try:
        parts = urlsplit(uri)
        if parts.scheme != SCHEME or not parts.netloc:
            raise ValueError
        namespace = parts.netloc
        path = parts.path.removeprefix("/")
        key = "/".join(unquote_to_bytes(s).decode("utf-8") for s in path.split("/")) \
            if path else None
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False,
                         errors="strict")
    except (ValueError, UnicodeDecodeError):
        raise MempError("invalid_request", f"not a memp:// resource URI: {uri[:200]!r} (use "
                        "memp://{namespace}/{key} or memp://{namespace}?pattern=...)",
                        {"uri": uri[:200]}) from None
    validate_namespace(namespace)
    if key is not None:
        return Target(namespace, key=key)
    return Target(namespace, pattern=_one(query, "pattern") or "*",
                  cursor=_one(query, "cursor"), filter=_one(query, "filter"))


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _meta(entry: Entry) -> dict[str, Any]:
    return {"memp": {"version": entry.version, "agent_id": entry.agent_id,
                     "updated_at": entry.updated_at, "expires_at": entry.expires_at}}


def _resource(entry: Entry) -> types.Resource:
    return types.Resource(
        uri=entry_uri(entry.namespace, entry.key), name=entry.key, mime_type=JSON,
        description=f"{entry.namespace}: version {entry.version}, written by {entry.agent_id}",
        size=len(entry.value) if entry.value is not None else 0, _meta=_meta(entry))


class Resources:
    """Lists and reads `memp://` resources for a caller."""

    def __init__(self, memory: MemoryService) -> None:
        self.memory = memory

    async def read(self, principal: Principal, uri: str) -> types.ReadResourceResult:
        target = parse_uri(uri)
        if target.key is not None:
            entry = await self.memory.get(principal, target.namespace, target.key)
            text = bytes(entry.value or b"null").decode()
            return types.ReadResourceResult(contents=[types.TextResourceContents(
                uri=uri, mime_type=JSON, text=text, _meta=_meta(entry))])
        page = await self.memory.query(principal, target.namespace, target.pattern,
                                       target.cursor, None)
        listing = {
            "namespace": target.namespace, "pattern": target.pattern,
            "entries": [{"uri": entry_uri(e.namespace, e.key), "key": e.key,
                         "version": e.version, "agent_id": e.agent_id,
                         "updated_at": e.updated_at, "value": e.value} for e in page.entries],
            "next_cursor": page.next_cursor,
        }
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=uri, mime_type=JSON, text=encode(listing).decode())])

    async def list(self, principal: Principal, home: str | None, cursor: str | None
                   ) -> types.ListResourcesResult:
        """A page of the entries in the namespaces the token names exactly (and its agent's
        home); namespaces granted only by a glob are reached through the templates."""
        namespaces = sorted({g.namespace for g in principal.grants
                             if "*" not in g.namespace and principal.can("read", g.namespace)}
                            | ({home} if home else set()))
        start, after = _decode_cursor(cursor, namespaces)
        resources: list[types.Resource] = []
        for namespace in namespaces[start:]:
            page = await self.memory.query(principal, namespace, "*", after,
                                           PAGE - len(resources))
            resources += [_resource(entry) for entry in page.entries]
            if page.next_cursor is not None:
                return types.ListResourcesResult(
                    resources=resources, next_cursor=_encode_cursor(namespace,
                                                                    page.next_cursor))
            after = None
            if len(resources) >= PAGE:
                following = namespaces.index(namespace) + 1
                if following < len(namespaces):
                    return types.ListResourcesResult(
                        resources=resources,
                        next_cursor=_encode_cursor(namespaces[following], None))
        return types.ListResourcesResult(resources=resources)


def _encode_cursor(namespace: str, after: str | None) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode([namespace, after])).decode()


def _decode_cursor(cursor: str | None, namespaces: list[str]) -> tuple[int, str | None]:
    if cursor is None:
        return 0, None
    try:
        namespace, after = msgspec.json.decode(base64.urlsafe_b64decode(cursor),
                                               type=tuple[str, str | None])
        return namespaces.index(namespace), after
    except (ValueError, binascii.Error, msgspec.DecodeError):
        raise MempError("invalid_request", "cursor is not one this broker issued") from None
