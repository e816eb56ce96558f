"""Redis key layout. Every key of a namespace carries `{namespace}` as its Cluster hash tag,
so one script can touch all of a write's keys atomically on one shard."""

from __future__ import annotations

PREFIX = "memp"


def _ns(namespace: str) -> str:
    return f"{PREFIX}:{{{namespace}}}"


def entry(namespace: str, key: str) -> str:
    """Hash holding the current version of one entry (or its tombstone, to keep versions rising)."""
    return f"{_ns(namespace)}:e:{key}"


def entry_prefix(namespace: str) -> str:
    """What `entry()` puts before the user's key; used to map scanned keys back."""
    return f"{_ns(namespace)}:e:"


def history(namespace: str, key: str) -> str:
    """List of the key's recent versions, newest first, capped at the history limit."""
    return f"{_ns(namespace)}:h:{key}"


def index(namespace: str) -> str:
    """Sorted set of live keys, all scored 0, so ZRANGEBYLEX serves prefix queries in key order."""
    return f"{_ns(namespace)}:index"


def expiries(namespace: str) -> str:
    """Sorted set of keys with a TTL, scored by expiry (ms), for the sweeper."""
    return f"{_ns(namespace)}:ttl"


def changelog(namespace: str) -> str:
    """Capped stream of every change in the namespace; subscriptions read and resume from it."""
    return f"{_ns(namespace)}:log"


def idempotency(namespace: str, agent_id: str, message_id: str) -> str:
    """First reply to a message id, kept for the retry window."""
    return f"{_ns(namespace)}:msg:{agent_id}:{message_id}"


def agent_names(namespace: str) -> str:
    """Hash from `<registering credential>\n<agent name>` to the agent that registration made,
    so registering a name again with the same credential finds it."""
    return f"{_ns(namespace)}:agent-names"


def agent(namespace: str, agent_id: str) -> str:
    """Hash holding one registered agent."""
    return f"{_ns(namespace)}:agent:{agent_id}"


def agents(namespace: str) -> str:
    """Sorted set of `created_at:id` members (all scored 0): agents in registration order."""
    return f"{_ns(namespace)}:agents"


def agent_homes() -> str:
    """Hash from agent id to the namespace it was registered in, to check key bindings."""
    return f"{PREFIX}:agent-homes"


def removed_agents() -> str:
    """Hash from a removed agent's id to its removal time (ms): JWTs naming it are refused."""
    return f"{PREFIX}:removed-agents"


def namespaces() -> str:
    """Set of namespaces that hold data; the sweeper walks it. Not namespace-tagged on purpose."""
    return f"{PREFIX}:namespaces"


def api_key(digest: str) -> str:
    """An API key's record, found by the SHA-256 of the key; the key itself is never stored.
    Every API key key shares the `{api-keys}` hash tag, so a key and its id are written
    together in one transaction, on one Cluster shard."""
    return f"{PREFIX}:{{api-keys}}:key:{digest}"


def api_key_ids() -> str:
    """Hash from API key id to its digest, for listing and revoking keys."""
    return f"{PREFIX}:{{api-keys}}:ids"


def legacy_api_key_prefix() -> str:
    """Where releases before Cluster support kept API key records (moved at start)."""
    return f"{PREFIX}:apikey:"


def legacy_api_key_ids() -> str:
    """Where releases before Cluster support kept the id-to-digest hash (moved at start)."""
    return f"{PREFIX}:apikeys"


def meta(namespace: str) -> str:
    """Hash of namespace-wide bookkeeping, such as how far the change log has been trimmed."""
    return f"{_ns(namespace)}:meta"


def usage(namespace: str) -> str:
    """Hash of the namespace's quota bookkeeping: `bytes` (the size of the values its index
    holds), `pbytes` (the size of the proposals it keeps: the sum of their `size` fields) and
    `counted` (set once both are exact; a recount sets it, an erasure drops it)."""
    return f"{_ns(namespace)}:usage"


def rate(namespace: str, kind: str, terms: str, who: str) -> str:
    """A rate bucket (GCRA: the theoretical arrival time, ms) of `kind` (`w` writes, `r`
    reads) under `terms` (its rate and burst: a changed limit starts a fresh bucket), for the
    whole namespace (`who` empty) or one agent in it."""
    return f"{_ns(namespace)}:rate:{kind}:{terms}:{who}"


