"""Who may do what: registered agents, API keys (stored by their SHA-256 only), the replies
kept for operations retried under one message id, and the announcement of revocations."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import msgspec

from broker.core.models import Agent, ApiKeyRecord
from broker.storage import layout, scripts
from broker.storage.client import Backend, ScriptCall, text
from broker.storage.entries import EntryStore
from broker.storage.records import CorruptRecord, RawHash, skipped
from broker.storage.scripts import Fields
from broker.storage.writes import RecordWriter

AGENT_KEYS = Fields("agent_keys", ("agent", "index"))
AGENT = Fields("agent", ("id", "name", "framework", "namespace", "created_at"))
SEEN = Fields("seen", ("when",))
CLAIM_KEYS = Fields("claim_keys", ("names",))
CLAIM = Fields("claim", ("field", "id", "stale"))
UPGRADE_KEYS = Fields("upgrade_keys", ("old_ids", "new_ids"))
UPGRADE = Fields("upgrade", ("old_prefix", "new_prefix"))
_key_record = msgspec.json.Decoder(ApiKeyRecord)
T = TypeVar("T")


class AccountStore:
    """Agents, API keys and idempotency replies. Registrations, removals and API key
    changes wait for replicas (`MEMP_WRITE_REPLICAS`); revocations are announced even when
    replicas did not confirm them in time."""

    def __init__(self, backend: Backend, entries: EntryStore, idempotency_window_ms: int,
                 writer: RecordWriter) -> None:
        self.backend = backend
        self.writer = writer
        self.redis = client = backend.redis
        self.entries = entries
        self.idempotency_window_ms = max(idempotency_window_ms, 1)
        self._save_agent = scripts.register(client, ["agent_save.lua"], [AGENT_KEYS, AGENT])
        self._seen = scripts.register(client, ["agent_seen.lua"], [SEEN])
        self._claim = scripts.register(client, ["agent_claim.lua"], [CLAIM_KEYS, CLAIM])
        self._upgrade = scripts.register(client, ["api_keys_upgrade.lua"],
                                         [UPGRADE_KEYS, UPGRADE])

    async def upgrade(self) -> int:
        """Move API keys a release before Cluster support stored to today's layout; returns how
        many it moved (0 once done, and always on a Cluster, which never had the old one)."""
        if self.backend.cluster or not await self.redis.exists(layout.legacy_api_key_ids()):
            return 0
        return int(await self.backend.call(
            self._upgrade,
            UPGRADE_KEYS.pack(old_ids=layout.legacy_api_key_ids(), new_ids=layout.api_key_ids()),
            UPGRADE.pack(old_prefix=layout.legacy_api_key_prefix(),
                         new_prefix=layout.api_key(""))))

    # ---- replies kept under a message id (operations that are not one script) ----

    async def reserve_reply(self, namespace: str, agent_id: str, message_id: str,
                            fingerprint: str, reply: bytes) -> tuple[str, bytes, bool]:
        """Keep `reply` under a message id before the operation it answers runs, marked
        pending, unless a reply is kept already; returns the kept one: its request's
        fingerprint, the reply, and whether its operation completed (see finish_reply)."""
        key = layout.idempotency(namespace, agent_id, message_id)
        pending = b"?" + fingerprint.encode() + b"\n" + reply
        for _ in range(2):  # the kept reply may expire between the SET and the GET
            stored = await self.writer.write(("SET", key, pending, "PX",
                                              self.idempotency_window_ms, "NX"))
            if stored and stored[0] is not None:
                return fingerprint, reply, False
            kept = cast(bytes | None, await self.redis.get(key))
            if kept is not None:
                done = not kept.startswith(b"?")
                fingerprint_kept, _, first = kept.removeprefix(b"?").partition(b"\n")
                return fingerprint_kept.decode(), first, done
        raise RuntimeError("the reply kept under a message id kept expiring")

    async def finish_reply(self, namespace: str, agent_id: str, message_id: str,
                           fingerprint: str, reply: bytes) -> None:
        """Mark the reply under a message id complete (its operation ran to the end)."""
        await self.writer.write(("SET", layout.idempotency(namespace, agent_id, message_id),
                                 fingerprint.encode() + b"\n" + reply,
                                 "PX", self.idempotency_window_ms))

    # ---- agents ----

    async def save_agent(self, agent: Agent) -> Agent:
        """Store a new agent, or find it stored (a registration run again); returns it as
        stored (see agent_save.lua: its `created_at` may be a few ms later, so that
        registration order is total)."""
        await self.entries.note_namespace(agent.namespace)
        created, _ = await self.writer.run([
            (self._save_agent,
             AGENT_KEYS.pack(agent=layout.agent(agent.namespace, agent.id),
                             index=layout.agents(agent.namespace)),
             AGENT.pack(id=agent.id, name=agent.name, framework=agent.framework,
                        namespace=agent.namespace, created_at=agent.created_at)),
            self.writer.call(("HSET", layout.agent_homes(), agent.id, agent.namespace))])
        return msgspec.structs.replace(agent, created_at=int(created), last_seen=int(created))

    async def claimed_agent(self, namespace: str, registrar: str, name: str) -> str | None:
        """The agent this credential registered under this name, if any (perhaps removed)."""
        found = await self.redis.hget(layout.agent_names(namespace), f"{registrar}\n{name}")
        return text(found) if found is not None else None

    async def claim_agent_name(self, namespace: str, registrar: str, name: str, agent_id: str,
                               stale: str = "") -> str:
        """Claim the name for `agent_id` unless another agent holds it (a claim by `stale`, a
        removed agent, is replaced); returns the agent that holds it. Two processes claiming at
        once get the same answer. Not waited for by itself: the agent's record, written next,
        waits for the replicas."""
        claimed, = await self.backend.run([
            (self._claim, CLAIM_KEYS.pack(names=layout.agent_names(namespace)),
             CLAIM.pack(field=f"{registrar}\n{name}", id=agent_id, stale=stale))])
        return text(claimed)

    async def get_agent(self, namespace: str, agent_id: str) -> Agent | None:
        raw = await self.redis.hgetall(layout.agent(namespace, agent_id))
        return _agent(cast(RawHash, raw)) if raw else None

    async def delete_agent(self, namespace: str, agent_id: str, now: int) -> list[str]:
        """Remove a registered agent and revoke every API key bound to it, then announce the
        revocation; returns the ids of the keys revoked. The removal is recorded too (first, on
        one server): JWTs naming the agent are refused from then on."""
        created = await self.redis.hget(layout.agent(namespace, agent_id), "created_at")
        bound = [r for r in await self.list_api_keys() if r.agent_id == agent_id]
        digests = await self.redis.hmget(layout.api_key_ids(), [r.id for r in bound]) \
            if bound else []
        record: list[tuple[Any, ...]] = [("DEL", layout.agent(namespace, agent_id))]
        if created is not None:
            record.append(("ZREM", layout.agents(namespace), f"{int(created):013d}:{agent_id}"))
        await self.writer.run([
            self.writer.call(("HSET", layout.removed_agents(), agent_id, now)),
            self.writer.call(*record),
            self.writer.call(("HDEL", layout.agent_homes(), agent_id)),
            *(self._key_deletion(r.id, text(d)) for r, d in zip(bound, digests, strict=True)
              if d is not None)], announce=("revoked", f"agent:{agent_id}"))
        return [r.id for r in bound]

    async def removed_agents(self, agent_ids: set[str]) -> set[str]:
        """Those of these agent ids that were registered and then removed."""
        ids = sorted(agent_ids)
        if not ids:
            return set()
        removed = await self.redis.hmget(layout.removed_agents(), ids)
        return {agent_id for agent_id, when in zip(ids, removed, strict=True) if when}

    async def agent_home(self, agent_id: str) -> str | None:
        """The namespace an agent was registered in, or None for no registered agent. Agents
        registered before homes were recorded are found by their namespace's agent hash."""
        home = await self.redis.hget(layout.agent_homes(), agent_id)
        if home is not None:
            return text(home)
        namespaces = await self.entries.namespaces()
        async with self.redis.pipeline(transaction=False) as pipe:
            for namespace in namespaces:
                pipe.exists(layout.agent(namespace, agent_id))
            found = await pipe.execute()
        for namespace, exists in zip(namespaces, found, strict=True):
            if exists:
                await self.redis.hset(layout.agent_homes(), agent_id, namespace)
                return namespace
        return None

    async def list_agents(self, namespace: str, after: str | None, limit: int
                          ) -> tuple[list[Agent], str | None]:
        """Agents in registration order; the cursor is the last member of the agents index."""
        start = b"(" + after.encode() if after else b"-"
        found = await self.redis.zrangebylex(layout.agents(namespace), start, b"+", 0, limit)
        members = [text(m) for m in found]
        async with self.redis.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.hgetall(layout.agent(namespace, member.split(":", 1)[1]))
            rows = await pipe.execute()
        agents = _readable(_agent, [row for row in rows if row])
        return agents, members[-1] if len(members) == limit else None

    async def touch_agents(self, seen: Mapping[tuple[str, str], int]) -> None:
        """Raise `last_seen` of the given agents (never lowers it): one script call per
        namespace (its keys share a hash slot), all in one round trip."""
        if not seen:
            return
        by_namespace: dict[str, tuple[list[str], list[object]]] = {}
        for (namespace, agent_id), when in seen.items():
            keys, args = by_namespace.setdefault(namespace, ([], []))
            keys.append(layout.agent(namespace, agent_id))
            args += SEEN.pack(when=when)
        await self.backend.run([(self._seen, list(keys), list(args))
                                for keys, args in by_namespace.values()])

    # ---- API keys ----

    async def save_api_key(self, digest: str, record: ApiKeyRecord) -> None:
        await self.writer.write(("SET", layout.api_key(digest), msgspec.json.encode(record)),
                                ("HSET", layout.api_key_ids(), record.id, digest))

    async def load_api_key(self, digest: str) -> ApiKeyRecord | None:
        raw = await self.redis.get(layout.api_key(digest))
        return _key(cast(bytes, raw), digest) if raw else None

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        digests = await self.redis.hvals(layout.api_key_ids())
        if not digests:
            return []
        rows = await self.redis.mget([layout.api_key(text(d)) for d in digests])
        records = _readable(lambda pair: _key(*pair), [
            (cast(bytes, r), text(d)) for d, r in zip(digests, rows, strict=True) if r])
        return sorted(records, key=lambda r: (r.created_at, r.id))

    async def live_api_keys(self, key_ids: set[str]) -> set[str]:
        """Those of these key ids that still exist."""
        ids = sorted(key_ids)
        digests = await self.redis.hmget(layout.api_key_ids(), ids)
        return {key_id for key_id, digest in zip(ids, digests, strict=True) if digest}

    async def delete_api_key(self, key_id: str) -> bool:
        """Revoke a key and tell every broker process (False: no such key)."""
        digest = await self.redis.hget(layout.api_key_ids(), key_id)
        if digest is None:
            return False
        await self.writer.run([self._key_deletion(key_id, text(digest))],
                              announce=("revoked", f"key:{key_id}"))
        return True

    def _key_deletion(self, key_id: str, digest: str) -> ScriptCall:
        return self.writer.call(("DEL", layout.api_key(digest)),
                                ("HDEL", layout.api_key_ids(), key_id))


def _readable(decode: Callable[[Any], T], rows: list[Any]) -> list[T]:
    """The records of a listing that can be read; the others are left out and logged."""
    records = []
    for row in rows:
        try:
            records.append(decode(row))
        except CorruptRecord as exc:
            skipped(exc)
    return records


def _key(raw: bytes, digest: str) -> ApiKeyRecord:
    try:
        return _key_record.decode(raw)
    except msgspec.DecodeError as exc:
        raise CorruptRecord(f"stored API key record {digest[:12]}...: {exc}") from None


def _agent(raw: RawHash) -> Agent:
    fields: dict[str, str] = {}
    try:
        fields = {text(k): text(v) for k, v in raw.items()}
        return Agent(
            id=fields["id"], name=fields["name"], framework=fields["framework"],
            namespace=fields["namespace"], created_at=int(fields["created_at"]),
            last_seen=int(fields["last_seen"]),
        )
    except (KeyError, ValueError) as exc:  # ValueError: a number or UTF-8 that is not
        raise CorruptRecord(f"stored agent {fields.get('id', '?')}: bad field {exc}",
                            f"agent {fields.get('id', '?')}") from None
