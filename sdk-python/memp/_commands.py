"""The `memp` commands themselves: each calls the broker and prints what it answered, as JSON
lines or (`--table`) a table. The command line that chooses one is memp.cli."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec

from memp.client import MEMP
from memp.errors import ApprovalPending, MempError
from memp.models import Agent, AuditRecord, Entry, Event, Grant, NamespaceConfig, to_builtins
from memp.subscription import ConnectionState


class _Page(Protocol):
    @property
    def next_cursor(self) -> str | None: ...


T = TypeVar("T")
P = TypeVar("P", bound=_Page)


class UsageError(Exception):
    """Input the command line cannot use (not a broker error)."""


def _out(document: Any) -> None:
    sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _clock(ms: int | None) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%H:%M:%S.%f")[:-3] if ms else "-"


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def _listing(items: Iterable[T], table: bool, header: str, row: Callable[[T], str]) -> None:
    """Items as a table (`header`, then a `row` each) or as one JSON document a line; items
    fetched page by page are printed as they come."""
    if table:
        _line(header)
        for item in items:
            _line(row(item))
    else:
        for item in items:
            _out(to_builtins(item))


class AgentNames:
    """Agent ids as people read them: the agent's name when it is registered in the namespace
    (looked up once, on first use), else the id as it is. Never cut, so it can be copied."""

    def __init__(self, broker: MEMP) -> None:
        self.broker = broker
        self.names: dict[str, str] | None = None

    def of(self, agent_id: str) -> str:
        if self.names is None:
            try:
                self.names = {a.id: a.name for a in _agents(self.broker)}
            except MempError:  # no read on the namespace: ids it is
                self.names = {}
        return self.names.get(agent_id, agent_id)


def _who(names: AgentNames, agent_id: str, wide: bool) -> str:
    """A table's agent cell: the name, then (with --wide) the full id."""
    name = names.of(agent_id)
    return f"{name:<24}  {agent_id:<36}" if wide else f"{name:<24}"


def _pages(fetch: Callable[[str | None], P], items: Callable[[P], Iterable[T]]) -> Iterator[T]:
    """Every item of a listing, page after page: `fetch(cursor)` gets a page (with
    `next_cursor`), `items(page)` what it holds."""
    cursor = None
    while True:
        page = fetch(cursor)
        yield from items(page)
        cursor = page.next_cursor
        if not cursor:
            return


_ENTRY_HEADER = f"{'KEY':<32} {'VERSION':>7}  {'UPDATED':<12}  VALUE"


def _entry_row(entry: Entry) -> str:
    return (f"{entry.key:<32} {entry.version:>7}  {_clock(entry.updated_at):<12}  "
            f"{'(deleted)' if entry.deleted else _short(entry.value)}")


def event_document(event: Event) -> dict[str, Any]:
    """An event as one flat JSON object, as on the wire: `type` and the entry's fields (`id` is
    the entry's), plus `event_id`, the cursor to resume from with `--last-event-id`."""
    document: dict[str, Any] = {"type": event.type, "event_id": event.id}
    if event.entry is not None:
        document.update(to_builtins(event.entry))
    else:
        document.update({k: v for k, v in (("namespace", event.namespace),
                                           ("reason", event.reason)) if v is not None})
    return document


def event_row(event: Event) -> str:
    entry = event.entry
    if entry is None:
        detail = f"{event.namespace}: {event.reason}" if event.type == "reset" else ""
        return f"{_clock(None):<12}  {event.type:<12}  {detail}".rstrip()
    value = "" if event.type in ("delete", "expire") else _short(entry.value)
    return (f"{_clock(entry.updated_at):<12}  {event.type:<12}  {entry.key}  "
            f"v{entry.version}  {value}").rstrip()


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"VALUE must be JSON ({exc}); quote strings: '\"text\"'") from None


def _pending(pending: ApprovalPending) -> None:
    """A gated write: print its proposal; it is not an error."""
    _out(to_builtins(pending.proposal))
    print(f"memp: not written yet: awaits approval as proposal {pending.proposal.id}",
          file=sys.stderr)


