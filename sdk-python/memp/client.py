"""The synchronous client: `MEMP`, its `memory`, `namespaces`, `schemas` and `keys`, and lazily
paged query results."""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Unpack, overload

import httpx

from memp import _calls
from memp._transport import Config, SyncTransport, check_trust
from memp.agents import Agents, Messages
from memp.amp import Amp
from memp.errors import NotFound, PreconditionFailed
from memp.governance import Audit, Proposals
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
    StateListener,
    StreamState,
    Subscription,
    stream_options,
    targets,
)

_MISSING: Any = object()


class QueryResult:
    """The entries matching a pattern, fetched page by page as you iterate.

    Pages already fetched are kept, so the result can be iterated again (without asking the
    broker again), indexed, and measured with `len()` (which fetches every page)."""

    def __init__(self, memory: Memory, namespace: str, pattern: str, page_size: int | None
                 ) -> None:
        self._memory = memory
        self.namespace = namespace
        self.pattern = pattern
        self._page_size = page_size
        self._entries: list[Entry] = []
        self._cursor: str | None = None
        self._done = False

    def _fetch(self) -> bool:
        """Fetch the next page; False when there is none."""
        if self._done:
            return False
        page = self._memory.page(self.pattern, self._cursor, self._page_size,
                                 namespace=self.namespace)
        self._entries.extend(page.entries)
        self._cursor = page.next_cursor
        self._done = page.next_cursor is None
        return True

    def __iter__(self) -> Iterator[Entry]:
        index = 0
        while True:
            while index < len(self._entries):
                yield self._entries[index]
                index += 1
            if not self._fetch():
                return

    def __len__(self) -> int:
        while self._fetch():
            pass
        return len(self._entries)

    def __bool__(self) -> bool:
        while not self._entries and self._fetch():
            pass
        return bool(self._entries)

    @overload
    def __getitem__(self, index: int) -> Entry: ...
    @overload
    def __getitem__(self, index: slice) -> list[Entry]: ...
    def __getitem__(self, index: int | slice) -> Entry | list[Entry]:
        return self.to_list()[index]

    def to_list(self) -> list[Entry]:
        """Every matching entry (fetches the remaining pages)."""
        len(self)
        return list(self._entries)

    def values(self) -> dict[str, Any]:
        """Key → value for every matching entry."""
        return {entry.key: entry.value for entry in self}

    def __repr__(self) -> str:
        state = "complete" if self._done else "partial"
        return (f"<QueryResult {self.namespace}:{self.pattern} {len(self._entries)} entries "
                f"fetched, {state}>")


