"""REST resources for memory entries: put, get, delete, query and history."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from urllib.parse import unquote_to_bytes

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.core.errors import MempError
from broker.core.models import Entry, PutBody
from broker.services.fields import check_message_id
from broker.services.memory import PutOptions
from broker.services.outcomes import entry_warnings
from broker.web.http import (
    authenticate,
    decode_json,
    int_header,
    int_param,
    json_response,
    read_body,
)
from broker.web.services import services


def _key(request: Request) -> str:
    """The key from the path. The server decodes the path leniently (an invalid UTF-8 sequence
    becomes U+FFFD), which would let `k%FF` and `k%FE` name one key, so the raw path must
    decode strictly."""
    raw_path = request.scope.get("raw_path")
    if raw_path is not None:
        try:
            unquote_to_bytes(raw_path).decode("utf-8")
        except UnicodeDecodeError:
            raise MempError("invalid_key", "the key is not valid UTF-8 once percent-decoded") \
                from None
    key: str = request.path_params["key"]
    return key


def _entry_response(entry: Entry, status: int = 200) -> Response:
    response = json_response(entry, status)
    response.raw_headers.append((b"etag", b'"%d"' % entry.version))
    warnings = entry_warnings(entry)
    if warnings:
        response.raw_headers.append((b"memp-warning", ", ".join(warnings).encode()))
    return response


async def put_entry(request: Request) -> Response:
    principal = await authenticate(request)
    service = services(request).memory
    body = decode_json(await read_body(request, service.settings.max_request_bytes), PutBody)
    options = PutOptions(
        ttl_seconds=body.ttl_seconds,
        timestamp=body.timestamp,
        message_id=check_message_id(request.headers.get("idempotency-key")),
        if_version=int_header(request, "if-match"),
        if_absent=request.headers.get("if-none-match", "").strip() == "*",
        base_version=body.base_version,
        approval_required=body.approval_required,
    )
    entry, created = await service.put(principal, request.path_params["namespace"],
                                       _key(request), body.value, options)
    return _entry_response(entry, 201 if created else 200)


async def get_entry(request: Request) -> Response:
    principal = await authenticate(request)
    entry = await services(request).memory.get(principal, request.path_params["namespace"],
                                               _key(request))
    return _entry_response(entry)


async def delete_entry(request: Request) -> Response:
    principal = await authenticate(request)
    entry = await services(request).memory.delete(
        principal, request.path_params["namespace"], _key(request),
        timestamp=int_param(request, "timestamp", "invalid_timestamp"),
        message_id=check_message_id(request.headers.get("idempotency-key")),
        if_version=int_header(request, "if-match"),
        approval_required=request.query_params.get("approval_required") in ("true", "1"),
    )
    return _entry_response(entry)


async def query_entries(request: Request) -> Response:
    principal = await authenticate(request)
    page = await services(request).memory.query(
        principal, request.path_params["namespace"], request.query_params.get("pattern", "*"),
        request.query_params.get("cursor"), int_param(request, "limit"),
    )
    return json_response(page)


async def entry_history(request: Request) -> Response:
    principal = await authenticate(request)
    key = _key(request)
    versions = await services(request).memory.history(
        principal, request.path_params["namespace"], key, int_param(request, "limit"))
    return json_response({"namespace": request.path_params["namespace"], "key": key,
                          "versions": versions})


def _key_route(path: str, endpoint: Callable[[Request], Awaitable[Response]], method: str
               ) -> Route:
    """A route whose `{key:path}` takes every character to the end of the path. Starlette's
    `.*` stops at a newline and its `$` also matches before a trailing one, so `a%0A` would
    reach the handler as key `a` and write another entry; whole, the key fails validation."""
    route = Route(path, endpoint, methods=[method])
    route.path_regex = re.compile(route.path_regex.pattern.removesuffix("$") + r"\Z", re.DOTALL)
    return route


# The hot routes first: the router tries routes in order, a few microseconds each.
routes = [
    _key_route("/v1/namespaces/{namespace}/memory/{key:path}", put_entry, "PUT"),
    _key_route("/v1/namespaces/{namespace}/memory/{key:path}", get_entry, "GET"),
    _key_route("/v1/namespaces/{namespace}/memory/{key:path}", delete_entry, "DELETE"),
    Route("/v1/namespaces/{namespace}/memory", query_entries, methods=["GET"]),
    _key_route("/v1/namespaces/{namespace}/history/{key:path}", entry_history, "GET"),
]
