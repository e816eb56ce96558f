"""HTTP plumbing shared by the routes: bounded body reading, JSON decoding, responses."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, TypeVar

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.core.errors import MempError
from broker.core.models import MAX_SAFE_INT, encode
from broker.core.nesting import check_body
from broker.runtime.logs import request_id
from broker.services.auth import Principal
from broker.web.services import services

log = logging.getLogger("memp")
T = TypeVar("T")
JSON = "application/json"
_DIGITS_RE = re.compile(r"[0-9]+")


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> Response:
    return Response(encode(payload), status_code=status, media_type=JSON, headers=headers)


def error_response(error: MempError) -> Response:
    """The error's JSON reply, carrying the request's id (`error.request_id`) to quote in a
    report."""
    body = error.body()
    rid = request_id.get()
    if rid is not None:
        body["error"]["request_id"] = rid
    return Response(msgspec.json.encode(body), status_code=error.status, media_type=JSON,
                    headers=error.headers)


class InternalErrorMiddleware:
    """Answers a request whose handler failed unexpectedly with `500 internal` in the error
    shape, its request id included, and keeps the connection open. Left to the server, the
    exception would close the connection under a keep-alive client, whose next request on it
    then fails with a reset. A reply already begun (a stream) is ended by the server."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except ClientDisconnect:  # the client went (or its connection was closed) mid-body
            log.info("the client went away before %s %s was read", scope["method"],
                     scope.get("path", ""))
        except Exception:
            if started:
                raise
            log.exception("unhandled error on %s %s", scope["method"], scope.get("path", ""))
            await error_response(MempError("internal", "internal error"))(scope, receive, send)


_REQUEST_ID_RE = re.compile(r"[!-~]{1,128}")


async def authenticate(request: Request) -> Principal:
    """The caller, carrying the request's X-Request-ID (printable ASCII, at most 128
    characters; anything else is left out) for the audit log."""
    principal = await services(request).auth.authenticate(
        request.headers.get("authorization"))
    request_id = request.headers.get("x-request-id")
    if request_id and _REQUEST_ID_RE.fullmatch(request_id):
        principal = dataclasses.replace(principal, request_id=request_id)
    return principal


def _check_content_type(request: Request) -> None:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != JSON and not (media.startswith("application/") and media.endswith("+json")):
        raise MempError("unsupported_media_type", "send the body as application/json",
                        {"content_type": media or None})


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing anything over `limit` bytes before it is all read, and JSON
    nested deeper than MEMP_MAX_JSON_DEPTH before it is decoded."""
    _check_content_type(request)
    declared = request.headers.get("content-length")
    if declared is not None:
        if not _DIGITS_RE.fullmatch(declared):
            raise MempError("invalid_request", "Content-Length must be a number")
        if len(declared.lstrip("0")) > 18 or int(declared) > limit:
            raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body.isascii():
        # msgspec keeps `value` as Raw without checking its strings, so invalid UTF-8 would be
        # stored as it came and served back as broken JSON.
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MempError("invalid_json", f"body is not valid UTF-8 (byte {exc.start})") \
                from None
    check_body(body, services(request).settings.max_json_depth)
    return body


def _too_large(limit: int) -> MempError:
    return MempError("payload_too_large", f"request body is over {limit} bytes",
                     {"limit": limit})


def decode_json(body: bytes, kind: type[T]) -> T:
    """Decode into a wire Struct; syntax errors are `invalid_json`, shape errors
    `invalid_request`."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise MempError("invalid_request", str(exc)) from None
    except msgspec.DecodeError as exc:
        raise MempError("invalid_json", f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise MempError("invalid_json", "JSON is nested too deeply") from None


def _wire_int(text: str) -> int | None:
    """ASCII digits within the integers every client can hold exactly, else None."""
    if not _DIGITS_RE.fullmatch(text) or len(text.lstrip("0")) > 16:
        return None
    number = int(text)
    return number if number <= MAX_SAFE_INT else None


def int_header(request: Request, name: str, minimum: int = 1) -> int | None:
    """A version number from If-Match (`"3"`, `3` or `W/"3"`), `minimum` to 2^53 - 1."""
    raw = request.headers.get(name)
    if raw is None:
        return None
    number = _wire_int(raw.strip().removeprefix("W/").strip('"'))
    if number is None or number < minimum:
        raise MempError("invalid_request", f"{name} must name a version from {minimum} to "
                        f"{MAX_SAFE_INT}, like \"3\"", {"header": name})
    return number


def int_param(request: Request, name: str, code: str = "invalid_request") -> int | None:
    """A positive integer query parameter, 1 to 2^53 - 1; `code` names the error otherwise."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    number = _wire_int(raw)
    if number is None or number < 1:
        # digits out of range get `code` (a timestamp's is invalid_timestamp); anything else
        # is not a number at all
        raise MempError(code if _DIGITS_RE.fullmatch(raw) else "invalid_request",
                        f"{name} must be an integer from 1 to {MAX_SAFE_INT}",
                        {"parameter": name})
    return number
