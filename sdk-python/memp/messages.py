"""Protocol messages (`POST /v1/messages`): the messages an agent sends and the one reply
shape the broker answers each with."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct

from memp.errors import error_from_body
from memp.models import Agent, Credentials, Entry, ErrorBody


class Message(Struct, kw_only=True, frozen=True, tag_field="type", omit_defaults=True):
    """Fields every protocol message has. The client fills in `namespace` (its own) and `id`
    (a fresh one, so a resent batch is applied once) where a message leaves them out."""

    memp: str = "1.0"
    id: str | None = None
    namespace: str | None = None
    timestamp: int | None = None


class RegisterMessage(Message, tag="agent.register", kw_only=True, frozen=True):
    name: str
    framework: str = "custom"


class AgentGetMessage(Message, tag="agent.get", kw_only=True, frozen=True):
    agent: str


class AgentListMessage(Message, tag="agent.list", kw_only=True, frozen=True):
    cursor: str | None = None
    limit: int | None = None


class PutMessage(Message, tag="memory.put", kw_only=True, frozen=True):
    key: str
    value: Any
    ttl_seconds: int | None = None
    if_version: int | None = None
    if_absent: bool = False
    base_version: int | None = None


class GetMessage(Message, tag="memory.get", kw_only=True, frozen=True):
    key: str


class QueryMessage(Message, tag="memory.query", kw_only=True, frozen=True):
    pattern: str = "*"
    cursor: str | None = None
    limit: int | None = None


class DeleteMessage(Message, tag="memory.delete", kw_only=True, frozen=True):
    key: str
    if_version: int | None = None


class HistoryMessage(Message, tag="memory.history", kw_only=True, frozen=True):
    key: str
    limit: int | None = None


AnyMessage = (RegisterMessage | AgentGetMessage | AgentListMessage | PutMessage | GetMessage
              | QueryMessage | DeleteMessage | HistoryMessage)


class Reply(Struct, kw_only=True, frozen=True):
    """A message's reply: `ack` (writes), `result` (reads) or `error`, with the payload its
    operation has (`entry`; `entries` + `next_cursor`; `versions`; `agent` + `credentials`;
    `agents` + `next_cursor`; or `error`). `raise_for_error()` raises the typed error."""

    type: Literal["ack", "result", "error"]
    id: str
    reply_to: str | None = None
    timestamp: int | None = None
    namespace: str | None = None
    memp: str = "1.0"
    entry: Entry | None = None
    entries: list[Entry] | None = None
    next_cursor: str | None = None
    key: str | None = None
    versions: list[Entry] | None = None
    agent: Agent | None = None
    credentials: Credentials | None = None
    agents: list[Agent] | None = None
    warnings: list[str] = []
    error: ErrorBody | None = None

    def raise_for_error(self) -> Reply:
        """This reply, or the typed MempError its `error` stands for."""
        if self.error is not None:
            raise error_from_body(self.error.code, self.error.message, self.error.details)
        return self
