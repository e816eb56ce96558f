"""HTTP plumbing shared by the routes: bounded body reading, JSON decoding, responses."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from broker.auth import Principal
from broker.errors import MempError
from broker.models import encode

T = TypeVar("T")
JSON = "application/json"


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> Response:
    return Response(encode(payload), status_code=status, media_type=JSON, headers=headers)


def error_response(error: MempError) -> Response:
    return Response(error.encode(), status_code=error.status, media_type=JSON,
                    headers=error.headers)


async def authenticate(request: Request) -> Principal:
    principal: Principal = await request.app.state.auth.authenticate(
        request.headers.get("authorization"))
    return principal


def _check_content_type(request: Request) -> None:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != JSON and not (media.startswith("application/") and media.endswith("+json")):
        raise MempError("unsupported_media_type", "send the body as application/json",
                        {"content_type": media or None})


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing anything over `limit` bytes before it is all read."""
    _check_content_type(request)
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise MempError("invalid_request", "Content-Length must be a number")
        if int(declared) > limit:
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


def int_header(request: Request, name: str) -> int | None:
    """A version number from If-Match (`"3"`, `3` or `W/"3"`)."""
    raw = request.headers.get(name)
    if raw is None:
        return None
    text = raw.strip().removeprefix("W/").strip('"')
    if not text.isdigit():
        raise MempError("invalid_request", f"{name} must name a version, like \"3\"")
    return int(text)


def int_param(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit():
        raise MempError("invalid_request", f"{name} must be a positive integer")
    return int(raw)
