"""The MCP tools: `memory_*` over MemoryService and `amp_*` over the AMP bridge's CellService,
each called with the caller's own principal, so every grant and AMP policy check applies. Each
tool's input schema is generated from its argument Struct, and its description is written for
a model choosing and calling it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import mcp_types as types
import msgspec
from msgspec import Meta, Struct

from broker.amp.acting import acting_agent
from broker.amp.cells import MAX_POLICY_GLOBS, NewCell
from broker.amp.merge import MAX_SOURCES, CellMerger, MergeBody
from broker.amp.recall import Recall
from broker.amp.search import CellSearch, SearchBody
from broker.amp.service import CellService
from broker.core.errors import MempError
from broker.core.nesting import check_value
from broker.core.values import check_finite
from broker.services.agents import AgentService
from broker.services.auth import Principal
from broker.services.memory import MemoryService, PutOptions

T = TypeVar("T")

Namespace = Annotated[str | None, Meta(description=(
    "The namespace to work in. Leave it out to use the namespace your agent was registered "
    "in."))]
Key = Annotated[str, Meta(description=(
    "The entry's key: segments joined by '/', like 'customer/123/profile'."))]
Version = Annotated[int, Meta(ge=1)]
ActingAgent = Annotated[str | None, Meta(description=(
    "Act as this agent. Leave it out to act as the agent your token belongs to; only a "
    "gateway token with the impersonate permission may name another agent."))]


class MemoryPut(Struct, forbid_unknown_fields=True, kw_only=True):
    """Store a JSON value under a key in shared memory, where other agents can read it and
    are told when it changes. Writing a key again replaces its value and raises its version.
    Use if_version to write only if nobody changed the entry since you read that version, or
    if_absent to write only if the key holds nothing yet. Returns the entry as stored, with
    its version."""

    key: Key
    value: Annotated[Any, Meta(description="The value: any JSON (object, array, string, "
                                           "number, boolean or null).")]
    namespace: Namespace = None
    ttl_seconds: Annotated[int | None, Meta(description=(
        "Forget the entry after this many seconds. Leave it out to keep it."))] = None
    if_version: Annotated[Version | None, Meta(description=(
        "Write only while the stored version is this one (compare-and-set)."))] = None
    if_absent: Annotated[bool, Meta(description=(
        "Write only if the key holds no entry yet."))] = False


class MemoryGet(Struct, forbid_unknown_fields=True, kw_only=True):
    """Read the entry stored under a key in shared memory: its value, version, who wrote it
    and when (Unix milliseconds). Fails with not_found when the key holds nothing."""

    key: Key
    namespace: Namespace = None


class MemoryQuery(Struct, forbid_unknown_fields=True, kw_only=True):
    """List the entries whose keys match a pattern, in key order. A pattern is an exact key,
    a prefix ending in '*' ('customer/*' matches every key under 'customer/'), '*' alone for
    everything, or '*' as a whole middle segment for exactly one segment
    ('customer/*/profile'). When next_cursor is not null, call again with it as cursor for
    more."""

    pattern: Annotated[str, Meta(description="The key pattern, like 'customer/*'.")] = "*"
    namespace: Namespace = None
    cursor: Annotated[str | None, Meta(description=(
        "The next_cursor of the previous page, to continue."))] = None
    limit: Annotated[Annotated[int, Meta(ge=1, le=1000)] | None, Meta(description=(
        "At most this many entries per page (default 100)."))] = None


class MemoryDelete(Struct, forbid_unknown_fields=True, kw_only=True):
    """Delete the entry under a key from shared memory. The deletion is itself a version,
    kept in the key's history, and other agents are told of it. Returns that deletion."""

    key: Key
    namespace: Namespace = None
    if_version: Annotated[Version | None, Meta(description=(
        "Delete only while the stored version is this one."))] = None


class MemoryHistory(Struct, forbid_unknown_fields=True, kw_only=True):
    """List the recent versions of a key, newest first, deletions included: who wrote what,
    and when. Use it to see how a fact changed or to recover an earlier value."""

    key: Key
    namespace: Namespace = None
    limit: Annotated[Version | None, Meta(description="At most this many versions.")] = None


_READABLE_BY = ("Agents that may read it besides you and the owner; '*' matches any run of "
                f"characters, as in 'team-*'. At most {MAX_POLICY_GLOBS}.")


