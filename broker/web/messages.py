"""Protocol messages: decode, check the sender, dispatch to the services, build the reply."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import msgspec

from broker import PROTOCOL_VERSION
from broker.core.clock import Clock
from broker.core.errors import MempError
from broker.core.grammar import NAMESPACE_RE
from broker.core.models import (
    AgentGetMessage,
    AgentListMessage,
    AnyMessage,
    DeleteMessage,
    GetMessage,
    HistoryMessage,
    ProposalApproveMessage,
    ProposalGetMessage,
    ProposalListMessage,
    ProposalRejectMessage,
    PutMessage,
    QueryMessage,
    RegisterMessage,
    message_decoder,
)
from broker.governance.proposals import ProposalService
from broker.services.agents import AgentService
from broker.services.approval import Proposed, pending
from broker.services.auth import Principal
from broker.services.failures import FAILURES, Failures
from broker.services.fields import check_message_id
from broker.services.memory import MemoryService, PutOptions
from broker.services.outcomes import entry_warnings


class MessageHandler:
    """Runs one protocol message and returns its reply (`ack`, `result` or `error`)."""

    def __init__(self, memory: MemoryService, agents: AgentService, clock: Clock,
                 proposals: ProposalService, failures: Failures) -> None:
        self.memory = memory
        self.failures = failures
        self.proposals = proposals
        self.agents = agents
        self.clock = clock

    def decode(self, raw: bytes) -> AnyMessage:
        try:
            return message_decoder.decode(raw)
        except msgspec.ValidationError as exc:
            raise MempError("invalid_request", f"invalid message: {exc}") from None
        except msgspec.DecodeError as exc:
            raise MempError("invalid_json", f"message is not valid JSON: {exc}") from None
        except RecursionError:
            raise MempError("invalid_json", "JSON is nested too deeply") from None

    async def handle_raw(self, principal: Principal, raw: bytes) -> tuple[int, dict[str, Any]]:
        """Reply to one encoded message; returns the HTTP status it would have alone."""
        message: AnyMessage | None = None
        try:
            message = self.decode(raw)
            return 200, await self.handle(principal, message)
        except FAILURES as exc:
            error = self.failures.error(exc, f"message {message and message.id}")
            return error.status, self.error_reply(error, message)

    async def handle(self, principal: Principal, message: AnyMessage) -> dict[str, Any]:
        if message.memp != PROTOCOL_VERSION:
            raise MempError("invalid_request",
                            f"unsupported protocol version {message.memp!r}; this broker speaks "
                            f"{PROTOCOL_VERSION}")
        check_message_id(message.id)
        if message.agent_id is not None and message.agent_id != principal.writer_id:
            raise MempError("forbidden", "agent_id does not match the agent this token is for",
                            {"agent_id": message.agent_id})
        if message.namespace is None:
            raise MempError("invalid_namespace", "the message has no namespace")
        if message.id is not None and not principal.request_id:
            principal = dataclasses.replace(principal, request_id=message.id)
        try:
            return await self._dispatch(principal, message, message.namespace)
        except Proposed as gated:
            return self.reply("ack", message, **pending(gated))

    async def _dispatch(self, principal: Principal, message: AnyMessage, ns: str
                        ) -> dict[str, Any]:
        match message:
            case PutMessage():
                options = PutOptions(
                    ttl_seconds=message.ttl_seconds, timestamp=message.timestamp,
                    message_id=message.id, if_version=message.if_version,
                    if_absent=message.if_absent, base_version=message.base_version,
                    approval_required=message.approval_required)
                entry, _ = await self.memory.put(principal, ns, message.key, message.value,
                                                 options)
                return self.reply("ack", message, entry=entry, warnings=entry_warnings(entry))
            case DeleteMessage():
                entry = await self.memory.delete(
                    principal, ns, message.key, timestamp=message.timestamp,
                    message_id=message.id, if_version=message.if_version,
                    approval_required=message.approval_required)
                return self.reply("ack", message, entry=entry)
            case ProposalListMessage():
                listed = await self.proposals.list(principal, ns, message.status, message.key,
                                                   message.cursor, message.limit)
                return self.reply("result", message, proposals=listed.proposals,
                                  next_cursor=listed.next_cursor)
            case ProposalGetMessage():
                proposal = await self.proposals.get(principal, ns, message.proposal)
                return self.reply("result", message, proposal=proposal)
            case ProposalApproveMessage():
                proposal, written = await self.proposals.approve(
                    principal, ns, message.proposal, message.base_version)
                return self.reply("ack", message, proposal=proposal, entry=written)
            case ProposalRejectMessage():
                proposal = await self.proposals.reject(principal, ns, message.proposal,
                                                       message.reason)
                return self.reply("ack", message, proposal=proposal)
            case GetMessage():
                entry = await self.memory.get(principal, ns, message.key)
                return self.reply("result", message, entry=entry)
            case QueryMessage():
                page = await self.memory.query(principal, ns, message.pattern, message.cursor,
                                               message.limit)
                return self.reply("result", message, entries=page.entries,
                                  next_cursor=page.next_cursor)
            case HistoryMessage():
                versions = await self.memory.history(principal, ns, message.key, message.limit)
                return self.reply("result", message, key=message.key, versions=versions)
            case RegisterMessage():
                registration = await self.agents.register(principal, ns, message.name,
                                                          message.framework, message.id,
                                                          message.new)
                return self.reply("ack", message, agent=registration.agent,
                                  credentials=registration.credentials,
                                  **({"reused": True} if registration.reused else {}))
            case AgentGetMessage():
                agent = await self.agents.get(principal, ns, message.agent)
                return self.reply("result", message, agent=agent)
            case AgentListMessage():
                agents, cursor = await self.agents.list(principal, ns, message.cursor,
                                                        message.limit)
                return self.reply("result", message, agents=agents, next_cursor=cursor)
        raise MempError("invalid_request", "unknown message type")  # pragma: no cover

    def reply(self, kind: str, message: AnyMessage | None, **payload: Any) -> dict[str, Any]:
        return {
            "memp": PROTOCOL_VERSION,
            "type": kind,
            "id": str(uuid.uuid4()),
            "reply_to": message.id if message is not None else None,
            "timestamp": self.clock(),
            "namespace": message.namespace if message is not None else None,
            **payload,
        }

    def error_reply(self, error: MempError, message: AnyMessage | None) -> dict[str, Any]:
        """The error reply to `message` (None when it could not be decoded), naming its
        namespace when that is one."""
        reply = self.reply("error", message, **error.body())
        namespace = reply["namespace"]
        if not (isinstance(namespace, str) and NAMESPACE_RE.fullmatch(namespace)):
            reply["namespace"] = None
        return reply
