"""Each broker operation as a `Call`: the request to send and how to read its reply.

The sync and async clients share these and differ only in how they send."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from memp.errors import SchemaViolationWarning
from memp.models import (
    ApiKey,
    CreatedKey,
    Entry,
    Grant,
    NamespaceConfig,
    Page,
    Registration,
    SchemaRecord,
    StoredConfig,
)

T = TypeVar("T")
_encoder = msgspec.json.Encoder()
UPDATE_ATTEMPTS = 5  # how often update_config re-reads and tries again when raced


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request. `idempotent` calls may be resent when the first try may have reached the
    broker (reads, and writes carrying an Idempotency-Key); others only when it surely did not."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, str | int] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    idempotent: bool = True


def message_id() -> str:
    return str(uuid.uuid4())


def entry_path(namespace: str, key: str) -> str:
    return f"/v1/namespaces/{_segment(namespace)}/memory/{_key(key)}"


def _segment(text: str) -> str:
    return quote(text, safe="")


def _key(key: str) -> str:
    # `.` and `..` segments are invalid keys; escape them so no URL normalisation turns
    # `a/../b` into `b` before the broker can refuse it.
    return "/".join(quote(s, safe="") if s not in (".", "..") else s.replace(".", "%2E")
                    for s in key.split("/"))


def _json_body(payload: Any) -> tuple[bytes, dict[str, str]]:
    return _encoder.encode(payload), {"Content-Type": "application/json"}


def _decoder(kind: type[T]) -> Callable[[httpx.Response], T]:
    decoder = msgspec.json.Decoder(kind)

    def parse(response: httpx.Response) -> T:
        return decoder.decode(response.content)

    return parse


def _written(response: httpx.Response) -> Entry:
    """A write's reply; a stored value that violates a schema is reported as a warning."""
    entry = msgspec.json.decode(response.content, type=Entry)
    if entry.schema_violation:
        warnings.warn(
            SchemaViolationWarning(
                f"{entry.namespace}/{entry.key} v{entry.version} was stored but does not conform"
                f" to its schema: "
                + "; ".join(f"{e.schema_id} at {e.path or '/'}: {e.message}"
                            for e in entry.schema_errors or [])),
            stacklevel=4,
        )
    return entry


def _millis(timestamp: int | datetime | None) -> int | None:
    if isinstance(timestamp, datetime):
        return int(timestamp.timestamp() * 1000)
    return timestamp


def register(namespace: str, name: str, framework: str) -> Call[Registration]:
    body, headers = _json_body({"name": name, "framework": framework, "namespace": namespace})
    return Call("POST", "/v1/agents", _decoder(Registration), body=body,
                headers={**headers, "Idempotency-Key": message_id()})


def put(namespace: str, key: str, value: Any, *, ttl_seconds: int | None,
        if_version: int | None, if_absent: bool, timestamp: int | datetime | None,
        base_version: int | None) -> Call[Entry]:
    payload: dict[str, Any] = {"value": value}
    if ttl_seconds is not None:
        payload["ttl_seconds"] = ttl_seconds
    if base_version is not None:
        payload["base_version"] = base_version
    if timestamp is not None:
        payload["timestamp"] = _millis(timestamp)
    body, headers = _json_body(payload)
    headers["Idempotency-Key"] = message_id()
    if if_version is not None:
        headers["If-Match"] = f'"{if_version}"'
    if if_absent:
        headers["If-None-Match"] = "*"
    return Call("PUT", entry_path(namespace, key), _written, body=body, headers=headers)


def get(namespace: str, key: str) -> Call[Entry]:
    return Call("GET", entry_path(namespace, key), _decoder(Entry))


def delete(namespace: str, key: str, *, if_version: int | None,
           timestamp: int | datetime | None) -> Call[Entry]:
    headers = {"Idempotency-Key": message_id()}
    if if_version is not None:
        headers["If-Match"] = f'"{if_version}"'
    params: dict[str, str | int] = {}
    stamp = _millis(timestamp)
    if stamp is not None:
        params["timestamp"] = stamp
    return Call("DELETE", entry_path(namespace, key), _decoder(Entry), params=params,
                headers=headers)