class AmpRemember(Struct, forbid_unknown_fields=True, kw_only=True):
    """Remember something as an AMP memory cell: a piece of text with its kind, who it is
    about, how important and how certain it is, and who else may read it. Cells fade as they
    go unused (importance x confidence decays) and are archived when forgotten; recall
    finds them by words and owner. Returns the new cell with its id."""

    text: Annotated[str, Meta(max_length=64 * 1024, description="What to remember.")]
    type: Annotated[Literal["semantic", "episodic", "procedural"], Meta(description=(
        "semantic: a fact or preference; episodic: something that happened; procedural: "
        "how to do something."))] = "semantic"
    owner_id: Annotated[str | None, Meta(description=(
        "Who the memory is about or belongs to. Leave it out for yourself."))] = None
    owner_type: Annotated[Literal["user", "agent", "organization"] | None, Meta(description=(
        "What kind of owner owner_id names: user unless given (you yourself, without "
        "owner_id, are an agent)."))] = None
    metadata: Annotated[dict[str, Any], Meta(description=(
        "Labels to find it by later (recall matches them exactly)."))] = {}
    importance: Annotated[float, Meta(ge=0.0, le=1.0, description=(
        "How much it matters, 0 to 1."))] = 0.5
    confidence: Annotated[float, Meta(ge=0.0, le=1.0, description=(
        "How sure you are, 0 to 1."))] = 1.0
    readable_by: Annotated[list[str], Meta(description=_READABLE_BY)] = []
    public: Annotated[bool, Meta(description="Let every agent read it.")] = False
    expires_at: Annotated[str | None, Meta(description=(
        "When to forget it, as an ISO 8601 time."))] = None
    agent: ActingAgent = None


class AmpRecall(Struct, forbid_unknown_fields=True, kw_only=True):
    """Search the AMP memory cells you may read: by meaning and words, by owner, by kind or by
    metadata, best matches first (relevance x how fresh and important the memory is). Stale memories
    are left out unless include_stale is true. When next_cursor is not null, call again with
    it as cursor for more."""

    query: Annotated[Annotated[str, Meta(max_length=1000)] | None, Meta(description=(
        "What to recall, in your own words."))] = None
    mode: Annotated[Literal["hybrid", "semantic", "keyword"] | None, Meta(description=(
        "hybrid (meaning and words, the default), semantic (meaning only) or keyword "
        "(shared words only)."))] = None
    min_score: Annotated[Annotated[float, Meta(ge=0, le=1)] | None, Meta(description=(
        "Leave out matches less relevant than this (0 to 1), so that a question with no "
        "answer returns nothing."))] = None
    owner_id: Annotated[str | None, Meta(description="Only cells of this owner.")] = None
    owner_type: Annotated[Literal["user", "agent", "organization"] | None, Meta(
        description="The kind of owner owner_id names.")] = None
    types: Annotated[list[Literal["semantic", "episodic", "procedural"]] | None, Meta(
        description="Only cells of these kinds.")] = None
    metadata: Annotated[dict[str, Any], Meta(description=(
        "Only cells whose metadata has these values."))] = {}
    include_stale: Annotated[bool, Meta(description=(
        "Also return memories that have faded (stale)."))] = False
    limit: Annotated[int, Meta(ge=1, le=100, description="At most this many cells.")] = 10
    cursor: Annotated[str | None, Meta(description=(
        "The next_cursor of the previous call, to continue."))] = None
    agent: ActingAgent = None


class AmpMerge(Struct, forbid_unknown_fields=True, kw_only=True):
    """Merge several AMP memory cells that say one thing (a remembered cell's near_duplicates,
    or what amp_recall found) into one new cell with your text. The sources must all have one
    owner, be active or stale, and be cells you may both read and write; they become archived
    (still found by amp_recall with status archived), and the new cell's provenance names
    them. Nothing is written when any source is refused. Returns the new cell."""

    ids: Annotated[list[str], Meta(min_length=2, max_length=MAX_SOURCES, description=(
        "The ids of the cells to merge (2 to 50, each once)."))]
    text: Annotated[str, Meta(min_length=1, max_length=64 * 1024, description=(
        "What the merged cell says, replacing the sources' texts."))]
    type: Annotated[Literal["semantic", "episodic", "procedural"] | None, Meta(description=(
        "The new cell's kind; leave it out for the sources' kind (semantic when they "
        "differ)."))] = None
    metadata: Annotated[dict[str, Any], Meta(description=(
        "Labels of the new cell (recall matches them exactly)."))] = {}
    importance: Annotated[Annotated[float, Meta(ge=0.0, le=1.0)] | None, Meta(description=(
        "How much it matters, 0 to 1 (0.5 unless given)."))] = None
    confidence: Annotated[Annotated[float, Meta(ge=0.0, le=1.0)] | None, Meta(description=(
        "How sure you are, 0 to 1 (1 unless given)."))] = None
    readable_by: Annotated[list[str], Meta(description=_READABLE_BY)] = []
    public: Annotated[bool, Meta(description="Let every agent read it.")] = False
    agent: ActingAgent = None