def streams(namespace: str) -> str:
    """Sorted set of the namespace's open streams, scored by when their lease runs out."""
    return f"{_ns(namespace)}:streams"


def token_streams(token: str) -> str:
    """Sorted set of one credential's open streams, by lease end, in a slot of its own."""
    return f"{PREFIX}:{{token:{token}}}:streams"


def audit(namespace: str) -> str:
    """Stream of the namespace's audit records, hash-chained; never trimmed by the change-log
    limits (docs/governance.md)."""
    return f"{_ns(namespace)}:audit"


def proposal(namespace: str, proposal_id: str) -> str:
    """Hash of one proposed write (pending, approved, rejected or expired)."""
    return f"{proposal_prefix(namespace)}{proposal_id}"


def proposal_prefix(namespace: str) -> str:
    """What `proposal()` puts before the id: scripts that walk proposals make their keys."""
    return f"{_ns(namespace)}:prop:"


def proposals(namespace: str) -> str:
    """Sorted set of every proposal id by creation time (ms), for listing."""
    return f"{_ns(namespace)}:props"


def pending_proposals(namespace: str) -> str:
    """Sorted set of pending proposal ids by when they expire (ms), for the sweeper."""
    return f"{_ns(namespace)}:props:due"


def closed_proposals(namespace: str) -> str:
    """Sorted set of closed (approved, rejected, expired) proposal ids by when they closed
    (ms): the sweeper drops them once past the retention."""
    return f"{_ns(namespace)}:props:closed"


def config(namespace: str) -> str:
    """The namespace's configuration (conflict strategies, priorities, shares...), as JSON."""
    return f"{_ns(namespace)}:config"


def schemas(namespace: str) -> str:
    """Hash of the namespace's JSON Schemas by id."""
    return f"{_ns(namespace)}:schemas"


def bulletins() -> str:
    """Capped stream of what processes announce to each other: a namespace whose
    configuration or schemas changed, revoked credentials. A stream (not pub/sub) so that a
    listener that reconnects reads what it missed, and so it works the same on a Cluster."""
    return f"{PREFIX}:bulletins"


# ---- AMP bridge: indexes beside the cells' MEMP entries, in the AMP namespace's hash slot ----


def amp_cell(namespace: str, cell_id: str) -> str:
    """Hash of one cell's index record: its MEMP key, status, scores and lifecycle times."""
    return f"{_ns(namespace)}:amp:cell:{cell_id}"


def amp_due(namespace: str, transition: str) -> str:
    """Sorted set of cell ids scored by when `transition` (stale, archive, expire, purge) is due."""
    return f"{_ns(namespace)}:amp:due:{transition}"


def amp_recover(namespace: str) -> str:
    """Set of stale cells read or patched since they went stale: the engine rechecks them."""
    return f"{_ns(namespace)}:amp:recover"


def amp_created(namespace: str) -> str:
    """Sorted set of every cell id by creation time, for unfiltered and time-range search."""
    return f"{_ns(namespace)}:amp:created"


def amp_term(namespace: str, term: str) -> str:
    """Set of cell ids whose text contains the term (the search's inverted index)."""
    return f"{_ns(namespace)}:amp:term:{term}"


def amp_unposted(namespace: str) -> str:
    """Set of cells whose search terms changed and are not yet in the term sets."""
    return f"{_ns(namespace)}:amp:unposted"


def amp_vector(namespace: str, cell_id: str) -> str:
    """Hash of one cell's embedding: its model, dimensions, text digest and unit vector
    (float32 bytes), beside the cell so every process recalls the same."""
    return f"{_ns(namespace)}:amp:vec:{cell_id}"


def amp_vector_log(namespace: str) -> str:
    """Capped stream of the cells whose vector was stored or removed (each record: `id`), which
    every process follows to keep its in-memory vector index in step (broker/amp/nearest.py)."""
    return f"{_ns(namespace)}:amp:veclog"


def amp_unembedded(namespace: str) -> str:
    """Set of cells whose text changed (or that went away) and whose vector is not yet in line."""
    return f"{_ns(namespace)}:amp:unembedded"


def sent_reply(namespace: str, token: str) -> str:
    """The first reply of one script call the broker may send twice (storage/resend.py), kept
    for a minute so that a second sending gets it instead of running again."""
    return f"{_ns(namespace)}:sent:{token}"
