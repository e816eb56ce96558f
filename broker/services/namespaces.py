"""Namespace configuration and schemas: the model, Redis storage, a per-process cache kept fresh
across processes by pub/sub, and authorization that honours shares."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from broker.core.errors import MempError
from broker.core.grammar import NAMESPACE_GLOB_RE, compile_pattern, glob_covers
from broker.core.models import WireInt
from broker.schemas.compile import (
    MAX_ERRORS,
    CompiledSchema,
    SchemaErrorDetail,
    SchemaRecord,
)
from broker.schemas.runner import SchemaRunner
from broker.services.auth import Principal
from broker.services.conflicts import ArrayMode, Strategy, agent_priority, pick_by_pattern
from broker.services.flights import Flights
from broker.services.limits import Limits, check_limits
from broker.storage.config import ConfigStore
from broker.storage.records import CorruptRecord

log = logging.getLogger("memp.namespaces")

# Priorities are compared in Redis's Lua as doubles; any 64-bit integer orders correctly enough
# there (2^62 over -2^62), and wider ones are refused rather than overflowed.
Priority = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class StrategyRule(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """For keys matching `pattern`: use `strategy`, and/or gate writes behind review with
    `approval: "required"` (for each, the most specific matching rule that sets it wins)."""

    pattern: str
    strategy: Strategy | None = None
    approval: Literal["required", "none"] | None = None


class PriorityRule(msgspec.Struct, forbid_unknown_fields=True):
    """An agent id, or a pattern of ids with `*`, and its priority (higher wins)."""

    agent: str
    priority: Priority


class Share(msgspec.Struct, forbid_unknown_fields=True):
    """Lets tokens granted on namespaces matching `namespace` read and/or subscribe here."""

    namespace: str
    permissions: list[Literal["read", "subscribe"]]


class NamespaceConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What admins of a namespace set (`PUT /v1/namespaces/{ns}/config`)."""

    strategy: Strategy = "last-write-wins"
    rules: list[StrategyRule] = []
    priorities: list[PriorityRule] = []
    default_priority: Priority = 0
    merge_arrays: ArrayMode = "replace"
    history_limit: WireInt | None = None
    default_ttl_seconds: WireInt | None = None
    shares: list[Share] = []
    limits: Limits = msgspec.field(default_factory=Limits)
    allow_self_approval: bool = False


class StoredConfig(NamespaceConfig, kw_only=True):
    """The configuration with who changed it last, when, and its revision."""

    namespace: str = ""
    revision: int = 0
    updated_at: int | None = None
    updated_by: str | None = None


@dataclass(slots=True)
class NamespaceState:
    """A namespace's configuration and compiled schemas, as cached by one process."""

    config: StoredConfig
    schemas: list[CompiledSchema]
    loaded_at: float = field(default_factory=time.monotonic)

    def strategy_for(self, key: str) -> Strategy:
        chosen = pick_by_pattern([(r.pattern, r.strategy) for r in self.config.rules
                                  if r.strategy is not None], key)
        return chosen or self.config.strategy

    def requires_approval(self, key: str) -> bool:
        """Whether the most specific rule with an `approval` setting for this key requires it."""
        rules = [(r.pattern, r.approval) for r in self.config.rules if r.approval is not None]
        return bool(rules) and pick_by_pattern(rules, key) == "required"

    def priority_of(self, agent_id: str) -> int:
        rules = [(r.agent, r.priority) for r in self.config.priorities]
        return agent_priority(rules, self.config.default_priority, agent_id)

    def schemas_for(self, key: str) -> list[CompiledSchema]:
        return [s for s in self.schemas if s.pattern.matches(key)]

    @staticmethod
    def validate(schemas: list[CompiledSchema], value: Any) -> tuple[list[SchemaErrorDetail],
                                                                     bool]:
        """The errors of every schema (enforcing ones first, MAX_ERRORS in all), and whether an
        enforcing one failed. May take long: NamespaceRegistry.validate runs it in the worker."""
        errors: list[SchemaErrorDetail] = []
        enforced = False
        for schema in sorted(schemas, key=lambda s: not s.record.enforce):
            found = schema.errors(value)
            errors += found
            enforced = enforced or (bool(found) and schema.record.enforce)
        return errors[:MAX_ERRORS], enforced

    def shares_with(self, principal: Principal, permission: str) -> bool:
        return any(
            permission in share.permissions
            and any(permission in g.permissions or "admin" in g.permissions for g in
                    principal.grants if glob_covers(share.namespace, g.namespace))
            for share in self.config.shares
        )


