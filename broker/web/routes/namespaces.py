"""Namespace administration: configuration (conflict strategies, priorities, shares, retention)
and JSON Schemas."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.core.errors import MempError
from broker.core.grammar import compile_pattern, validate_namespace
from broker.schemas.compile import (
    SCHEMA_ID_RE,
    SchemaBody,
    SchemaRecord,
    check_schema,
    probe_schema,
)
from broker.services.audit import actor_fields
from broker.services.namespaces import NamespaceConfig, NamespaceRegistry, check_config
from broker.web.http import authenticate, decode_json, int_header, json_response, read_body
from broker.web.services import services

T = TypeVar("T")


async def _namespace(request: Request, permission: str) -> tuple[str, str]:
    """Authorise the caller on the path's namespace; returns it and the caller's subject."""
    principal = await authenticate(request)
    namespace = validate_namespace(request.path_params["namespace"])
    await services(request).namespaces.require(principal, permission, namespace)
    request.state.actor = actor_fields(principal)
    return namespace, principal.writer_id


async def _audit(request: Request, namespace: str, action: str, **details: object) -> None:
    audit = services(request).audit
    await audit.record(namespace, action, request.state.actor, details=details)


async def get_config(request: Request) -> Response:
    namespace, _ = await _namespace(request, "admin")
    state = await services(request).namespaces.state(namespace)
    return json_response(state.config, headers={"ETag": f'"{state.config.revision}"'})


async def put_config(request: Request) -> Response:
    namespace, subject = await _namespace(request, "admin")
    settings = services(request).settings
    config = decode_json(await read_body(request, settings.max_config_bytes), NamespaceConfig)
    check_config(config, max_history=settings.max_history_limit,
                 max_ttl_seconds=settings.max_ttl_seconds)
    before = (await services(request).namespaces.state(namespace)).config.shares
    stored = await services(request).namespaces.save_config(
        namespace, config, by=subject, now=services(request).clock(),
        if_revision=int_header(request, "if-match", minimum=0))
    await _audit(request, namespace, "config", revision=stored.revision)
    if msgspec.to_builtins(before) != msgspec.to_builtins(stored.shares):
        await _audit(request, namespace, "shares", before=before, after=stored.shares)
    return json_response(stored, headers={"ETag": f'"{stored.revision}"'})


async def get_usage(request: Request) -> Response:
    namespace, _ = await _namespace(request, "admin")
    limits = (await services(request).namespaces.state(namespace)).config.limits
    report = await services(request).fair_share.report(namespace, limits,
                                                       services(request).clock())
    return json_response(report)


def _schema_id(request: Request) -> str:
    schema_id: str = request.path_params["schema_id"]
    if not SCHEMA_ID_RE.fullmatch(schema_id):
        raise MempError("invalid_request", "schema id must match [a-z0-9][a-z0-9._-]{0,63}")
    return schema_id


async def list_schemas(request: Request) -> Response:
    namespace, _ = await _namespace(request, "read")
    return json_response({"schemas": await services(request).namespaces.schema_records(namespace)})


async def get_schema(request: Request) -> Response:
    namespace, _ = await _namespace(request, "read")
    schema_id = _schema_id(request)
    record = await services(request).namespaces.schema_record(namespace, schema_id)
    if record is None:
        raise MempError("not_found", f"no schema {schema_id!r} in namespace {namespace!r}")
    return json_response(record)


async def put_schema(request: Request) -> Response:
    namespace, subject = await _namespace(request, "admin")
    schema_id = _schema_id(request)
    limit = services(request).settings.max_schema_bytes
    body = decode_json(await read_body(request, limit), SchemaBody)
    compile_pattern(body.pattern)
    registry = services(request).namespaces
    draft = await _in_worker(registry, namespace, functools.partial(check_schema, body.schema),
                             "checking the schema against its meta-schema",
                             services(request).settings.schema_check_timeout_ms / 1000)
    await _in_worker(registry, namespace, functools.partial(probe_schema, body.schema),
                     "applying the schema to null, true, 0, \"\", [] and {}")
    existed = await registry.schema_record(namespace, schema_id) is not None
    record = SchemaRecord(id=schema_id, namespace=namespace, pattern=body.pattern,
                          schema=body.schema, enforce=body.enforce, draft=draft,
                          created_at=services(request).clock(), created_by=subject)
    await registry.save_schema(record)
    await _audit(request, namespace, "schema", schema=schema_id, pattern=body.pattern,
                 enforce=body.enforce)
    return json_response(record, 200 if existed else 201)


async def _in_worker(registry: NamespaceRegistry, namespace: str, job: Callable[[], T],
                     what: str, budget: float | None = None) -> T:
    """Run a registration check in the schema worker; taking too long makes it invalid."""
    try:
        return await registry.runner.run(namespace, job, budget)
    except MempError as exc:
        if exc.code != "schema_timeout":
            raise
        raise MempError("invalid_schema", f"{what} takes longer than the time budget",
                        exc.details) from None


async def delete_schema(request: Request) -> Response:
    namespace, _ = await _namespace(request, "admin")
    schema_id = _schema_id(request)
    if not await services(request).namespaces.delete_schema(namespace, schema_id):
        raise MempError("not_found", f"no schema {schema_id!r} in namespace {namespace!r}")
    await _audit(request, namespace, "schema-delete", schema=schema_id)
    return Response(status_code=204)


routes = [
    Route("/v1/namespaces/{namespace}/config", get_config, methods=["GET"]),
    Route("/v1/namespaces/{namespace}/config", put_config, methods=["PUT"]),
    Route("/v1/namespaces/{namespace}/usage", get_usage, methods=["GET"]),
    Route("/v1/namespaces/{namespace}/schemas", list_schemas, methods=["GET"]),
    Route("/v1/namespaces/{namespace}/schemas/{schema_id}", get_schema, methods=["GET"]),
    Route("/v1/namespaces/{namespace}/schemas/{schema_id}", put_schema, methods=["PUT"]),
    Route("/v1/namespaces/{namespace}/schemas/{schema_id}", delete_schema, methods=["DELETE"]),
]
