"""The subscription endpoint: Server-Sent Events for one or several namespace/pattern pairs."""

from __future__ import annotations

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.core.errors import MempError
from broker.core.grammar import Pattern, compile_pattern, validate_namespace
from broker.services.auth import Principal
from broker.streaming.leases import StreamLeases
from broker.streaming.options import parse_options
from broker.streaming.revocation import StreamGuard
from broker.web.frames import parse_cursor
from broker.web.http import authenticate
from broker.web.services import services
from broker.web.sse import EventStreamResponse
from broker.web.streams import EventStream, StreamRequest


async def _targets(request: Request, principal: Principal, limit: int, max_key_bytes: int
                   ) -> dict[str, list[Pattern]]:
    pairs: list[tuple[str, str]] = []
    for item in request.query_params.getlist("sub"):
        namespace, sep, pattern = item.partition(":")
        if not sep:
            raise MempError("invalid_request", "sub must be 'namespace:pattern'",
                            {"sub": item[:200]})
        pairs.append((namespace, pattern))
    single = request.query_params.get("namespace")
    if single is not None:
        patterns = request.query_params.getlist("pattern") or ["*"]
        pairs += [(single, pattern) for pattern in patterns]
    if not pairs:
        raise MempError("invalid_request", "name what to follow: ?namespace=&pattern= or ?sub=")
    if len(pairs) > limit:
        raise MempError("invalid_request", f"a stream follows at most {limit} patterns")
    targets: dict[str, list[Pattern]] = {}
    for namespace, text in pairs:
        validate_namespace(namespace)
        await services(request).namespaces.require(principal, "subscribe", namespace)
        targets.setdefault(namespace, []).append(compile_pattern(text, max_key_bytes))
    return targets


async def subscribe(request: Request) -> Response:
    principal = await authenticate(request)
    state = services(request)
    settings = state.settings
    query = request.query_params
    options = parse_options(query.get("filter"), query.get("conflate"), query.get("max_rate"))
    targets = await _targets(request, principal, settings.max_stream_patterns,
                             settings.max_key_bytes)
    cursor_text = request.headers.get("last-event-id") or request.query_params.get(
        "last_event_id")
    snapshot = request.query_params.get("snapshot", "").lower() in ("1", "true", "yes")
    wanted = StreamRequest(targets, parse_cursor(cursor_text), snapshot, options.accepts,
                           options.guard, options.conflate, options.max_rate)
    leases: StreamLeases = state.stream_leases
    lease = await leases.take(principal, list(targets))
    try:
        stream = EventStream(state.hub, state.changelog, state.memory, principal, wanted,
                             settings.subscriber_queue_size, settings.sse_retry_ms,
                             state.metrics, queue_bytes=settings.subscriber_queue_bytes,
                             on_close=lambda: leases.drop(lease))
        lost = await stream.open()
    except BaseException:
        leases.drop(lease)
        raise
    guard: StreamGuard = state.stream_guard
    guard.watch(stream.subscriber, principal)

    async def close() -> None:
        """After the response, on the event loop (a plain function would run in a worker
        thread, where the hub cannot stop a reader): also the only close of a stream whose
        content never started, as a HEAD request's."""
        guard.forget(stream.subscriber)
        stream.close()  # drops the lease

    return EventStreamResponse(
        stream.frames(lost), ping=settings.heartbeat_seconds, watchdog=state.send_watchdog,
        metrics=state.metrics, ending=lambda: stream.ended,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        shutdown_event=state.hub.shutdown_event(), shutdown_grace_period=1.0,
        background=BackgroundTask(close),
    )


routes = [Route("/v1/subscribe", subscribe, methods=["GET"])]
