"""Resource subscriptions backed by the change log: each followed URI is a hub Subscriber (the
same one SSE streams use, so cells stay as visible as through MEMP and revocations end it),
and a pump that turns its changes into `notifications/resources/updated`.

Two eras of the protocol ask for them differently: a handshake-era session sends
`resources/subscribe` and hears on its standalone stream (`Watches`, one per connection); a
2026-07-28 client opens a `subscriptions/listen` request whose response is the stream
(`listen`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ResourceUpdated,
    event_to_notification,
)

from broker.core.errors import MempError
from broker.core.grammar import compile_pattern
from broker.mcp.resources import parse_uri
from broker.runtime.settings import Settings
from broker.services.auth import Principal
from broker.services.memory import MemoryService
from broker.services.namespaces import NamespaceRegistry
from broker.streaming.hub import Hub, Subscriber
from broker.streaming.leases import StreamLeases
from broker.streaming.options import parse_options
from broker.streaming.revocation import StreamGuard

Notify = Callable[[str], Awaitable[None]]


class Watcher:
    """Makes subscribers for `memp://` URIs, checked against the caller's grants. Each
    followed URI is an open stream: it holds a lease on its namespace's (and its
    credential's) open streams, as an SSE stream does, until it is left."""

    def __init__(self, settings: Settings, hub: Hub, namespaces: NamespaceRegistry,
                 memory: MemoryService, guard: StreamGuard, leases: StreamLeases) -> None:
        self.settings = settings
        self.hub = hub
        self.namespaces = namespaces
        self.memory = memory
        self.guard = guard
        self.leases = leases
        self.held: dict[Subscriber, str] = {}  # subscriber -> its stream lease

    @property
    def send_timeout(self) -> float:
        """How long one notification may wait to be sent before its subscription ends."""
        return self.settings.sse_send_timeout_seconds

    @property
    def most(self) -> int:
        """URIs one connection (or one listen stream) may follow."""
        return self.settings.max_stream_patterns

    async def join(self, principal: Principal, uri: str) -> Subscriber:
        """A subscriber following `uri`, joined to the hub and watched by the stream guard;
        needs `subscribe` on the namespace, as an SSE stream does, and room under its
        `max_streams` and the credential's MEMP_MAX_STREAMS_PER_TOKEN (else 429
        `quota_exceeded`)."""
        target = parse_uri(uri)
        options = parse_options(target.filter, None, None)
        await self.namespaces.require(principal, "subscribe", target.namespace)
        pattern = compile_pattern(target.watched, self.settings.max_key_bytes)
        reviews = frozenset({target.namespace} if principal.can("review", target.namespace)
                            else ())
        subscriber = Subscriber({target.namespace: [pattern]},
                                self.settings.subscriber_queue_size,
                                self.memory.cells.viewer(principal), principal.writer_id,
                                reviews, queue_bytes=self.settings.subscriber_queue_bytes,
                                accepts=options.accepts, guard=options.guard)
        lease = await self.leases.take(principal, [target.namespace])
        try:
            await self.hub.join(subscriber)
        except BaseException:
            self.leases.drop(lease)
            raise
        self.held[subscriber] = lease
        self.guard.watch(subscriber, principal)
        return subscriber

    def leave(self, subscriber: Subscriber) -> None:
        self.guard.forget(subscriber)
        self.hub.leave(subscriber)
        lease = self.held.pop(subscriber, None)
        if lease is not None:
            self.leases.drop(lease)


async def pump(subscriber: Subscriber, uri: str, notify: Notify, send_timeout: float
               ) -> str | None:
    """Notify once per burst of changes until the subscriber is revoked or closed, or a
    notification cannot be sent within `send_timeout` seconds (MEMP_SSE_SEND_TIMEOUT_SECONDS:
    a client that stopped reading is cut off, as an SSE stream is); returns why it ended. An
    overflow or a reset is a change too: the client reads the resource again either way."""
    queue = subscriber.queue
    while True:
        changed = await queue.get() is not None
        while not queue.empty():
            changed = queue.get_nowait() is not None or changed
        if subscriber.revoked is not None:
            return subscriber.revoked
        if subscriber.closing:
            return "the broker is shutting down"
        if subscriber.overflowed:
            subscriber.rearm()
            changed = True
        if subscriber.resets:
            subscriber.resets.clear()
            changed = True
        if changed:
            try:
                await asyncio.wait_for(notify(uri), send_timeout)
            except TimeoutError:
                return "the client stopped reading"