def cmd_put(broker: MEMP, args: argparse.Namespace) -> None:
    text = sys.stdin.read() if args.value in (None, "-") else args.value
    try:
        entry = broker.memory.put(args.key, _json_value(text), args.ttl,
                                  if_version=args.if_version, if_absent=args.if_absent,
                                  timestamp=args.timestamp,
                                  approval_required=args.approval_required)
    except ApprovalPending as pending:
        _pending(pending)
        return
    _out(to_builtins(entry))


def cmd_get(broker: MEMP, args: argparse.Namespace) -> None:
    entry = broker.memory.get_entry(args.key)
    _out(to_builtins(entry) if args.entry else entry.value)


def cmd_query(broker: MEMP, args: argparse.Namespace) -> None:
    _listing(broker.memory.query(args.pattern, page_size=args.page_size), args.table,
             _ENTRY_HEADER, _entry_row)


def cmd_delete(broker: MEMP, args: argparse.Namespace) -> None:
    try:
        _out(to_builtins(broker.memory.delete(args.key, if_version=args.if_version,
                                              approval_required=args.approval_required)))
    except ApprovalPending as pending:
        _pending(pending)


def cmd_proposals(broker: MEMP, args: argparse.Namespace) -> None:
    proposals = _pages(lambda cursor: broker.proposals.list(status=args.status, key=args.key,
                                                            cursor=cursor),
                       lambda page: page.proposals)
    names, wide = AgentNames(broker), args.wide
    by = f"{'BY':<24}  {'AGENT ID':<36}" if wide else f"{'BY':<24}"
    _listing(proposals, args.table or wide, f"{'ID':<33}  {'STATUS':<8}  {'OP':<6}  {by}  KEY",
             lambda proposal: f"{proposal.id:<33}  {proposal.status:<8}  "
                              f"{proposal.operation:<6}  "
                              f"{_who(names, proposal.proposed_by, wide)}  {proposal.key}")


def cmd_proposal(broker: MEMP, args: argparse.Namespace) -> None:
    _out(to_builtins(broker.proposals.get(args.proposal_id)))


def cmd_approve(broker: MEMP, args: argparse.Namespace) -> None:
    _out(to_builtins(broker.proposals.approve(args.proposal_id,
                                              base_version=args.base_version)))


def cmd_reject(broker: MEMP, args: argparse.Namespace) -> None:
    _out(to_builtins(broker.proposals.reject(args.proposal_id, args.reason)))


_SPANS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def time_bound(text: str | None) -> int | str | None:
    """`1h`, `30m`, `7d`, `45s` ago as Unix ms; anything else (ms, ISO 8601) as given."""
    if text is None:
        return None
    if len(text) > 1 and text[-1] in _SPANS and text[:-1].isdigit():
        return int(datetime.now().timestamp() * 1000) - int(text[:-1]) * _SPANS[text[-1]]
    return text


def cmd_audit(broker: MEMP, args: argparse.Namespace) -> None:
    if args.what == "verify":
        verdict = broker.audit.verify()
        _out(to_builtins(verdict))
        if not verdict.ok:
            raise MempError("the audit log's hash chain is broken", code="audit_broken")
        return
    selection = {"since": time_bound(args.since), "until": time_bound(args.until),
                 "actor": args.actor, "key": args.key, "action": args.action,
                 "after": args.after}
    records = broker.audit.export(**selection) if args.what == "export" or args.limit is None \
        else broker.audit.list(limit=args.limit, **selection).records
    names, wide = AgentNames(broker), args.wide
    actor = f"{'ACTOR':<24}  {'ACTOR ID':<36}" if wide else f"{'ACTOR':<24}"
    _listing(records, args.table or wide,
             f"{'TIME':<12}  {'ACTION':<14}  {actor}  {'VERSIONS':<9}  KEY",
             lambda record: _audit_row(record, names, wide))


