"""The message endpoint: one protocol message, or a batch of them, per request."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.core.errors import MempError
from broker.web.http import authenticate, decode_json, json_response, read_body
from broker.web.services import services


async def post_messages(request: Request) -> Response:
    """A JSON object is one message (HTTP status follows its reply); a JSON array is a batch,
    run in order, answered with 200 and one reply per message."""
    principal = await authenticate(request)
    handler = services(request).messages
    settings = services(request).settings
    body = await read_body(request, settings.max_request_bytes)
    if body.lstrip()[:1] != b"[":
        status, reply = await handler.handle_raw(principal, body)
        return json_response(reply, status, _headers(reply))
    items = decode_json(body, list[msgspec.Raw])
    if not items:
        raise MempError("invalid_request", "a batch holds at least one message")
    if len(items) > settings.max_batch:
        raise MempError("payload_too_large",
                        f"a batch holds at most {settings.max_batch} messages, not {len(items)}",
                        {"limit": settings.max_batch})
    replies = [(await handler.handle_raw(principal, bytes(item)))[1] for item in items]
    waits = [_retry_after(reply) for reply in replies]
    longest = max((w for w in waits if w is not None), default=None)
    return json_response(replies, headers=None if longest is None
                         else {"Retry-After": str(longest)})


def _retry_after(reply: dict[str, object]) -> int | None:
    """The seconds a reply asks the client to wait: 1 when the store is down, the rate's wait
    when rate limited (also in the error's `details.retry_after`)."""
    error = reply.get("error")
    if not isinstance(error, dict):
        return None
    if error.get("code") == "unavailable":
        return 1
    details = error.get("details")
    if error.get("code") == "rate_limited" and isinstance(details, dict):
        return int(details.get("retry_after", 1))
    return None


def _headers(reply: dict[str, object]) -> dict[str, str] | None:
    wait = _retry_after(reply)
    return None if wait is None else {"Retry-After": str(wait)}


routes = [Route("/v1/messages", post_messages, methods=["POST"])]
