"""Agent registration and look-up; registration returns an API key bound to the agent.

Registering a name again with the same credential finds the agent it made the first time and
hands out a new key bound to it, with the grants the first one had (`reused`); `new` makes
another agent of that name."""

from __future__ import annotations

import asyncio
import re
import uuid

import msgspec

from broker.core.clock import Clock
from broker.core.errors import MempError
from broker.core.grammar import validate_namespace
from broker.core.models import Agent, ApiKeyRecord, Credentials
from broker.runtime.settings import Settings
from broker.services.activity import AgentActivity
from broker.services.audit import AuditService, actor_fields
from broker.services.auth import Principal, new_api_key, new_key_id, save_api_key
from broker.services.fields import check_limit, check_message_id
from broker.services.idempotency import fingerprint, reused
from broker.storage.accounts import AccountStore
from broker.storage.writes import settle

KNOWN_FRAMEWORKS = ("langchain", "crewai", "claude", "autogen", "custom")
_FRAMEWORK_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
# A name's claim is written just before its agent's record: a registration that finds the claim
# held waits this long for the holder's record before it takes the claim as abandoned.
CLAIM_SETTLE_SECONDS = 5.0
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


class Registration(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What `agent.register` returns (`reused` only when true)."""

    agent: Agent
    credentials: Credentials
    reused: bool = False  # the agent this credential registered under this name before


class AgentService:
    """Registers agents and reads them back."""

    def __init__(self, settings: Settings, store: AccountStore, activity: AgentActivity,
                 clock: Clock, audit: AuditService) -> None:
        self.settings = settings
        self.store = store
        self.activity = activity
        self.clock = clock
        self.audit = audit

    async def register(self, principal: Principal, namespace: str, name: str, framework: str,
                       message_id: str | None = None, new: bool = False) -> Registration:
        validate_namespace(namespace)
        principal.require("write", namespace)
        check_message_id(message_id)
        if not isinstance(name, str) or not 0 < len(name) <= 200 or not name.isprintable():
            raise MempError("invalid_request", "name must be 1-200 printable characters")
        if not _FRAMEWORK_RE.fullmatch(framework):
            raise MempError(
                "invalid_request",
                f"framework must be one of {', '.join(KNOWN_FRAMEWORKS)} or a lowercase name",
            )
        if not isinstance(new, bool):
            raise MempError("invalid_request", "new must be true or false")
        sent = fingerprint("register", name, framework, new)
        planned = await self._plan(principal, namespace, name, framework, new)
        if not message_id:
            return await self._apply(principal, planned, new)
        # The reply is kept (pending) before anything is written, so a retry after a failure
        # at any later step finds it and completes that same registration, never a second.
        kept, reply, done = await self.store.reserve_reply(
            namespace, principal.writer_id, message_id, sent, msgspec.json.encode(planned))
        planned = _replayed((kept, reply), sent, message_id)
        if done or await self.store.removed_agents({planned.agent.id}):
            return planned
        result = await self._apply(principal, planned, new)
        await self.store.finish_reply(namespace, principal.writer_id, message_id, sent,
                                      msgspec.json.encode(result))
        return result

    async def _plan(self, principal: Principal, namespace: str, name: str, framework: str,
                    new: bool) -> Registration:
        """The agent (new, or the one this credential registered under this name) and new
        credentials for it, not yet stored."""
        now = self.clock()
        known = None if new else await self._claimed(principal, namespace, name)
        agent = known or Agent(id=str(uuid.uuid4()), name=name, framework=framework,
                               namespace=namespace, created_at=now, last_seen=now)
        return Registration(
            agent=agent, reused=known is not None,
            credentials=Credentials(api_key=new_api_key(self.settings.key_env),
                                    key_id=new_key_id(), agent_id=agent.id))

    async def _claimed(self, principal: Principal, namespace: str, name: str,
                       agent_id: str | None = None) -> Agent | None:
        """The live agent this credential registered under this name (`agent_id`: the one
        holding the claim, when known), or None."""
        agent_id = agent_id or await self.store.claimed_agent(namespace, principal.subject, name)
        if agent_id is None or await self.store.removed_agents({agent_id}):
            return None
        return await self.store.get_agent(namespace, agent_id)

    async def _claim(self, principal: Principal, planned: Registration) -> Registration:
        """Claim the name for the planned agent; when another registration by this credential
        holds it (two at once, on two processes), the key goes to that agent instead."""
        agent, stale = planned.agent, ""
        for _ in range(2):  # at most one stale claim (a removed agent's) to replace
            holder = await self.store.claim_agent_name(agent.namespace, principal.subject,
                                                       agent.name, agent.id, stale)
            if holder == agent.id:
                return planned
            found = await self._holder(agent.namespace, holder)
            if found is not None:
                credentials = msgspec.structs.replace(planned.credentials, agent_id=found.id)
                return Registration(agent=found, credentials=credentials, reused=True)
            stale = holder
        return planned

    async def _holder(self, namespace: str, holder: str) -> Agent | None:
        """The live agent holding a name's claim; None when it was removed, or when its record
        did not follow the claim within CLAIM_SETTLE_SECONDS (its registration never
        finished). A claim made a moment ago by another process is waited for, not taken."""
        deadline = asyncio.get_running_loop().time() + CLAIM_SETTLE_SECONDS
        while not await self.store.removed_agents({holder}):
            found = await self.store.get_agent(namespace, holder)
            if found is not None or asyncio.get_running_loop().time() > deadline:
                return found
            await asyncio.sleep(0.02)
        return None

    async def _apply(self, principal: Principal, planned: Registration, new: bool
                     ) -> Registration:
        """Store a planned registration; each step may run again (a retried registration)."""
        if not (new or planned.reused):
            planned = await self._claim(principal, planned)
        agent = planned.agent if planned.reused else await self.store.save_agent(planned.agent)
        credentials = planned.credentials
        await save_api_key(self.store, credentials.api_key, ApiKeyRecord(
            id=credentials.key_id, name=f"agent {agent.name}"[:200],
            grants=principal.delegated_grants(agent.namespace, self.settings.amp_namespace),
            agent_id=agent.id, created_at=agent.created_at, created_by=principal.subject))
        await self.audit.record(agent.namespace, "agent-register", actor_fields(principal),
                                details={"agent": agent.id, "key": credentials.key_id,
                                         **({"reused": True} if planned.reused else {})})
        return Registration(agent=agent, credentials=credentials, reused=planned.reused)

    async def get(self, principal: Principal, namespace: str, agent_id: str) -> Agent:
        validate_namespace(namespace)
        principal.require("read", namespace)
        self.activity.seen(namespace, principal.agent_id, self.clock())
        agent = None
        if isinstance(agent_id, str) and _UUID_RE.fullmatch(agent_id):
            agent = await self.store.get_agent(namespace, agent_id)
        if agent is None:
            raise MempError("not_found", f"no agent {agent_id!r} in namespace {namespace!r}")
        return agent

    async def home(self, agent_id: str) -> str | None:
        """The namespace an agent was registered in (None for ids no registration made)."""
        return await self.store.agent_home(agent_id)

    async def remove(self, principal: Principal, namespace: str, agent_id: str) -> None:
        """Remove an agent (admins of its namespace): its record goes, every API key bound to
        it is revoked, and every process ends the streams those keys opened."""
        validate_namespace(namespace)
        principal.require("admin", namespace)
        if not (isinstance(agent_id, str) and _UUID_RE.fullmatch(agent_id)) or \
                await self.store.get_agent(namespace, agent_id) is None:
            raise MempError("not_found", f"no agent {agent_id!r} in namespace {namespace!r}")
        # Announced and audited even when replicas did not confirm it (then a 503 says so).
        await settle(self.store.delete_agent(namespace, agent_id, self.clock()),
                     lambda: self.audit.record(namespace, "agent-remove",
                                               actor_fields(principal),
                                               details={"agent": agent_id}))

    async def list(self, principal: Principal, namespace: str, cursor: str | None,
                   limit: int | None) -> tuple[list[Agent], str | None]:
        validate_namespace(namespace)
        principal.require("read", namespace)
        limit = check_limit(limit, self.settings.default_query_limit,
                            self.settings.max_query_limit)
        if cursor is not None and not re.fullmatch(r"[0-9]{13}:[0-9a-f-]{36}", cursor):
            raise MempError("invalid_request", "cursor is not one this broker issued")
        return await self.store.list_agents(namespace, cursor, limit)


def _replayed(first: tuple[str, bytes], sent: str, message_id: str | None) -> Registration:
    """The first reply to a message id, if it was for this same request."""
    stored_fingerprint, reply = first
    if stored_fingerprint not in ("", sent):
        raise reused(message_id)
    return msgspec.json.decode(reply, type=Registration)