class Memory:
    """Memory operations on the client's namespace (or the `namespace=` given per call)."""

    def __init__(self, transport: SyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    def put(self, key: str, value: Any, ttl_seconds: int | None = None, *,
            if_version: int | None = None, if_absent: bool = False,
            timestamp: int | datetime | None = None, base_version: int | None = None,
            approval_required: bool = False, namespace: str | None = None) -> Entry:
        """Store `value` under `key`; returns the entry written. `if_version` / `if_absent`
        make it compare-and-set (PreconditionFailed otherwise); `base_version` tells a merge
        namespace which version the value was based on, so conflicts can be flagged. A write
        that needs a reviewer's approval (`approval_required`, or the namespace's rule)
        raises ApprovalPending with the proposal."""
        return self._transport.send(_calls.put(
            self._config.require_namespace(namespace), key, value, ttl_seconds=ttl_seconds,
            if_version=if_version, if_absent=if_absent, timestamp=timestamp,
            base_version=base_version, approval_required=approval_required))

    def get(self, key: str, default: Any = _MISSING, *, namespace: str | None = None) -> Any:
        """The value under `key`; raises NotFound unless a default is given."""
        try:
            return self.get_entry(key, namespace=namespace).value
        except NotFound:
            if default is _MISSING:
                raise
            return default

    def get_entry(self, key: str, *, namespace: str | None = None) -> Entry:
        """The entry under `key`, with its version and metadata."""
        return self._transport.send(_calls.get(self._config.require_namespace(namespace), key))

    def query(self, pattern: str = "*", *, page_size: int | None = None,
              namespace: str | None = None) -> QueryResult:
        """Entries whose keys match `pattern` (`customer/*`), fetched lazily page by page."""
        return QueryResult(self, self._config.require_namespace(namespace), pattern, page_size)

    def page(self, pattern: str = "*", cursor: str | None = None, limit: int | None = None,
             *, namespace: str | None = None) -> Page:
        """One page of a query, for callers that keep the cursor themselves."""
        return self._transport.send(_calls.query_page(
            self._config.require_namespace(namespace), pattern, cursor, limit))

    def delete(self, key: str, *, if_version: int | None = None,
               timestamp: int | datetime | None = None, approval_required: bool = False,
               namespace: str | None = None) -> Entry:
        """Delete `key`; returns the tombstone version. A delete that needs approval
        raises ApprovalPending, as a put does."""
        return self._transport.send(_calls.delete(
            self._config.require_namespace(namespace), key, if_version=if_version,
            timestamp=timestamp, approval_required=approval_required))

    def history(self, key: str, limit: int | None = None, *, namespace: str | None = None
                ) -> list[Entry]:
        """The key's recent versions, newest first, tombstones included."""
        return self._transport.send(_calls.history(
            self._config.require_namespace(namespace), key, limit))


class Namespaces:
    """Namespace configuration: conflict strategies, agent priorities, retention and shares
    (needs `admin` on the namespace). Calls act on the client's namespace or `namespace=`."""

    def __init__(self, transport: SyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    def config(self, *, namespace: str | None = None) -> StoredConfig:
        """The configuration, with its `revision` (0 and the defaults if never set)."""
        return self._transport.send(_calls.get_config(self._config.require_namespace(namespace)))

    def usage(self, *, namespace: str | None = None) -> UsageReport:
        """The namespace's usage (live keys, stored bytes, open streams, pending proposals)
        beside its limits and the broker's defaults; needs `admin` on the namespace."""
        return self._transport.send(_calls.get_usage(self._config.require_namespace(namespace)))

    def set_config(self, config: NamespaceConfig | None = None, *,
                   if_revision: int | None = None, namespace: str | None = None,
                   **fields: Unpack[ConfigFields]) -> StoredConfig:
        """Replace the configuration with `config` and/or the fields given (keywords win);
        fields neither gives take their defaults. With `if_revision`, only while the stored
        configuration is still that revision, else PreconditionFailed (`.current_revision`).
        Returns the stored configuration with its new revision."""
        return self._transport.send(_calls.put_config(
            self._config.require_namespace(namespace), _calls.namespace_config(config, fields),
            if_revision))

    def update_config(self, *, namespace: str | None = None, **changes: Unpack[ConfigFields]
                      ) -> StoredConfig:
        """Change only the fields given and keep the rest: reads the configuration and
        replaces it on condition that it did not change in between (re-reading if it did)."""
        attempt = 0
        while True:
            current = self.config(namespace=namespace)
            try:
                return self.set_config(current, if_revision=current.revision,
                                       namespace=namespace, **changes)
            except PreconditionFailed:
                attempt += 1
                if attempt >= _calls.UPDATE_ATTEMPTS:
                    raise


class Schemas:
    """JSON Schemas that values under a key pattern must conform to (registering and deleting
    need `admin`, reading `read`). Calls act on the client's namespace or `namespace=`."""

    def __init__(self, transport: SyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    def put(self, schema_id: str, pattern: str, schema: dict[str, Any] | bool,
            enforce: bool = False, *, namespace: str | None = None) -> SchemaRecord:
        """Register (or replace) schema `schema_id` for keys matching `pattern`. Values that do
        not conform are stored and flagged (a SchemaViolationWarning on the write), or with
        `enforce=True` refused with SchemaViolation. An invalid schema raises InvalidRequest
        (`code` "invalid_schema")."""
        return self._transport.send(_calls.put_schema(
            self._config.require_namespace(namespace), schema_id, pattern, schema, enforce))

    def get(self, schema_id: str, *, namespace: str | None = None) -> SchemaRecord:
        """The schema registered as `schema_id`; NotFound if there is none."""
        return self._transport.send(_calls.get_schema(
            self._config.require_namespace(namespace), schema_id))

    def delete(self, schema_id: str, *, namespace: str | None = None) -> None:
        """Remove schema `schema_id`; NotFound if there is none."""
        self._transport.send(_calls.delete_schema(
            self._config.require_namespace(namespace), schema_id))

    def list(self, *, namespace: str | None = None) -> list[SchemaRecord]:
        """Every schema in the namespace, by id."""
        return self._transport.send(_calls.list_schemas(
            self._config.require_namespace(namespace)))


class Keys:
    """API-key management (needs an admin token)."""

    def __init__(self, transport: SyncTransport) -> None:
        self._transport = transport

    def create(self, grants: Sequence[Grant], name: str = "", agent_id: str | None = None
               ) -> CreatedKey:
        return self._transport.send(_calls.create_key(grants, name, agent_id))

    def list(self) -> list[ApiKey]:
        return self._transport.send(_calls.list_keys())

    def revoke(self, key_id: str) -> None:
        self._transport.send(_calls.revoke_key(key_id))


class MEMP:
    """A MEMP broker client. Arguments win over MEMP_API_KEY, MEMP_NAMESPACE, MEMP_BASE_URL and
    MEMP_CA_BUNDLE; the base URL defaults to http://127.0.0.1:8080. One pooled HTTP client
    serves every call; it verifies certificates, against `ca_bundle` alone when one is given."""

    def __init__(self, api_key: str | None = None, namespace: str | None = None,
                 base_url: str | None = None, *, timeout: float = 10.0,
                 retry_for: float | None = None, max_retries: int | None = None,
                 stream_timeout: float = 60.0, ca_bundle: str | os.PathLike[str] | None = None,
                 http_client: httpx.Client | None = None) -> None:
        check_trust(ca_bundle, http_client)
        self.config = Config.resolve(api_key, namespace, base_url, timeout=timeout,
                                     max_retries=max_retries, stream_timeout=stream_timeout,
                                     retry_for=retry_for, ca_bundle=ca_bundle)
        self._transport = SyncTransport(self.config, http_client)
        self.memory = Memory(self._transport)
        self.namespaces = Namespaces(self._transport)
        self.schemas = Schemas(self._transport)
        self.keys = Keys(self._transport)
        self.agents = Agents(self._transport)
        self.messages = Messages(self._transport)
        self.proposals = Proposals(self._transport)
        self.audit = Audit(self._transport)
        self.amp = Amp(self._transport, lambda: self.agent.id if self.agent else None)
        self.agent: Agent | None = None
        self.credentials: Credentials | None = None
        self.reused = False  # `register` found the agent this token registered before
        self._subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()

    @property
    def namespace(self) -> str | None:
        return self.config.namespace

    @property
    def api_key(self) -> str | None:
        """The token in use (the agent's own key after `register`)."""
        return self.config.api_key

    def register(self, name: str, framework: str = "custom", *, new: bool = False,
                 namespace: str | None = None) -> Agent:
        """Register an agent; later calls use the API key bound to it. A name this token
        registered before finds that agent (with a new key) unless `new=True`."""
        registration = self._transport.send(_calls.register(
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
                  ) -> Subscription:
        """Events for keys matching `pattern`, live, reconnecting and resuming by itself.
        `snapshot=True` starts with the current entries, then a `snapshot-end` event;
        `filter` (an expression such as `/status == "done"`), `conflate="latest"` and
        `max_rate` (events a second) are applied by the broker (docs/subscriptions.md);
        `on_state` is called with each ConnectionState (connecting, connected, reconnecting
        with the error and attempt, closed)."""
        state = StreamState(targets(self.config.require_namespace(namespace), pattern),
                            snapshot, last_event_id, on_state,
                            stream_options(filter, conflate, max_rate))
        subscription = Subscription(self._transport, state)
        self._subscriptions.add(subscription)
        return subscription

    def close(self) -> None:
        """End open subscriptions and close the connections."""
        for subscription in list(self._subscriptions):
            subscription.close()
        self._transport.close()

    def __enter__(self) -> MEMP:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