class AmpForget(Struct, forbid_unknown_fields=True, kw_only=True):
    """Forget an AMP memory cell for good. AMP only lets archived cells be deleted: a cell
    that is still active or stale is refused with write_conflict naming its status (cells are
    archived by the broker after fading unused for 30 days). Deleting is final. Returns the
    cell as deleted."""

    id: Annotated[str, Meta(description="The cell's id (26 characters, from amp_remember "
                                        "or amp_recall).")]
    agent: ActingAgent = None


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool: what the model sees and the Struct its arguments are decoded into."""

    name: str
    title: str
    args: type[Struct]
    read_only: bool

    def definition(self) -> types.Tool:
        (ref,), components = msgspec.json.schema_components([self.args])
        schema = dict(components[ref["$ref"].rsplit("/", 1)[1]])
        description = schema.pop("description")
        schema.pop("title", None)
        return types.Tool(
            name=self.name, title=self.title, description=" ".join(description.split()),
            input_schema=schema,
            annotations=types.ToolAnnotations(
                title=self.title, read_only_hint=self.read_only,
                destructive_hint=self.name in ("memory_delete", "amp_forget"),
                idempotent_hint=self.read_only, open_world_hint=False),
        )


TOOLS = (
    Tool("memory_put", "Write a memory entry", MemoryPut, False),
    Tool("memory_get", "Read a memory entry", MemoryGet, True),
    Tool("memory_query", "Find memory entries by key pattern", MemoryQuery, True),
    Tool("memory_delete", "Delete a memory entry", MemoryDelete, False),
    Tool("memory_history", "A memory entry's versions", MemoryHistory, True),
    Tool("amp_remember", "Remember (create an AMP cell)", AmpRemember, False),
    Tool("amp_recall", "Recall (search AMP cells)", AmpRecall, True),
    Tool("amp_merge", "Merge AMP cells into one", AmpMerge, False),
    Tool("amp_forget", "Forget (delete an archived AMP cell)", AmpForget, False),
)
_BY_NAME = {tool.name: tool for tool in TOOLS}


class Toolbox:
    """Runs the tools for a caller against the broker's services."""

    def __init__(self, memory: MemoryService, cells: CellService, agents: AgentService,
                 recall: Recall, merger: CellMerger) -> None:
        self.memory = memory
        self.cells = cells
        self.recall = recall
        self.merger = merger
        self.agents = agents
        self.definitions = [tool.definition() for tool in TOOLS]
        self.schemas = {d.name: d.input_schema for d in self.definitions}
        self._run: dict[str, Callable[[Principal, Any], Awaitable[Any]]] = {
            "memory_put": self._put, "memory_get": self._get, "memory_query": self._query,
            "memory_delete": self._delete, "memory_history": self._history,
            "amp_remember": self._remember, "amp_recall": self._recall,
            "amp_merge": self._merge, "amp_forget": self._forget,
        }

    async def call(self, principal: Principal, name: str, arguments: dict[str, Any] | None
                   ) -> Any:
        """The tool's result, a JSON object as wire Structs (entries keep their values as
        stored); a refusal raises MempError."""
        tool = _BY_NAME.get(name)
        if tool is None:
            raise MempError("not_found", f"no tool {name!r}", {"tool": name})
        check_value(arguments, self.memory.settings.max_json_depth)
        for field, value in (arguments or {}).items():
            check_finite(value, field)
        args = _decode(tool.args, arguments or {})
        return await self._run[name](principal, args)

    async def namespace(self, principal: Principal, given: str | None) -> str:
        """The namespace a call names, else the caller's agent's home namespace."""
        if given:
            return given
        home = await self.agents.home(principal.agent_id) if principal.agent_id else None
        if home is None:
            raise MempError("invalid_request", "name a namespace: this token does not belong "
                            "to a registered agent, so there is no default one",
                            {"field": "namespace"})
        return home

    async def _put(self, principal: Principal, args: MemoryPut) -> Any:
        namespace = await self.namespace(principal, args.namespace)
        entry, _ = await self.memory.put(
            principal, namespace, args.key, msgspec.Raw(msgspec.json.encode(args.value)),
            PutOptions(ttl_seconds=args.ttl_seconds, if_version=args.if_version,
                       if_absent=args.if_absent))
        return entry

    async def _get(self, principal: Principal, args: MemoryGet) -> Any:
        namespace = await self.namespace(principal, args.namespace)
        return await self.memory.get(principal, namespace, args.key)

    async def _query(self, principal: Principal, args: MemoryQuery) -> Any:
        namespace = await self.namespace(principal, args.namespace)
        page = await self.memory.query(principal, namespace, args.pattern, args.cursor,
                                       args.limit)
        return page

    async def _delete(self, principal: Principal, args: MemoryDelete) -> Any:
        namespace = await self.namespace(principal, args.namespace)
        entry = await self.memory.delete(principal, namespace, args.key,
                                         if_version=args.if_version)
        return entry

    async def _history(self, principal: Principal, args: MemoryHistory) -> Any:
        namespace = await self.namespace(principal, args.namespace)
        versions = await self.memory.history(principal, namespace, args.key, args.limit)
        return {"namespace": namespace, "key": args.key, "versions": versions}

    def _acting(self, principal: Principal, claimed: str | None) -> str:
        return acting_agent(principal, self.cells.namespace, claimed, "agent")

    async def _remember(self, principal: Principal, args: AmpRemember) -> Any:
        agent = self._acting(principal, args.agent)
        body = _decode(NewCell, {
            "type": args.type,
            "content": {"text": args.text, "metadata": args.metadata},
            "identity": {"owner_id": args.owner_id or agent,
                         "owner_type": _owner_type(args.owner_id, args.owner_type)},
            "scoring": {"importance": args.importance, "confidence": args.confidence},
            "access_policy": {"readable_by": args.readable_by, "public": args.public},
            "provenance": {"source_type": "mcp"},
            "expires_at": args.expires_at,
        })
        return await self.cells.create(principal, agent, body)

    async def _recall(self, principal: Principal, args: AmpRecall) -> Any:
        agent = self._acting(principal, args.agent)
        fields = msgspec.structs.asdict(args)
        del fields["agent"]
        body = _decode(SearchBody, {k: v for k, v in fields.items() if v is not None})
        return await CellSearch(self.cells, self.recall).search(principal, agent, body)

    async def _merge(self, principal: Principal, args: AmpMerge) -> Any:
        agent = self._acting(principal, args.agent)
        scoring = {name: value for name in ("importance", "confidence")
                   if (value := getattr(args, name)) is not None}
        body = _decode(MergeBody, {
            "ids": args.ids, "text": args.text, "type": args.type, "metadata": args.metadata,
            "scoring": scoring or None,
            "access_policy": {"readable_by": args.readable_by, "public": args.public}
            if args.readable_by or args.public else None,
        })
        return await self.merger.merge(principal, agent, body)

    async def _forget(self, principal: Principal, args: AmpForget) -> Any:
        agent = self._acting(principal, args.agent)
        return await self.cells.delete(principal, agent, args.id)


def _decode(kind: type[T], arguments: dict[str, Any]) -> T:
    """Arguments into their Struct; a wrong shape is `invalid_request` naming the field."""
    try:
        return msgspec.convert(arguments, kind)
    except msgspec.ValidationError as exc:
        field = str(exc).rsplit("`$.", 1)[1].rstrip("`") if "`$." in str(exc) else None
        raise MempError("invalid_request", f"invalid arguments: {exc}",
                        {"field": field} if field else {}) from None


def _owner_type(owner_id: str | None, owner_type: str | None) -> str:
    """The one default of the SDKs and the MCP tools (docs/amp.md): a named owner is a user
    unless said otherwise; without one, the cell is the acting agent's own."""
    if not owner_id:
        return "agent"
    return owner_type or "user"