def _audit_row(record: AuditRecord, names: AgentNames, wide: bool) -> str:
    versions = f"{record.version_before or '-'}>{record.version_after or '-'}"
    return (f"{_clock(record.at):<12}  {record.action:<14}  {_who(names, record.actor, wide)}  "
            f"{versions:<9}  {record.key or ''}")


def cmd_history(broker: MEMP, args: argparse.Namespace) -> None:
    _listing(broker.memory.history(args.key, args.limit), args.table, _ENTRY_HEADER,
             _entry_row)


def _say_state(url: str) -> Callable[[ConnectionState], None]:
    """Prints a stream's trouble to stderr (each failed attempt, then its recovery), so a
    broker out of reach is seen; a stream that simply works prints nothing."""
    troubled = False

    def say(state: ConnectionState) -> None:
        nonlocal troubled
        if state.status == "reconnecting":
            troubled = True
            text = f"cannot reach {url} (attempt {state.attempt}): {_describe(state.error)}; " \
                "retrying"
        elif state.status == "connected" and troubled:
            troubled = False
            text = "connected again"
        elif state.status == "closed" and state.error is not None:
            text = f"stream closed: {_describe(state.error)}"
        else:
            return
        print(f"memp: {text}", file=sys.stderr, flush=True)

    return say


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "the stream ended"
    if isinstance(error, MempError):
        return error.message
    return str(error) or type(error).__name__


def cmd_watch(broker: MEMP, args: argparse.Namespace) -> None:
    patterns = args.patterns or ["*"]
    with broker.subscribe(patterns, snapshot=args.snapshot, last_event_id=args.last_event_id,
                          on_state=_say_state(broker.config.base_url),
                          filter=args.filter) as events:
        print(f"memp: watching {broker.namespace}: {' '.join(patterns)} (Ctrl-C to stop)",
              file=sys.stderr, flush=True)
        for event in events:
            if args.table:
                _line(event_row(event))
            else:
                _out(event_document(event))


def _json_input(text: str | None, what: str) -> Any:
    """JSON from the argument, from stdin when it is omitted or '-', or from @FILE."""
    if text in (None, "-"):
        source = sys.stdin.read()
    elif text.startswith("@"):
        try:
            source = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{what}: cannot read {text[1:]}: {exc.strerror}") from None
    else:
        source = text
    try:
        return json.loads(source)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} must be JSON ({exc})") from None


def cmd_config_get(broker: MEMP, args: argparse.Namespace) -> None:
    _out(to_builtins(broker.namespaces.config()))


def cmd_config_set(broker: MEMP, args: argparse.Namespace) -> None:
    document = _json_input(args.config, "CONFIG")
    try:  # extra fields (`revision`, ... from `config get`) are ignored
        config = msgspec.convert(document, NamespaceConfig)
    except msgspec.ValidationError as exc:
        raise UsageError(f"CONFIG: {exc}") from None
    _out(to_builtins(broker.namespaces.set_config(config, if_revision=args.if_revision)))


def cmd_schema_put(broker: MEMP, args: argparse.Namespace) -> None:
    schema = _json_input(args.schema, "SCHEMA")
    if not isinstance(schema, dict | bool):
        raise UsageError("SCHEMA must be a JSON object (or true / false)")
    _out(to_builtins(broker.schemas.put(args.schema_id, args.pattern, schema,
                                        enforce=args.enforce)))


def cmd_schema_get(broker: MEMP, args: argparse.Namespace) -> None:
    record = broker.schemas.get(args.schema_id)
    _out(to_builtins(record if args.record else record.schema))


def cmd_schema_list(broker: MEMP, args: argparse.Namespace) -> None:
    _listing(broker.schemas.list(), args.table,
             f"{'ID':<24}  {'PATTERN':<32}  {'ENFORCE':<7}  DRAFT",
             lambda record: f"{record.id:<24}  {record.pattern:<32}  "
                            f"{'yes' if record.enforce else 'no':<7}  {record.draft}")


