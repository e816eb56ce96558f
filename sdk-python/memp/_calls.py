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

from memp.errors import ApprovalPending, SchemaViolationWarning
from memp.messages import AnyMessage, Reply
from memp.models import (
    AccessPolicy,
    Agent,
    AgentPage,
    ApiKey,
    Approval,
    AuditPage,
    AuditRecord,
    AuditVerdict,
    CellSearchPage,
    CreatedCell,
    CreatedKey,
    Entry,
    Grant,
    ImportResult,
    MemoryCell,
    NamespaceConfig,
    Page,
    Proposal,
    ProposalPage,
    Provenance,
    Registration,
    SchemaRecord,
    StoredConfig,
    UsageReport,
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


def _params(**values: Any) -> dict[str, str | int]:
    """Query parameters: those given, in order; None leaves one out."""
    return {name: value for name, value in values.items() if value is not None}


def _json_body(payload: Any) -> tuple[bytes, dict[str, str]]:
    return _encoder.encode(payload), {"Content-Type": "application/json"}


def _decoder(kind: type[T]) -> Callable[[httpx.Response], T]:
    decoder = msgspec.json.Decoder(kind)

    def parse(response: httpx.Response) -> T:
        return decoder.decode(response.content)

    return parse


def _written(response: httpx.Response) -> Entry:
    """A write's reply; a stored value that violates a schema is reported as a warning, a
    write that awaits approval raises ApprovalPending."""
    if response.status_code == 202:
        raise ApprovalPending(msgspec.json.decode(response.content, type=Proposal))
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


def register(namespace: str, name: str, framework: str, new: bool = False
             ) -> Call[Registration]:
    fields: dict[str, Any] = {"name": name, "framework": framework, "namespace": namespace}
    if new:
        fields["new"] = True
    body, headers = _json_body(fields)
    return Call("POST", "/v1/agents", _decoder(Registration), body=body,
                headers={**headers, "Idempotency-Key": message_id()})


def put(namespace: str, key: str, value: Any, *, ttl_seconds: int | None,
        if_version: int | None, if_absent: bool, timestamp: int | datetime | None,
        base_version: int | None, approval_required: bool = False) -> Call[Entry]:
    payload: dict[str, Any] = {"value": value}
    if approval_required:
        payload["approval_required"] = True
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
           timestamp: int | datetime | None, approval_required: bool = False) -> Call[Entry]:
    headers = {"Idempotency-Key": message_id()}
    if if_version is not None:
        headers["If-Match"] = f'"{if_version}"'
    params: dict[str, str | int] = {"approval_required": "true"} if approval_required else {}
    stamp = _millis(timestamp)
    if stamp is not None:
        params["timestamp"] = stamp
    return Call("DELETE", entry_path(namespace, key), _written, params=params,
                headers=headers)


def query_page(namespace: str, pattern: str, cursor: str | None, limit: int | None
               ) -> Call[Page]:
    return Call("GET", f"/v1/namespaces/{_segment(namespace)}/memory", _decoder(Page),
                params=_params(pattern=pattern, cursor=cursor, limit=limit))


class _History(msgspec.Struct):
    versions: list[Entry]


def history(namespace: str, key: str, limit: int | None) -> Call[list[Entry]]:
    decode = _decoder(_History)
    return Call("GET", f"/v1/namespaces/{_segment(namespace)}/history/{_key(key)}",
                lambda response: decode(response).versions, params=_params(limit=limit))


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


def get_usage(namespace: str) -> Call[UsageReport]:
    return Call("GET", _namespace_path(namespace, "usage"), _decoder(UsageReport))


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


# ---- agents ----


def get_agent(namespace: str, agent_id: str) -> Call[Agent]:
    return Call("GET", _namespace_path(namespace, "agents", agent_id), _decoder(Agent))


def list_agents(namespace: str, cursor: str | None, limit: int | None) -> Call[AgentPage]:
    return Call("GET", _namespace_path(namespace, "agents"), _decoder(AgentPage),
                params=_params(cursor=cursor, limit=limit))


def remove_agent(namespace: str, agent_id: str) -> Call[None]:
    # Not resent after a lost reply: a first try that was applied would turn it into NotFound.
    return Call("DELETE", _namespace_path(namespace, "agents", agent_id), lambda response: None,
                idempotent=False)


# ---- governance ----


