"""The asynchronous client: `AsyncMEMP`, the same surface as `MEMP` with `await`."""

from __future__ import annotations

import os
import weakref
from collections.abc import AsyncIterator, Generator, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Unpack

import httpx

from memp import _calls
from memp._transport import AsyncTransport, Config, check_trust
from memp.agents import AsyncAgents, AsyncMessages
from memp.amp import AsyncAmp
from memp.errors import NotFound, PreconditionFailed
from memp.governance import AsyncAudit, AsyncProposals
from memp.models import (
    Agent,
    ApiKey,
    ConfigFields,
    CreatedKey,
    Credentials,
    Entry,
    Grant,
    NamespaceConfig,
    Page,
    SchemaRecord,
    StoredConfig,
    UsageReport,
)
from memp.subscription import (
    AsyncSubscription,
    StateListener,
    StreamState,
    stream_options,
    targets,
)

_MISSING: Any = object()


class AsyncQueryResult:
    """The entries matching a pattern: `async for` fetches page by page; `await` gives them
    all as a list. Fetched pages are kept, so it can be iterated again."""

    def __init__(self, memory: AsyncMemory, namespace: str, pattern: str,
                 page_size: int | None) -> None:
        self._memory = memory
        self.namespace = namespace
        self.pattern = pattern
        self._page_size = page_size
        self._entries: list[Entry] = []
        self._cursor: str | None = None
        self._done = False

    async def _fetch(self) -> bool:
        if self._done:
            return False
        page = await self._memory.page(self.pattern, self._cursor, self._page_size,
                                       namespace=self.namespace)
        self._entries.extend(page.entries)
        self._cursor = page.next_cursor
        self._done = page.next_cursor is None
        return True

    async def __aiter__(self) -> AsyncIterator[Entry]:
        index = 0
        while True:
            while index < len(self._entries):
                yield self._entries[index]
                index += 1
            if not await self._fetch():
                return

    async def to_list(self) -> list[Entry]:
        """Every matching entry (fetches the remaining pages)."""
        while await self._fetch():
            pass
        return list(self._entries)

    async def values(self) -> dict[str, Any]:
        """Key → value for every matching entry."""
        return {entry.key: entry.value for entry in await self.to_list()}

    def __await__(self) -> Generator[Any, None, list[Entry]]:
        return self.to_list().__await__()


class AsyncMemory:
    """Memory operations on the client's namespace (or the `namespace=` given per call)."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    async def put(self, key: str, value: Any, ttl_seconds: int | None = None, *,
                  if_version: int | None = None, if_absent: bool = False,
                  timestamp: int | datetime | None = None, base_version: int | None = None,
                  approval_required: bool = False, namespace: str | None = None) -> Entry:
        return await self._transport.send(_calls.put(
            self._config.require_namespace(namespace), key, value, ttl_seconds=ttl_seconds,
            if_version=if_version, if_absent=if_absent, timestamp=timestamp,
            base_version=base_version, approval_required=approval_required))

    async def get(self, key: str, default: Any = _MISSING, *, namespace: str | None = None
                  ) -> Any:
        try:
            return (await self.get_entry(key, namespace=namespace)).value
        except NotFound:
            if default is _MISSING:
                raise
            return default

    async def get_entry(self, key: str, *, namespace: str | None = None) -> Entry:
        return await self._transport.send(
            _calls.get(self._config.require_namespace(namespace), key))

    def query(self, pattern: str = "*", *, page_size: int | None = None,
              namespace: str | None = None) -> AsyncQueryResult:
        return AsyncQueryResult(self, self._config.require_namespace(namespace), pattern,
                                page_size)

    async def page(self, pattern: str = "*", cursor: str | None = None,
                   limit: int | None = None, *, namespace: str | None = None) -> Page:
        return await self._transport.send(_calls.query_page(
            self._config.require_namespace(namespace), pattern, cursor, limit))

    async def delete(self, key: str, *, if_version: int | None = None,
                     timestamp: int | datetime | None = None, approval_required: bool = False,
                     namespace: str | None = None) -> Entry:
        return await self._transport.send(_calls.delete(
            self._config.require_namespace(namespace), key, if_version=if_version,
            timestamp=timestamp, approval_required=approval_required))

    async def history(self, key: str, limit: int | None = None, *,
                      namespace: str | None = None) -> list[Entry]:
        return await self._transport.send(_calls.history(
            self._config.require_namespace(namespace), key, limit))


class AsyncNamespaces:
    """Namespace configuration (needs `admin`); see `memp.client.Namespaces`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    async def config(self, *, namespace: str | None = None) -> StoredConfig:
        return await self._transport.send(
            _calls.get_config(self._config.require_namespace(namespace)))

    async def usage(self, *, namespace: str | None = None) -> UsageReport:
        """The namespace's usage (live keys, stored bytes, open streams, pending proposals)
        beside its limits and the broker's defaults; needs `admin` on the namespace."""
        return await self._transport.send(
            _calls.get_usage(self._config.require_namespace(namespace)))

    async def set_config(self, config: NamespaceConfig | None = None, *,
                         if_revision: int | None = None, namespace: str | None = None,
                         **fields: Unpack[ConfigFields]) -> StoredConfig:
        return await self._transport.send(_calls.put_config(
            self._config.require_namespace(namespace), _calls.namespace_config(config, fields),
            if_revision))

    async def update_config(self, *, namespace: str | None = None,
                            **changes: Unpack[ConfigFields]) -> StoredConfig:
        attempt = 0
        while True:
            current = await self.config(namespace=namespace)
            try:
                return await self.set_config(current, if_revision=current.revision,
                                             namespace=namespace, **changes)
            except PreconditionFailed:
                attempt += 1
                if attempt >= _calls.UPDATE_ATTEMPTS:
                    raise