def check_config(config: NamespaceConfig, max_history: int, max_ttl_seconds: int) -> None:
    """Refuse configurations that cannot work, with the field named."""
    for rule in config.rules:
        if rule.strategy is None and rule.approval is None:
            raise MempError("invalid_request", "rules: each rule sets a strategy, an approval "
                            "or both", {"pattern": rule.pattern[:200]})
        try:
            compile_pattern(rule.pattern)
        except MempError as exc:
            raise MempError("invalid_pattern", f"rules: {exc.message}",
                            {"pattern": rule.pattern[:200]}) from None
    for priority in config.priorities:
        if not priority.agent or len(priority.agent) > 200:
            raise MempError("invalid_request", "priorities: agent must be 1-200 characters")
    if config.history_limit is not None and not 0 <= config.history_limit <= max_history:
        raise MempError("invalid_request", f"history_limit must be between 0 and {max_history}")
    if config.default_ttl_seconds is not None and not (
            0 < config.default_ttl_seconds <= max_ttl_seconds):
        raise MempError("invalid_ttl", f"default_ttl_seconds must be between 1 and "
                        f"{max_ttl_seconds}, or null")
    check_limits(config.limits)
    for share in config.shares:
        if not NAMESPACE_GLOB_RE.fullmatch(share.namespace):
            raise MempError("invalid_namespace", f"shares: bad namespace {share.namespace!r}")
        if not share.permissions:
            raise MempError("invalid_request", "shares: name at least one permission")


class NamespaceRegistry:
    """Loads, caches and saves namespace configuration and schemas."""

    def __init__(self, store: ConfigStore, ttl: float = 5.0, *, runner: SchemaRunner) -> None:
        self.store = store
        self.ttl = ttl
        self.runner = runner
        self._cache: dict[str, NamespaceState] = {}
        self._loads: Flights[str, NamespaceState] = Flights()

    async def state(self, namespace: str) -> NamespaceState:
        cached = self._cache.get(namespace)
        if cached is not None and time.monotonic() - cached.loaded_at < self.ttl:
            return cached
        return await self._loads.load(namespace, lambda: self._load(namespace),
                                      lambda state: self._cache.__setitem__(namespace, state))

    async def _load(self, namespace: str) -> NamespaceState:
        raw_config, raw_schemas = await self.store.load(namespace)
        config = (_decode(raw_config, StoredConfig, f"configuration of {namespace}")
                  if raw_config else StoredConfig(namespace=namespace))
        records = sorted((_decode(r, SchemaRecord, f"a schema of {namespace}")
                          for r in raw_schemas), key=lambda r: r.id)
        return NamespaceState(config, await self.runner.compile(namespace, records))

    async def validate(self, state: NamespaceState, namespace: str, key: str, value: Any,
                       size: int) -> tuple[list[SchemaErrorDetail], bool]:
        """NamespaceState.validate for the schemas matching the key: on the event loop when the
        fast validator quickly finds the value valid, else in the schema worker under its time
        budget (MempError `schema_timeout` past it)."""
        pending = [s for s in state.schemas_for(key) if not s.conforms_inline(value, size)]
        if not pending:
            return [], False
        try:
            return await self.runner.run(namespace, functools.partial(state.validate, pending,
                                                                      value))
        except MempError as exc:
            if exc.code == "schema_timeout":
                exc.details["schema_ids"] = [s.record.id for s in pending]
            raise

    def invalidate(self, namespace: str) -> None:
        self._cache.pop(namespace, None)
        self._loads.invalidate()

    def forget_all(self) -> None:
        self._cache.clear()
        self._loads.invalidate()

    async def save_config(self, namespace: str, config: NamespaceConfig, *, by: str, now: int,
                          if_revision: int | None) -> StoredConfig:
        """Replace the configuration; with `if_revision`, only if it is still that revision."""

        def change(raw: bytes | None) -> bytes:
            current = _decode(raw, StoredConfig, f"configuration of {namespace}") if raw \
                else None
            revision = current.revision if current else 0
            if if_revision is not None and if_revision != revision:
                raise MempError("precondition_failed", "the configuration changed",
                                {"current_revision": revision})
            stored = StoredConfig(**msgspec.structs.asdict(config), namespace=namespace,
                                  revision=revision + 1, updated_at=now, updated_by=by)
            return msgspec.json.encode(stored)

        try:
            stored = await self.store.update_config(namespace, change)
        finally:  # in effect here at once, even when replicas did not confirm it
            self.invalidate(namespace)
        return _decode(stored, StoredConfig, f"configuration of {namespace}")

    async def schema_records(self, namespace: str) -> list[SchemaRecord]:
        raw = await self.store.schema_records(namespace)
        return sorted((_decode(r, SchemaRecord, f"a schema of {namespace}") for r in raw),
                      key=lambda r: r.id)

    async def schema_record(self, namespace: str, schema_id: str) -> SchemaRecord | None:
        raw = await self.store.schema_record(namespace, schema_id)
        return _decode(raw, SchemaRecord, f"schema {schema_id} of {namespace}") if raw else None

    async def save_schema(self, record: SchemaRecord) -> None:
        try:
            await self.store.save_schema(record.namespace, record.id,
                                         msgspec.json.encode(record))
        finally:
            self.invalidate(record.namespace)

    async def delete_schema(self, namespace: str, schema_id: str) -> bool:
        try:
            return await self.store.delete_schema(namespace, schema_id)
        finally:
            self.invalidate(namespace)

    async def require(self, principal: Principal, permission: str, namespace: str) -> None:
        """Like Principal.require, but read and subscribe may also come from a share."""
        if principal.can(permission, namespace):
            return
        if permission in ("read", "subscribe"):
            state = await self.state(namespace)
            if state.shares_with(principal, permission):
                return
        principal.require(permission, namespace)


T = TypeVar("T")


def _decode(raw: bytes, kind: type[T], what: str) -> T:
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise CorruptRecord(f"stored {what}: {exc}") from None