def query_page(namespace: str, pattern: str, cursor: str | None, limit: int | None
               ) -> Call[Page]:
    params: dict[str, str | int] = {"pattern": pattern}
    if cursor is not None:
        params["cursor"] = cursor
    if limit is not None:
        params["limit"] = limit
    return Call("GET", f"/v1/namespaces/{_segment(namespace)}/memory", _decoder(Page),
                params=params)


class _History(msgspec.Struct):
    versions: list[Entry]


def history(namespace: str, key: str, limit: int | None) -> Call[list[Entry]]:
    decode = _decoder(_History)
    params: dict[str, str | int] = {"limit": limit} if limit is not None else {}
    return Call("GET", f"/v1/namespaces/{_segment(namespace)}/history/{_key(key)}",
                lambda response: decode(response).versions, params=params)


def create_key(grants: Sequence[Grant], name: str, agent_id: str | None) -> Call[CreatedKey]:
    payload: dict[str, Any] = {"grants": list(grants), "name": name}
    if agent_id is not None:
        payload["agent_id"] = agent_id
    body, headers = _json_body(payload)
    return Call("POST", "/v1/keys", _decoder(CreatedKey), body=body, headers=headers,
                idempotent=False)


class _Keys(msgspec.Struct):
    keys: list[ApiKey]


def list_keys() -> Call[list[ApiKey]]:
    decode = _decoder(_Keys)
    return Call("GET", "/v1/keys", lambda response: decode(response).keys)


def revoke_key(key_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/keys/{_segment(key_id)}", lambda response: None,
                idempotent=False)


def _namespace_path(namespace: str, *rest: str) -> str:
    return "/".join([f"/v1/namespaces/{_segment(namespace)}", *(_segment(p) for p in rest)])


def namespace_config(config: NamespaceConfig | None, changes: Mapping[str, Any]
                     ) -> NamespaceConfig:
    """`config` (only its configuration fields, so a StoredConfig will do) with `changes`
    applied; the broker's defaults for whatever neither gives."""
    fields = {name: getattr(config, name) for name in NamespaceConfig.__struct_fields__
              } if config is not None else {}
    unknown = set(changes) - set(NamespaceConfig.__struct_fields__)
    if unknown:
        raise TypeError(f"not a namespace configuration field: {', '.join(sorted(unknown))}")
    fields.update({name: list(value) if name in ("rules", "priorities", "shares") else value
                   for name, value in changes.items()})
    return NamespaceConfig(**fields)


def get_config(namespace: str) -> Call[StoredConfig]:
    return Call("GET", _namespace_path(namespace, "config"), _decoder(StoredConfig))


def put_config(namespace: str, config: NamespaceConfig, if_revision: int | None
               ) -> Call[StoredConfig]:
    body, headers = _json_body(
        {name: getattr(config, name) for name in NamespaceConfig.__struct_fields__})
    if if_revision is not None:
        headers["If-Match"] = f'"{if_revision}"'
    # Replacing is idempotent, unless conditional: had a lost first try been applied, the
    # resent one would fail on the revision it moved on.
    return Call("PUT", _namespace_path(namespace, "config"), _decoder(StoredConfig), body=body,
                headers=headers, idempotent=if_revision is None)


class _Schemas(msgspec.Struct):
    schemas: list[SchemaRecord]


def list_schemas(namespace: str) -> Call[list[SchemaRecord]]:
    decode = _decoder(_Schemas)
    return Call("GET", _namespace_path(namespace, "schemas"),
                lambda response: decode(response).schemas)


def get_schema(namespace: str, schema_id: str) -> Call[SchemaRecord]:
    return Call("GET", _namespace_path(namespace, "schemas", schema_id), _decoder(SchemaRecord))


def put_schema(namespace: str, schema_id: str, pattern: str, schema: dict[str, Any] | bool,
               enforce: bool) -> Call[SchemaRecord]:
    body, headers = _json_body({"pattern": pattern, "schema": schema, "enforce": enforce})
    return Call("PUT", _namespace_path(namespace, "schemas", schema_id), _decoder(SchemaRecord),
                body=body, headers=headers)


def delete_schema(namespace: str, schema_id: str) -> Call[None]:
    # Not resent after a lost reply: a first try that was applied would turn it into NotFound.
    return Call("DELETE", _namespace_path(namespace, "schemas", schema_id),
                lambda response: None, idempotent=False)