def list_proposals(namespace: str, status: str | None, key: str | None, cursor: str | None,
                   limit: int | None) -> Call[ProposalPage]:
    return Call("GET", _namespace_path(namespace, "proposals"), _decoder(ProposalPage),
                params=_params(status=status, key=key, cursor=cursor, limit=limit))


def get_proposal(namespace: str, proposal_id: str) -> Call[Proposal]:
    return Call("GET", _namespace_path(namespace, "proposals", proposal_id),
                _decoder(Proposal))


def approve_proposal(namespace: str, proposal_id: str, base_version: int | None
                     ) -> Call[Approval]:
    # Not resent after a lost reply: an approval that was applied would answer 409.
    body, headers = _json_body({} if base_version is None else {"base_version": base_version})
    return Call("POST", _namespace_path(namespace, "proposals", proposal_id, "approve"),
                _decoder(Approval), body=body, headers=headers, idempotent=False)


def reject_proposal(namespace: str, proposal_id: str, reason: str) -> Call[Proposal]:
    body, headers = _json_body({"reason": reason})
    return Call("POST", _namespace_path(namespace, "proposals", proposal_id, "reject"),
                _decoder(Proposal), body=body, headers=headers, idempotent=False)


def list_audit(namespace: str, *, since: int | datetime | str | None,
               until: int | datetime | str | None, actor: str | None, key: str | None,
               action: str | None, cursor: str | None, limit: int | None,
               after: str | None = None) -> Call[AuditPage]:
    return Call("GET", _namespace_path(namespace, "audit"), _decoder(AuditPage),
                params=audit_params(since, until, actor, key, action, cursor, limit, after))


def audit_params(since: int | datetime | str | None, until: int | datetime | str | None,
                 actor: str | None, key: str | None, action: str | None,
                 cursor: str | None = None, limit: int | None = None,
                 after: str | None = None) -> dict[str, str | int]:
    """The selection's query; `after` is a record id (the newest one a previous export
    returned): only records appended after it."""
    def bound(value: int | datetime | str | None) -> str | int | None:
        return _millis(value) if isinstance(value, datetime) else value

    return _params(since=bound(since), until=bound(until), after=after, actor=actor, key=key,
                   action=action, cursor=cursor, limit=limit)


def export_audit(namespace: str, *, since: int | datetime | str | None,
                 until: int | datetime | str | None, actor: str | None, key: str | None,
                 action: str | None, after: str | None = None) -> Call[list[AuditRecord]]:
    """The whole selection, newest first, read from the broker's NDJSON export."""
    decoder = msgspec.json.Decoder(AuditRecord)

    def parse(response: httpx.Response) -> list[AuditRecord]:
        return [decoder.decode(line) for line in response.content.splitlines() if line]

    return Call("GET", _namespace_path(namespace, "audit"), parse,
                params=audit_params(since, until, actor, key, action, after=after),
                headers={"Accept": "application/x-ndjson"})


def verify_audit(namespace: str) -> Call[AuditVerdict]:
    return Call("GET", _namespace_path(namespace, "audit", "verify"), _decoder(AuditVerdict))


# ---- protocol messages ----


def messages(batch: Sequence[AnyMessage], namespace: str | None) -> Call[list[Reply]]:
    """A batch, each message given the client's namespace and a fresh id where it has none:
    with ids, a batch resent after a lost reply is applied once."""
    filled = [msgspec.structs.replace(
        message, namespace=message.namespace or namespace, id=message.id or message_id())
        for message in batch]
    body, headers = _json_body(filled)
    return Call("POST", "/v1/messages", _decoder(list[Reply]), body=body, headers=headers)


# ---- AMP ----


def _amp_headers(agent: str | None) -> dict[str, str]:
    return {"X-AMP-Agent-ID": agent} if agent else {}


def _cell_path(cell_id: str) -> str:
    return f"/amp/memories/{_segment(cell_id)}"