class AsyncSchemas:
    """JSON Schemas for key patterns; see `memp.client.Schemas`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    async def put(self, schema_id: str, pattern: str, schema: dict[str, Any] | bool,
                  enforce: bool = False, *, namespace: str | None = None) -> SchemaRecord:
        return await self._transport.send(_calls.put_schema(
            self._config.require_namespace(namespace), schema_id, pattern, schema, enforce))

    async def get(self, schema_id: str, *, namespace: str | None = None) -> SchemaRecord:
        return await self._transport.send(_calls.get_schema(
            self._config.require_namespace(namespace), schema_id))

    async def delete(self, schema_id: str, *, namespace: str | None = None) -> None:
        await self._transport.send(_calls.delete_schema(
            self._config.require_namespace(namespace), schema_id))

    async def list(self, *, namespace: str | None = None) -> list[SchemaRecord]:
        return await self._transport.send(_calls.list_schemas(
            self._config.require_namespace(namespace)))


class AsyncKeys:
    """API-key management (needs an admin token)."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._transport = transport

    async def create(self, grants: Sequence[Grant], name: str = "",
                     agent_id: str | None = None) -> CreatedKey:
        return await self._transport.send(_calls.create_key(grants, name, agent_id))

    async def list(self) -> list[ApiKey]:
        return await self._transport.send(_calls.list_keys())

    async def revoke(self, key_id: str) -> None:
        await self._transport.send(_calls.revoke_key(key_id))


class AsyncMEMP:
    """The async twin of `MEMP`; use `async with AsyncMEMP(...) as broker:` or `aclose()`."""

    def __init__(self, api_key: str | None = None, namespace: str | None = None,
                 base_url: str | None = None, *, timeout: float = 10.0,
                 retry_for: float | None = None, max_retries: int | None = None,
                 stream_timeout: float = 60.0, ca_bundle: str | os.PathLike[str] | None = None,
                 http_client: httpx.AsyncClient | None = None) -> None:
        check_trust(ca_bundle, http_client)
        self.config = Config.resolve(api_key, namespace, base_url, timeout=timeout,
                                     max_retries=max_retries, stream_timeout=stream_timeout,
                                     retry_for=retry_for, ca_bundle=ca_bundle)
        self._transport = AsyncTransport(self.config, http_client)
        self.memory = AsyncMemory(self._transport)
        self.namespaces = AsyncNamespaces(self._transport)
        self.schemas = AsyncSchemas(self._transport)
        self.keys = AsyncKeys(self._transport)
        self.agents = AsyncAgents(self._transport)
        self.messages = AsyncMessages(self._transport)
        self.proposals = AsyncProposals(self._transport)
        self.audit = AsyncAudit(self._transport)
        self.amp = AsyncAmp(self._transport, lambda: self.agent.id if self.agent else None)
        self.agent: Agent | None = None
        self.credentials: Credentials | None = None
        self.reused = False  # `register` found the agent this token registered before
        self._subscriptions: weakref.WeakSet[AsyncSubscription] = weakref.WeakSet()

    @property
    def namespace(self) -> str | None:
        return self.config.namespace

    @property
    def api_key(self) -> str | None:
        return self.config.api_key

    async def register(self, name: str, framework: str = "custom", *, new: bool = False,
                       namespace: str | None = None) -> Agent:
        registration = await self._transport.send(_calls.register(
            self.config.require_namespace(namespace), name, framework, new))
        self.agent = registration.agent
        self.credentials = registration.credentials
        self.reused = registration.reused
        self.config.api_key = registration.credentials.api_key
        return registration.agent

    def subscribe(self, pattern: str | Sequence[str] = "*", *, snapshot: bool = False,
                  namespace: str | None = None, last_event_id: str | None = None,
                  on_state: StateListener | None = None, filter: str | None = None,
                  conflate: Literal["latest"] | None = None, max_rate: float | None = None
                  ) -> AsyncSubscription:
        state = StreamState(targets(self.config.require_namespace(namespace), pattern),
                            snapshot, last_event_id, on_state,
                            stream_options(filter, conflate, max_rate))
        subscription = AsyncSubscription(self._transport, state)
        self._subscriptions.add(subscription)
        return subscription

    async def aclose(self) -> None:
        """Close the connections; open subscriptions end instead of reconnecting."""
        for subscription in list(self._subscriptions):
            subscription.stop()
        await self._transport.aclose()

    async def __aenter__(self) -> AsyncMEMP:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
