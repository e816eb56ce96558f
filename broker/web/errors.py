"""What REST answers for what a route raised: the broker's errors in their one shape, Starlette's
own (404, 405, ...) in it too, a proposal as 202, and store failures as `Failures` maps them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from broker.core.errors import MempError
from broker.services.approval import Proposed
from broker.services.failures import FAILURES
from broker.services.limits import RateLimited
from broker.web.http import error_response, json_response
from broker.web.services import services

Handler = Callable[[Request, Exception], Awaitable[Response]]
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
               415: "unsupported_media_type"}


async def _failed(request: Request, exc: Exception) -> Response:
    error = services(request).failures.error(exc, f"{request.method} {request.url.path}")
    if isinstance(error, RateLimited) and error.hold_ms:
        await asyncio.sleep(error.hold_ms / 1000)  # a flood's refusals come late (limits.py)
    return error_response(error)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "invalid_request")
    message = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
    headers, details = {}, {}
    if exc.status_code == 404:  # whoever opens the broker's root in a browser learns where to go
        details["api_reference"] = "/docs"
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(_allowed_methods(request))
    return error_response(MempError(code, message, details, headers=headers))


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (GET, PUT and DELETE are separate routes)."""
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches({**request.scope, "method": next(iter(route.methods))})
            if match == Match.FULL:
                methods |= route.methods
    return sorted(methods)


async def _proposed(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Proposed)
    return json_response(exc.proposal, 202, {"Location": f"/v1/namespaces/{exc.proposal.namespace}"
                                                          f"/proposals/{exc.proposal.id}"})


def handlers() -> dict[type[Exception], Handler]:
    """The app's exception handlers."""
    return {**dict.fromkeys(FAILURES, _failed), Proposed: _proposed, HTTPException: _http_error}
