"""Proposals and the audit log through the Python SDK, sync and async, against a real broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from memp import (
    MEMP,
    ApprovalPending,
    AsyncMEMP,
    ConflictError,
    Forbidden,
    InvalidRequest,
    NamespaceConfig,
    StrategyRule,
)


def _gate(client: MEMP) -> None:
    client.namespaces.set_config(NamespaceConfig(
        rules=[StrategyRule("facts/*", approval="required")], allow_self_approval=True))


def test_propose_approve_rebase_reject_and_audit(client: MEMP) -> None:
    _gate(client)
    with pytest.raises(ApprovalPending) as pending:
        client.memory.put("facts/a", {"x": 1})
    proposal = pending.value.proposal
    assert proposal.status == "pending" and proposal.diff == [
        {"op": "add", "path": "", "value": {"x": 1}}]
    assert [p.id for p in client.proposals.list(status="pending").proposals] == [proposal.id]
    approval = client.proposals.approve(proposal.id)
    assert approval.entry.proposal_id == proposal.id and approval.entry.approved_by == "admin"
    assert client.memory.get("facts/a") == {"x": 1}

    with pytest.raises(ApprovalPending) as second:
        client.memory.put("facts/a", {"x": 2})
    client.namespaces.set_config(NamespaceConfig(allow_self_approval=True))
    client.memory.put("facts/a", {"x": 3})  # ungated now: the key moves
    with pytest.raises(ConflictError) as moved:
        client.proposals.approve(second.value.proposal.id)
    current = moved.value.details["current_version"]
    client.proposals.approve(second.value.proposal.id, base_version=current)
    assert client.memory.get("facts/a") == {"x": 2}

    with pytest.raises(ApprovalPending) as third:
        client.memory.delete("facts/a", approval_required=True)
    assert client.proposals.reject(third.value.proposal.id, "keep it").status == "rejected"

    page = client.audit.list(key="facts/a")
    assert [r.action for r in page.records][:2] == ["reject", "propose"]
    assert len(client.audit.export()) >= len(page.records)
    verdict = client.audit.verify()
    assert verdict.ok and verdict.broken is None


def test_async_and_permissions(aclient_factory: Callable[..., AsyncMEMP], client: MEMP
                               ) -> None:
    _gate(client)
    created = client.keys.create([{"namespace": client.namespace, "permissions": ["write"]}])

    async def run() -> None:
        async with aclient_factory() as admin, aclient_factory(
                api_key=created.api_key) as writer:
            with pytest.raises(ApprovalPending) as pending:
                await writer.memory.put("facts/b", 1)
            proposal_id = pending.value.proposal.id
            assert (await writer.proposals.get(proposal_id)).key == "facts/b"
            with pytest.raises(Forbidden):
                await writer.proposals.approve(proposal_id)
            with pytest.raises(Forbidden):
                await writer.audit.verify()
            assert (await admin.proposals.approve(proposal_id)).proposal.status == "approved"
            assert (await admin.audit.verify()).ok

    asyncio.run(run())


def test_an_export_after_a_record_id_has_only_what_was_appended_since(
    client: MEMP, aclient_factory: Callable[..., AsyncMEMP]
) -> None:
    """An operator exports the audit log incrementally: each export passes the newest id the
    previous one got as `after`, and gets exactly the records appended since, in both SDKs."""
    client.memory.put("notes/1", 1)
    first = client.audit.export()
    client.memory.put("notes/2", 2)
    client.memory.delete("notes/1")
    newer = client.audit.export(after=first[0].id)
    assert [(r.action, r.key) for r in newer] == [("delete", "notes/1"), ("put", "notes/2")]
    assert client.audit.export(after=newer[0].id) == []
    assert [r.id for r in client.audit.list(after=first[0].id).records] == [r.id for r in newer]
    assert client.audit.export(after=first[0].id, action="put") == newer[1:]
    for hostile in ("*" * 128, "1-0\x00", "99999999999999999999999-0", "1-2-3", "-1-0"):
        with pytest.raises(InvalidRequest) as refused:
            client.audit.export(after=hostile)
        assert refused.value.details == {"parameter": "after"}

    async def run() -> None:
        async with aclient_factory() as admin:
            assert await admin.audit.export(after=first[0].id) == newer
            page = await admin.audit.list(after=newer[0].id)
            assert page.records == []

    asyncio.run(run())