class Watches:
    """The URIs one handshake-era connection follows, each with its pump task; closed with
    the connection (its exit stack) or one by one by `resources/unsubscribe`."""

    def __init__(self, watcher: Watcher, notify: Notify) -> None:
        self.watcher = watcher
        self.notify = notify
        self.followed: dict[str, tuple[Subscriber, asyncio.Task[str | None]]] = {}

    async def add(self, principal: Principal, uri: str) -> None:
        if uri in self.followed:
            return
        if len(self.followed) >= self.watcher.most:
            raise MempError("invalid_request", f"a session follows at most "
                            f"{self.watcher.most} resources; unsubscribe from one first")
        subscriber = await self.watcher.join(principal, uri)
        task = asyncio.create_task(pump(subscriber, uri, self.notify,
                                        self.watcher.send_timeout),
                                   name="memp-mcp-subscription")
        self.followed[uri] = (subscriber, task)
        task.add_done_callback(lambda _: self._ended(uri, subscriber))

    def _ended(self, uri: str, subscriber: Subscriber) -> None:
        if self.followed.get(uri, (None,))[0] is subscriber:
            del self.followed[uri]
        self.watcher.leave(subscriber)

    def remove(self, uri: str) -> None:
        followed = self.followed.pop(uri, None)
        if followed is not None:
            followed[1].cancel()

    async def close(self) -> None:
        tasks = [task for _, task in self.followed.values()]
        for uri in list(self.followed):
            self.remove(uri)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def listen(watcher: Watcher, principal: Principal, request_id: types.RequestId,
                 params: types.SubscriptionsListenRequestParams,
                 send: Callable[[types.ServerNotification], Awaitable[None]]
                 ) -> types.SubscriptionsListenResult:
    """Serve one `subscriptions/listen` stream (2026-07-28): acknowledge what is honored,
    then a `notifications/resources/updated` per change of each URI, until the client goes
    away (which cancels this), the token loses its right, or the broker stops."""
    requested = params.notifications
    uris = list(dict.fromkeys(requested.resource_subscriptions or ()))
    if len(uris) > watcher.most:
        raise MempError("invalid_request", f"a listen stream follows at most {watcher.most} "
                        "resources")
    meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: request_id}
    joined: list[tuple[str, Subscriber]] = []
    try:
        for uri in uris:  # joined before the ack, so no change after it is missed
            joined.append((uri, await watcher.join(principal, uri)))
        # The resource list and tools never change by themselves here: those kinds are
        # honored (as a subscription to a quiet resource is) and never fire.
        honored = types.SubscriptionFilter(
            tools_list_changed=True if requested.tools_list_changed else None,
            prompts_list_changed=True if requested.prompts_list_changed else None,
            resources_list_changed=True if requested.resources_list_changed else None,
            resource_subscriptions=uris or None)
        await send(types.SubscriptionsAcknowledgedNotification(
            params=types.SubscriptionsAcknowledgedNotificationParams(notifications=honored,
                                                                     _meta=meta)))

        async def updated(uri: str) -> None:
            await send(event_to_notification(ResourceUpdated(uri), meta))

        async with anyio.create_task_group() as group:
            async def follow(uri: str, subscriber: Subscriber) -> None:
                await pump(subscriber, uri, updated, watcher.send_timeout)
                group.cancel_scope.cancel()  # one ended (revoked, shutdown): the stream ends

            for uri, subscriber in joined:
                group.start_soon(follow, uri, subscriber)
            if not joined:
                await anyio.sleep_forever()
    finally:
        for _, subscriber in joined:
            watcher.leave(subscriber)
    return types.SubscriptionsListenResult(_meta=meta)