def cmd_schema_delete(broker: MEMP, args: argparse.Namespace) -> None:
    broker.schemas.delete(args.schema_id)
    print(f"deleted schema {args.schema_id}", file=sys.stderr)


def _agents(broker: MEMP) -> Iterator[Agent]:
    return _pages(lambda cursor: broker.agents.list(cursor=cursor), lambda page: page.agents)


def cmd_register(broker: MEMP, args: argparse.Namespace) -> None:
    """A name this token registered before is that agent again, with a new key (the broker
    sees to it); `--new` makes another; `--reuse` takes any agent of the name, whoever
    registered it, with a new key of the grants its first key had."""
    existing = next((a for a in _agents(broker) if a.name == args.name), None) \
        if args.reuse and not args.new else None
    if existing is None:
        agent = broker.register(name=args.name, framework=args.framework, new=args.new)
        credentials = to_builtins(broker.credentials)
        reused = broker.reused
    else:
        # The agent's first key was shown once, at registration: this one is new, bound to it.
        created = broker.keys.create(_first_grants(broker, existing),
                                     f"{existing.name} (reused)", existing.id)
        agent, reused = existing, True
        credentials = {"api_key": created.api_key, "key_id": created.key.id,
                       "agent_id": existing.id}
    if reused:
        print(f"# reusing agent {agent.name} ({agent.id}) with a new API key", file=sys.stderr)
    _out({"agent": to_builtins(agent), "credentials": credentials})
    print(f"# the agent's API key is shown only now: export MEMP_API_KEY="
          f"{credentials['api_key']}", file=sys.stderr)


def _first_grants(broker: MEMP, agent: Agent) -> list[Grant]:
    """The grants of the agent's first API key still live (read, write and subscribe on its
    namespace when none is)."""
    keys = sorted((k for k in broker.keys.list() if k.agent_id == agent.id),
                  key=lambda k: k.created_at)
    return list(keys[0].grants) if keys else [Grant(agent.namespace,
                                                    ["read", "write", "subscribe"])]


def cmd_agents_list(broker: MEMP, args: argparse.Namespace) -> None:
    _listing(list(_agents(broker)), args.table,
             f"{'ID':<36}  {'NAME':<24}  {'FRAMEWORK':<12}  LAST SEEN",
             lambda agent: f"{agent.id:<36}  {agent.name:<24}  "
                           f"{agent.framework[:12]:<12}  {_clock(agent.last_seen)}")


def cmd_agents_get(broker: MEMP, args: argparse.Namespace) -> None:
    _out(to_builtins(broker.agents.get(args.agent_id)))


def cmd_agents_remove(broker: MEMP, args: argparse.Namespace) -> None:
    broker.agents.remove(args.agent_id)
    print(f"removed agent {args.agent_id}", file=sys.stderr)


def cmd_mcp(broker: MEMP, args: argparse.Namespace) -> None:
    try:
        from memp import bridge
    except ImportError:
        raise UsageError("memp mcp needs the mcp package: pip install -e './sdk-python[mcp]' "
                         "(from a clone of the repository)") from None
    bridge.run(broker.config)


def cmd_keys_create(broker: MEMP, args: argparse.Namespace) -> None:
    permissions = [p.strip() for p in args.permissions.split(",") if p.strip()]
    grants = [Grant(ns, permissions) for ns in args.grant_namespaces]
    _out(to_builtins(broker.keys.create(grants, args.name, args.agent_id)))


def cmd_keys_list(broker: MEMP, args: argparse.Namespace) -> None:
    _listing(broker.keys.list(), args.table, f"{'ID':<36}  {'NAME':<24}  GRANTS",
             lambda key: f"{key.id:<36}  {key.name:<24}  "
                         + " ".join(f"{g.namespace}={','.join(g.permissions)}"
                                    for g in key.grants))


def cmd_keys_revoke(broker: MEMP, args: argparse.Namespace) -> None:
    broker.keys.revoke(args.key_id)
    print(f"revoked {args.key_id}", file=sys.stderr)
