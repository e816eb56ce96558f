"""The audit log: list it (newest first), export it as NDJSON, verify its hash chain."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from broker.core.errors import MempError
from broker.core.models import encode
from broker.services.audit import AuditFilter, AuditService, parse_time
from broker.web.http import authenticate, int_param, json_response
from broker.web.services import services

NDJSON = "application/x-ndjson"


def _filter(request: Request) -> AuditFilter:
    params = request.query_params
    selection = AuditFilter(
        since=parse_time(params.get("since"), "since"),
        until=parse_time(params.get("until"), "until"), after=params.get("after") or None,
        actor=params.get("actor") or None, key=params.get("key") or None,
        action=params.get("action") or None)
    return AuditService.check_filter(selection, services(request).settings.max_key_bytes)


def _ndjson(request: Request) -> bool:
    """Export asked for: `format=ndjson`, or `Accept: application/x-ndjson`."""
    wanted = request.query_params.get("format")
    if wanted not in (None, "", "json", "ndjson"):
        raise MempError("invalid_request", "format must be json or ndjson",
                        {"parameter": "format"})
    return wanted == "ndjson" or (wanted in (None, "")
                                  and NDJSON in request.headers.get("accept", ""))


async def list_audit(request: Request) -> Response:
    principal = await authenticate(request)
    namespace = request.path_params["namespace"]
    selection = _filter(request)
    service = services(request).audit
    if _ndjson(request):
        records = service.export(principal, namespace, selection)
        first = await anext(records, None)  # refusals are answered before the stream starts

        async def lines() -> AsyncIterator[bytes]:
            if first is None:
                return
            yield encode(first) + b"\n"
            async for record in records:
                yield encode(record) + b"\n"

        return StreamingResponse(lines(), media_type=NDJSON)
    page = await service.page(principal, namespace, selection, request.query_params.get("cursor"),
                              int_param(request, "limit"))
    return json_response(page)


async def verify_audit(request: Request) -> Response:
    principal = await authenticate(request)
    verdict = await services(request).audit.verify(principal, request.path_params["namespace"])
    return json_response(verdict)


routes = [
    Route("/v1/namespaces/{namespace}/audit", list_audit, methods=["GET"]),
    Route("/v1/namespaces/{namespace}/audit/verify", verify_audit, methods=["GET"]),
]
