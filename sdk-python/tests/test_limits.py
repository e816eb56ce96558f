"""Fair share from the SDK: limits in the configuration, usage, and the typed 429s
(`RateLimited` with `retry_after`, retried when the wait is short; `QuotaExceeded`, never
retried), sync and async, against a real broker on real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from memp import (
    MEMP,
    ApprovalPending,
    AsyncMEMP,
    Limits,
    NamespaceConfig,
    NotFound,
    PutMessage,
    QuotaExceeded,
    RateLimited,
    StrategyRule,
    UsageReport,
)
from tests.support.brokers import ADMIN_KEY, Broker


def agent_key(server: Broker, ns: str, name: str = "limited") -> str:
    """The API key of a newly registered agent (the broker's admin key is exempt from rates)."""
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as registrar:
        registrar.register(name)
        assert registrar.api_key is not None
        return registrar.api_key


def agent(server: Broker, admin: MEMP, ns: str, **options: Any) -> MEMP:
    return MEMP(api_key=agent_key(server, ns), namespace=ns, base_url=server.url, **options)


def test_limits_usage_and_quota_exceeded(client: MEMP, server: Broker, ns: str) -> None:
    stored = client.namespaces.update_config(limits=Limits(max_keys=1, max_bytes=100))
    assert stored.limits == Limits(max_keys=1, max_bytes=100)
    with agent(server, client, ns) as writer:
        writer.memory.put("a", {"n": 1})
        with pytest.raises(QuotaExceeded) as refused:
            writer.memory.put("b", {"n": 2})
        assert (refused.value.limit, refused.value.used, refused.value.maximum) == \
            ("max_keys", 1, 1)
        assert refused.value.status == 429
    report = client.namespaces.usage()
    assert isinstance(report, UsageReport)
    assert (report.usage.keys, report.usage.bytes, report.usage.streams) == (1, 7, 0)
    assert report.limits.max_keys == 1
    assert client.namespaces.config().limits == Limits(max_keys=1, max_bytes=100)


def test_rate_limited_is_retried_when_the_wait_is_short(client: MEMP, server: Broker,
                                                        ns: str) -> None:
    client.namespaces.update_config(limits=Limits(writes_per_second=2, write_burst=1))
    with agent(server, client, ns) as writer:
        writer.memory.put("a", 1)
        writer.memory.put("b", 2)  # 429 with Retry-After: 1, then applied on the retry
        assert client.memory.get("b") == 2


def test_rate_limited_carries_retry_after_when_the_wait_is_long(client: MEMP, server: Broker,
                                                                ns: str) -> None:
    client.namespaces.update_config(limits=Limits(writes_per_second=0.001, write_burst=1))
    with agent(server, client, ns) as writer:
        writer.memory.put("a", 1)
        with pytest.raises(RateLimited) as refused:
            writer.memory.put("b", 2)
        assert refused.value.retry_after is not None and refused.value.retry_after > 900
        assert refused.value.scope == "namespace"
        replies = writer.messages.batch([PutMessage(key="c", value=3)])
        with pytest.raises(RateLimited) as in_batch:
            replies[0].raise_for_error()
        assert in_batch.value.retry_after is not None and in_batch.value.retry_after > 900
    for key in ("b", "c"):
        with pytest.raises(NotFound):
            client.memory.get_entry(key)


def test_async_usage_and_rate_limited(aclient_factory: Callable[..., AsyncMEMP], client: MEMP,
                                      server: Broker, ns: str) -> None:
    client.namespaces.update_config(limits=Limits(reads_per_second=0.001, read_burst=1))
    key = agent_key(server, ns, "reader")

    async def scenario() -> None:
        async with aclient_factory() as admin, aclient_factory(api_key=key) as reader:
            await admin.memory.put("a", 1)
            assert await reader.memory.get("a") == 1
            with pytest.raises(RateLimited):
                await reader.memory.get("a")
            report = await admin.namespaces.usage()
            assert report.limits.reads_per_second == 0.001 and report.usage.keys == 1

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_proposals_under_limits(client: MEMP, server: Broker, ns: str) -> None:
    """A proposal takes a write token (RateLimited past the burst); an approval over a quota
    raises QuotaExceeded and leaves the proposal pending."""
    client.namespaces.set_config(NamespaceConfig(
        rules=[StrategyRule("facts/*", approval="required")],
        limits=Limits(writes_per_second=0.001, write_burst=1, max_keys=0)))
    with agent(server, client, ns) as writer:
        with pytest.raises(ApprovalPending) as pending:
            writer.memory.put("facts/a", 1)
        with pytest.raises(RateLimited) as refused:
            writer.memory.put("facts/b", 2)
        assert refused.value.retry_after is not None and refused.value.retry_after > 900
    proposal = pending.value.proposal
    with pytest.raises(QuotaExceeded) as over:
        client.proposals.approve(proposal.id)
    assert (over.value.limit, over.value.used, over.value.maximum) == ("max_keys", 0, 0)
    assert [p.id for p in client.proposals.list(status="pending").proposals] == [proposal.id]