def _without_none(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


def create_cell(agent: str | None, body: dict[str, Any]) -> Call[CreatedCell]:
    payload, headers = _json_body(body)
    return Call("POST", "/amp/memories", _decoder(CreatedCell), body=payload,
                headers={**headers, **_amp_headers(agent)}, idempotent=False)


def get_cell(agent: str | None, cell_id: str) -> Call[MemoryCell]:
    return Call("GET", _cell_path(cell_id), _decoder(MemoryCell), headers=_amp_headers(agent))


def patch_cell(agent: str | None, cell_id: str, body: dict[str, Any]) -> Call[MemoryCell]:
    payload, headers = _json_body(body)
    return Call("PATCH", _cell_path(cell_id), _decoder(MemoryCell), body=payload,
                headers={**headers, **_amp_headers(agent)}, idempotent=False)


def delete_cell(agent: str | None, cell_id: str) -> Call[MemoryCell]:
    return Call("DELETE", _cell_path(cell_id), _decoder(MemoryCell),
                headers=_amp_headers(agent), idempotent=False)


def search_cells(agent: str | None, body: dict[str, Any]) -> Call[CellSearchPage]:
    payload, headers = _json_body(body)
    return Call("POST", "/amp/memories/search", _decoder(CellSearchPage), body=payload,
                headers={**headers, **_amp_headers(agent)})


def import_cells(agent: str | None, cells: Sequence[MemoryCell | Mapping[str, Any]]
                 ) -> Call[ImportResult]:
    # A create's reply (CreatedCell) is sent as the cell alone: an import takes cells only.
    payload, headers = _json_body({"cells": [
        MemoryCell(**{f: getattr(c, f) for f in MemoryCell.__struct_fields__})
        if isinstance(c, CreatedCell) else c for c in cells]})
    return Call("POST", "/amp/import", _decoder(ImportResult), body=payload,
                headers={**headers, **_amp_headers(agent)}, idempotent=False)


def merge_cells(agent: str | None, body: dict[str, Any]) -> Call[MemoryCell]:
    payload, headers = _json_body(body)
    return Call("POST", "/amp/memories/merge", _decoder(MemoryCell), body=payload,
                headers={**headers, **_amp_headers(agent)}, idempotent=False)


def merge_body(ids: Sequence[str], text: str, *, type: str | None,
               metadata: Mapping[str, Any] | None, importance: float | None,
               confidence: float | None, decay_rate: float | None,
               access_policy: AccessPolicy | None) -> dict[str, Any]:
    """The body of a merge; fields left out take the broker's defaults."""
    scoring = _without_none({"importance": importance, "confidence": confidence,
                             "decay_rate": decay_rate})
    return _without_none({"ids": list(ids), "text": text, "type": type,
                          "metadata": dict(metadata) if metadata is not None else None,
                          "scoring": scoring or None, "access_policy": access_policy})


def new_cell(text: str, *, owner_id: str, owner_type: str, type: str,
             metadata: Mapping[str, Any] | None, importance: float | None,
             confidence: float | None, decay_rate: float | None,
             access_policy: AccessPolicy | None, provenance: Provenance | None,
             session_id: str | None, expires_at: str | datetime | None) -> dict[str, Any]:
    """The body of a cell to create; fields left out take the broker's defaults."""
    return _without_none({
        "type": type,
        "content": {"text": text, "metadata": dict(metadata or {})},
        "identity": _without_none({"owner_id": owner_id, "owner_type": owner_type,
                                   "session_id": session_id}),
        "scoring": _without_none({"importance": importance, "confidence": confidence,
                                  "decay_rate": decay_rate}),
        "access_policy": access_policy, "provenance": provenance,
        "expires_at": _iso(expires_at),
    })


def cell_patch(*, text: str | None, metadata: Mapping[str, Any] | None,
               importance: float | None, confidence: float | None, decay_rate: float | None,
               access_policy: AccessPolicy | None, expires_at: str | datetime | None
               ) -> dict[str, Any]:
    content = _without_none({"text": text, "metadata": dict(metadata) if metadata is not None
                             else None})
    scoring = _without_none({"importance": importance, "confidence": confidence,
                             "decay_rate": decay_rate})
    return _without_none({"content": content or None, "scoring": scoring or None,
                          "access_policy": access_policy, "expires_at": _iso(expires_at)})


def search_body(query: str | None, fields: Mapping[str, Any]) -> dict[str, Any]:
    body = _without_none({"query": query, **fields})
    for name in ("created_after", "created_before"):
        if name in body:
            body[name] = _iso(body[name])
    if body.get("include_stale") is False:
        del body["include_stale"]
    return body


def _iso(moment: str | datetime | None) -> str | None:
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            raise ValueError("give AMP times with a time zone (or as ISO 8601 strings)")
        return moment.isoformat()
    return moment
