"""MCP resource subscriptions are open streams (docs/limits.md): each followed resource holds a
lease like an SSE stream, counted against the namespace's `max_streams` and the credential's
MEMP_MAX_STREAMS_PER_TOKEN, freed when it is left, and ended when its key is revoked."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from broker.core.grammar import compile_pattern
from broker.mcp.resources import entry_uri
from broker.mcp.watch import pump
from broker.services.visibility import Viewer
from broker.streaming.hub import Subscriber
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, BrokerProcess
from tests.support.limits import agent_key, open_stream, set_limits, usage
from tests.support.mcp import LEGACY_SUBSCRIBE, WAIT, call, connect, register, run


def streams(broker: Broker, ns: str) -> int:
    with broker.client() as admin:
        return usage(admin, ns)["streams"]


def wait_streams(broker: Broker, ns: str, expected: int) -> None:
    deadline = time.monotonic() + WAIT
    while streams(broker, ns) != expected:
        assert time.monotonic() < deadline, f"streams stayed at {streams(broker, ns)}"
        time.sleep(0.05)


@LEGACY_SUBSCRIBE
@pytest.mark.parametrize("backend", BACKENDS)
def test_subscriptions_count_against_both_caps(broker_factory: Callable[..., Broker],
                                               ns: str, backend: str) -> None:
    broker = broker_factory(backend, max_streams_per_token=2)
    with broker.client() as admin:
        set_limits(admin, ns, max_streams=3)
    _, first = register(broker, ns, "first")
    _, second = register(broker, ns, "second")

    async def main() -> None:
        async with connect(broker, first, "legacy") as client:
            await client.subscribe_resource(entry_uri(ns, "a"))
            await client.subscribe_resource(entry_uri(ns, "b"))
            assert streams(broker, ns) == 2
            with pytest.raises(MCPError) as caught:  # the token's third
                await client.subscribe_resource(entry_uri(ns, "c"))
            assert caught.value.data["code"] == "quota_exceeded"
            assert caught.value.data["details"]["limit"] == "max_streams_per_token"
            async with connect(broker, second) as other, \
                    other.listen(resource_subscriptions=[entry_uri(ns, "x")]):
                assert streams(broker, ns) == 3
                with pytest.raises(MCPError) as full:  # the namespace's cap
                    async with other.listen(resource_subscriptions=[entry_uri(ns, "y")]):
                        pass
                assert full.value.data["details"] == {"limit": "max_streams", "max": 3,
                                                      "used": 3, "requested": 1}
                client_sse, stream, refused = open_stream(broker, second, ns)
                refused.read()
                assert refused.status_code == 429  # SSE and MCP share the count
                stream.__exit__(None, None, None)
                client_sse.close()
            await client.unsubscribe_resource(entry_uri(ns, "a"))
            await asyncio.to_thread(wait_streams, broker, ns, 1)
            await client.subscribe_resource(entry_uri(ns, "c"))  # room again
            await call(client, "memory_put", key="c", value=1)
        await asyncio.to_thread(wait_streams, broker, ns, 0)  # the session's end frees all

    run(main())


@LEGACY_SUBSCRIBE
def test_a_revoked_key_ends_its_resource_subscriptions(broker: Broker, ns: str) -> None:
    """Handshake era: the session stays, its subscriptions end and stop counting."""
    with broker.client() as admin:
        made = admin.post("/v1/keys", json={"name": "mcp", "grants": [
            {"namespace": ns, "permissions": ["read", "subscribe"]}]}).json()

    async def main() -> None:
        async with connect(broker, made["api_key"], "legacy") as client:
            await client.subscribe_resource(entry_uri(ns, "a"))
            await client.subscribe_resource(entry_uri(ns, "b"))
            assert streams(broker, ns) == 2
            with broker.client() as admin:
                assert admin.delete(f"/v1/keys/{made['key']['id']}").status_code in (200, 204)
            await asyncio.to_thread(wait_streams, broker, ns, 0)

    run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_revoked_key_ends_its_listen_stream(broker_factory: Callable[..., Broker], ns: str,
                                              backend: str) -> None:
    broker = broker_factory(backend)
    with broker.client() as admin:
        made = admin.post("/v1/keys", json={"name": "mcp", "grants": [
            {"namespace": ns, "permissions": ["read", "subscribe"]}]}).json()

    async def main() -> None:
        async with connect(broker, made["api_key"]) as client, \
                client.listen(resource_subscriptions=[entry_uri(ns, "a")]) as events:
            assert streams(broker, ns) == 1
            with broker.client() as admin:
                assert admin.delete(f"/v1/keys/{made['key']['id']}").status_code in (200, 204)
            with pytest.raises(StopAsyncIteration):  # the stream ends
                await asyncio.wait_for(anext(events), WAIT)
        await asyncio.to_thread(wait_streams, broker, ns, 0)

    run(main())


def test_two_processes_count_subscriptions_together(
        broker_process: Callable[..., BrokerProcess], ns: str) -> None:
    brokers = [broker_process(), broker_process()]
    with httpx.Client(base_url=brokers[0].url, timeout=WAIT,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        set_limits(admin, ns, max_streams=1)
        token = agent_key(admin, ns)

    async def main() -> None:
        async with connect(brokers[0], token) as first, \
                first.listen(resource_subscriptions=[entry_uri(ns, "a")]), \
                connect(brokers[1], token) as second:
            with pytest.raises(MCPError) as caught:
                async with second.listen(resource_subscriptions=[entry_uri(ns, "b")]):
                    pass
            assert caught.value.data["details"]["limit"] == "max_streams"

    run(main())


@LEGACY_SUBSCRIBE
def test_refused_subscriptions_take_no_lease(broker: Broker, ns: str) -> None:
    """A subscription without `subscribe`, to another namespace, or to a malformed URI is
    refused before it is counted: the namespace's streams stay at zero."""
    with broker.client() as admin:
        set_limits(admin, ns, max_streams=1)
        reader = admin.post("/v1/keys", json={"name": "reader", "grants": [
            {"namespace": ns, "permissions": ["read"]}]}).json()["api_key"]
        other = admin.post("/v1/keys", json={"name": "other", "grants": [
            {"namespace": f"{ns}-x", "permissions": ["read", "subscribe"]}]}).json()["api_key"]

    async def main() -> None:
        for token, uri in ((reader, entry_uri(ns, "a")), (other, entry_uri(ns, "a")),
                           (other, "memp://NOT A NAMESPACE/a"), (other, "file:///etc/passwd")):
            async with connect(broker, token, "legacy") as client:
                with pytest.raises(MCPError):
                    await client.subscribe_resource(uri)
        assert streams(broker, ns) == 0
        _, agent = register(broker, ns, "fits")
        async with connect(broker, agent, "legacy") as client:
            await client.subscribe_resource(entry_uri(ns, "a"))  # the one stream still fits
            assert streams(broker, ns) == 1

    run(main())


def test_a_subscription_whose_client_stopped_reading_ends() -> None:
    """As an SSE stream whose socket accepts nothing is closed after
    MEMP_SSE_SEND_TIMEOUT_SECONDS, a subscription whose notification cannot be sent in that
    time ends (and with it its lease); one whose client reads goes on."""
    sent: list[str] = []

    async def reads(uri: str) -> None:
        sent.append(uri)

    async def stuck(uri: str) -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        reading = Subscriber({"a": [compile_pattern("*")]}, 10, Viewer(""))
        follows = asyncio.create_task(pump(reading, "memp://a/x", reads, 0.05))
        reading.overflowed = True  # a change the client must hear about
        reading.nudge()
        await asyncio.sleep(0.2)
        assert sent == ["memp://a/x"] and not follows.done()
        follows.cancel()
        stopped = Subscriber({"a": [compile_pattern("*")]}, 10, Viewer(""))
        ended = asyncio.create_task(pump(stopped, "memp://a/x", stuck, 0.05))
        stopped.overflowed = True
        stopped.nudge()
        assert await asyncio.wait_for(ended, WAIT) == "the client stopped reading"

    run(main())
