"""`memp`: the command line for a MEMP broker (put, get, query, delete, history, watch, config,
schema, proposals, approve, reject, audit, ...).

Output is JSON (one document, or one per line for lists and events) unless `--table` asks for
a readable table. Exit codes: 0 done, 1 the broker refused (message on stderr), 2 bad usage,
3 the broker could not be reached, 130 interrupted (Ctrl-C)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec

from memp._version import __version__
from memp.client import MEMP
from memp.errors import ApprovalPending, ConnectionFailed, MempError, SchemaViolationWarning
from memp.models import Agent, AuditRecord, Entry, Event, Grant, NamespaceConfig, to_builtins
from memp.subscription import ConnectionState

EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 1, 2, 3, 130


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
    _listing(proposals, args.table, f"{'ID':<33}  {'STATUS':<8}  {'OP':<6}  {'BY':<24}  KEY",
             lambda proposal: f"{proposal.id:<33}  {proposal.status:<8}  "
                              f"{proposal.operation:<6}  {proposal.proposed_by[:24]:<24}  "
                              f"{proposal.key}")


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
                 "actor": args.actor, "key": args.key, "action": args.action}
    records = broker.audit.export(**selection) if args.what == "export" or args.limit is None \
        else broker.audit.list(limit=args.limit, **selection).records
    _listing(records, args.table,
             f"{'TIME':<12}  {'ACTION':<14}  {'ACTOR':<24}  {'VERSIONS':<9}  KEY", _audit_row)


def _audit_row(record: AuditRecord) -> str:
    versions = f"{record.version_before or '-'}>{record.version_after or '-'}"
    return (f"{_clock(record.at):<12}  {record.action:<14}  {record.actor[:24]:<24}  "
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
                          on_state=_say_state(broker.config.base_url)) as events:
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
    existing = next((a for a in _agents(broker) if a.name == args.name), None) \
        if args.reuse else None
    if existing is None:
        agent = broker.register(name=args.name, framework=args.framework)
        credentials = to_builtins(broker.credentials)
    else:
        # The agent's first key was shown once, at registration: this one is new, bound to it.
        created = broker.keys.create([Grant(existing.namespace, ["read", "write", "subscribe"])],
                                     f"{existing.name} (reused)", existing.id)
        agent = existing
        credentials = {"api_key": created.api_key, "key_id": created.key.id,
                       "agent_id": existing.id}
        print(f"# reusing agent {existing.name} ({existing.id}) with a new API key",
              file=sys.stderr)
    _out({"agent": to_builtins(agent), "credentials": credentials})
    print(f"# the agent's API key is shown only now: export MEMP_API_KEY="
          f"{credentials['api_key']}", file=sys.stderr)


def cmd_agents_list(broker: MEMP, args: argparse.Namespace) -> None:
    _listing(list(_agents(broker)), args.table,
             f"{'ID':<36}  {'NAME':<24}  {'FRAMEWORK':<12}  LAST SEEN",
             lambda agent: f"{agent.id:<36}  {agent.name[:24]:<24}  "
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
        raise UsageError("memp mcp needs the mcp package: pip install 'memp-sdk[mcp]'") \
            from None
    bridge.run(broker.config)


def cmd_keys_create(broker: MEMP, args: argparse.Namespace) -> None:
    permissions = [p.strip() for p in args.permissions.split(",") if p.strip()]
    grants = [Grant(ns, permissions) for ns in args.grant_namespaces]
    _out(to_builtins(broker.keys.create(grants, args.name, args.agent_id)))


def cmd_keys_list(broker: MEMP, args: argparse.Namespace) -> None:
    _listing(broker.keys.list(), args.table, f"{'ID':<36}  {'NAME':<24}  GRANTS",
             lambda key: f"{key.id:<36}  {key.name[:24]:<24}  "
                         + " ".join(f"{g.namespace}={','.join(g.permissions)}"
                                    for g in key.grants))


def cmd_keys_revoke(broker: MEMP, args: argparse.Namespace) -> None:
    broker.keys.revoke(args.key_id)
    print(f"revoked {args.key_id}", file=sys.stderr)


def _connection_options(namespace: bool = True) -> argparse.ArgumentParser:
    """Flags every command takes, before or after its name; they win over the environment."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    group.add_argument("--base-url", default=argparse.SUPPRESS,
                       help="broker URL (MEMP_BASE_URL; default http://127.0.0.1:8080)")
    group.add_argument("--api-key", default=argparse.SUPPRESS,
                       help="token to send (MEMP_API_KEY)")
    if namespace:
        group.add_argument("-n", "--namespace", default=argparse.SUPPRESS,
                           help="namespace to work in (MEMP_NAMESPACE)")
    group.add_argument("--timeout", type=float, default=argparse.SUPPRESS,
                       help="seconds to wait for each reply (default 10)")
    group.add_argument("--ca-bundle", metavar="PEM", default=argparse.SUPPRESS,
                       help="trust only the CAs in this file for an https:// broker "
                            "(MEMP_CA_BUNDLE; default: the usual public CAs)")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _connection_options()
    admin = _connection_options(namespace=False)  # `keys create --namespace` names grants
    parser = argparse.ArgumentParser(
        prog="memp", parents=[common], description=__doc__, epilog=_examples(""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"memp-sdk {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[MEMP, argparse.Namespace], None], text: str,
                under: Any = commands, parent: argparse.ArgumentParser = common
                ) -> argparse.ArgumentParser:
        path = f"{under.dest.removesuffix('_command')} {name}" if under is not commands \
            else name
        sub: argparse.ArgumentParser = under.add_parser(
            name, parents=[parent], help=text, description=text,
            epilog=_examples(path), formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(handler=handler)
        return sub

    put = command("put", cmd_put, "store a JSON value under a key; prints the entry")
    put.add_argument("key")
    put.add_argument("value", nargs="?", help="JSON text; omit or '-' to read it from stdin")
    put.add_argument("--ttl", type=int, help="seconds until the entry expires")
    put.add_argument("--if-version", type=int, help="write only while the version is this")
    put.add_argument("--if-absent", action="store_true", help="write only if the key is free")
    put.add_argument("--timestamp", type=int, help="the write's time, Unix ms")
    put.add_argument("--approval-required", action="store_true",
                     help="make it a proposal a reviewer must approve (prints the proposal)")

    get = command("get", cmd_get, "print the value under a key")
    get.add_argument("key")
    get.add_argument("--entry", action="store_true", help="print the whole entry")

    query = command("query", cmd_query, "print the entries matching a pattern, one per line")
    query.add_argument("pattern", nargs="?", default="*", help="e.g. 'customer/*' (default *)")
    query.add_argument("--page-size", type=int, help="entries per request")
    query.add_argument("--table", action="store_true", help="print a readable table")

    delete = command("delete", cmd_delete, "delete a key; prints the tombstone")
    delete.add_argument("key")
    delete.add_argument("--if-version", type=int, help="delete only while the version is this")
    delete.add_argument("--approval-required", action="store_true",
                        help="make it a proposal a reviewer must approve")

    proposals = command("proposals", cmd_proposals,
                        "list proposals (gated writes), newest first, one per line")
    proposals.add_argument("--status", choices=["pending", "approved", "rejected", "expired"])
    proposals.add_argument("--key")
    proposals.add_argument("--table", action="store_true", help="print a readable table")
    proposal = command("proposal", cmd_proposal, "print a proposal with its diff")
    proposal.add_argument("proposal_id", metavar="ID")
    approve = command("approve", cmd_approve,
                      "approve a proposal, writing it (needs review); prints it and the entry")
    approve.add_argument("proposal_id", metavar="ID")
    approve.add_argument("--base-version", type=int,
                         help="after a conflict: approve it rebased onto this current version")
    reject = command("reject", cmd_reject, "reject a proposal (needs review)")
    reject.add_argument("proposal_id", metavar="ID")
    reject.add_argument("--reason", default="")

    audit = command("audit", cmd_audit,
                    "read the audit log, newest first (needs audit): list (default), export "
                    "the whole selection, or verify its hash chain (exit 1 when broken)")
    audit.add_argument("what", nargs="?", choices=["list", "export", "verify"], default="list")
    audit.add_argument("--since", help="e.g. 1h, 30m, 7d, Unix ms or an ISO 8601 time")
    audit.add_argument("--until", help="as --since")
    audit.add_argument("--actor", help="an agent id, key id or admin")
    audit.add_argument("--key")
    audit.add_argument("--action", help="put, delete, merge, propose, approve, config, ...")
    audit.add_argument("--limit", type=int, help="at most this many records (default: all)")
    audit.add_argument("--table", action="store_true", help="print a readable table")

    history = command("history", cmd_history, "print a key's recent versions, newest first")
    history.add_argument("key")
    history.add_argument("--limit", type=int)
    history.add_argument("--table", action="store_true", help="print a readable table")

    watch = command("watch", cmd_watch,
                    "print changes as they happen, one JSON line each, until Ctrl-C")
    watch.add_argument("patterns", nargs="*", metavar="PATTERN", help="default *")
    watch.add_argument("--snapshot", action="store_true",
                       help="start with the current entries, then a snapshot-end event")
    watch.add_argument("--table", action="store_true", help="print readable lines")
    watch.add_argument("--last-event-id", help="resume after this event id")

    register = command("register", cmd_register,
                       "register an agent; prints it and its API key (shown once)")
    register.add_argument("--name", required=True)
    register.add_argument("--framework", default="custom",
                          help="langchain, crewai, claude, autogen, custom, ...")
    register.add_argument("--reuse", action="store_true",
                          help="if an agent of this name is registered in the namespace, "
                               "use it (with a new API key bound to it) instead of "
                               "registering another")

    agents = commands.add_parser("agents", parents=[common], help="list, show or remove agents",
                                 description="the namespace's registered agents",
                                 epilog=_examples("agents"),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    agent_commands = agents.add_subparsers(dest="agents_command", required=True,
                                           metavar="COMMAND")
    agents_list = command("list", cmd_agents_list, "print the namespace's agents, one per line",
                          agent_commands)
    agents_list.add_argument("--table", action="store_true", help="print a readable table")
    agents_get = command("get", cmd_agents_get, "print one agent", agent_commands)
    agents_get.add_argument("agent_id", metavar="ID")
    agents_remove = command("remove", cmd_agents_remove, "remove an agent (admin)",
                            agent_commands)
    agents_remove.add_argument("agent_id", metavar="ID")

    command("mcp", cmd_mcp,
            "serve the broker's MCP tools and resources over stdin/stdout, for desktop MCP "
            "clients (needs memp-sdk[mcp]); MEMP_NAMESPACE, if set, is the default namespace")

    config = commands.add_parser(
        "config", parents=[common], help="read or replace the namespace configuration (admin)",
        epilog=_examples("config"), formatter_class=argparse.RawDescriptionHelpFormatter,
        description="read or replace the namespace's configuration: conflict strategies, "
                    "agent priorities, retention, shares (needs admin on the namespace)")
    config_commands = config.add_subparsers(dest="config_command", required=True,
                                            metavar="COMMAND")
    command("get", cmd_config_get, "print the configuration, with its revision",
            config_commands)
    config_set = command("set", cmd_config_set,
                         "replace the configuration with a JSON document; prints the result "
                         "(fields left out take their defaults)", config_commands)
    config_set.add_argument("config", nargs="?", metavar="CONFIG",
                            help="JSON object, e.g. '{\"strategy\": \"merge\"}', or @FILE; "
                                 "omit or '-' to read it from stdin (the output of `config get` "
                                 "will do)")
    config_set.add_argument("--if-revision", type=int,
                            help="replace only while the stored revision is this")

    schema = commands.add_parser(
        "schema", parents=[common], help="manage JSON Schemas for key patterns",
        epilog=_examples("schema"), formatter_class=argparse.RawDescriptionHelpFormatter,
        description="manage the namespace's JSON Schemas (put and delete need admin)")
    schema_commands = schema.add_subparsers(dest="schema_command", required=True,
                                            metavar="COMMAND")
    schema_put = command("put", cmd_schema_put,
                         "register or replace a schema for a key pattern; prints the record",
                         schema_commands)
    schema_put.add_argument("schema_id", metavar="ID", help="[a-z0-9][a-z0-9._-]{0,63}")
    schema_put.add_argument("schema", metavar="SCHEMA",
                            help="the JSON Schema: JSON text, @FILE, or '-' to read it from "
                                 "stdin")
    schema_put.add_argument("--pattern", required=True, help="keys it applies to, e.g. "
                                                             "'customer/*'")
    schema_put.add_argument("--enforce", action="store_true",
                            help="refuse non-conforming values instead of flagging them")
    schema_get = command("get", cmd_schema_get, "print a schema", schema_commands)
    schema_get.add_argument("schema_id", metavar="ID")
    schema_get.add_argument("--record", action="store_true",
                            help="print the whole record (pattern, enforce, draft, ...)")
    schema_list = command("list", cmd_schema_list, "print every schema's record, one per line",
                          schema_commands)
    schema_list.add_argument("--table", action="store_true", help="print a readable table")
    schema_delete = command("delete", cmd_schema_delete, "delete a schema", schema_commands)
    schema_delete.add_argument("schema_id", metavar="ID")

    keys = commands.add_parser("keys", parents=[admin], help="manage API keys (admin)",
                               description="manage API keys (needs an admin token)",
                               epilog=_examples("keys"),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    key_commands = keys.add_subparsers(dest="key_command", required=True, metavar="COMMAND")
    create = command("create", cmd_keys_create, "create an API key and print it once",
                     key_commands, admin)
    create.add_argument("--namespace", dest="grant_namespaces", action="append", required=True,
                        metavar="GLOB", help="namespace glob to grant (repeatable)")
    create.add_argument("--permissions", default="read,write,subscribe",
                        help="comma-separated: read, write, subscribe, admin")
    create.add_argument("--name", default="")
    create.add_argument("--agent-id", help="bind the key to a registered agent")
    listing = command("list", cmd_keys_list, "list API keys (never the keys themselves)",
                      key_commands, admin)
    listing.add_argument("--table", action="store_true", help="print a readable table")
    revoke = command("revoke", cmd_keys_revoke, "revoke an API key by id", key_commands,
                     admin)
    revoke.add_argument("key_id")
    return parser


_EXAMPLES = {
    "": ["export MEMP_BASE_URL=http://127.0.0.1:8080 MEMP_API_KEY=... MEMP_NAMESPACE=my-app",
         "memp put customer/123 '{\"plan\": \"pro\"}'",
         "memp watch 'customer/*' --table"],
    "config": ["memp -n my-app config get"],
    "schema": ["memp -n my-app schema list --table"],
    "keys": ["memp keys list --table"],
    "agents": ["memp -n my-app agents list --table"],
    "put": ["memp -n my-app put customer/123 '{\"plan\": \"pro\"}'",
            "echo '[1, 2]' | memp -n my-app put lists/a --ttl 3600"],
    "get": ["memp -n my-app get customer/123", "memp -n my-app get customer/123 --entry"],
    "query": ["memp -n my-app query 'customer/*' --table"],
    "delete": ["memp -n my-app delete customer/123 --if-version 3"],
    "history": ["memp -n my-app history customer/123 --table"],
    "watch": ["memp -n my-app watch 'customer/*' --table",
              "memp -n my-app watch --snapshot --last-event-id \"$CURSOR\""],
    "proposals": ["memp -n my-app proposals --status pending --table"],
    "proposal": ["memp -n my-app proposal PROPOSAL_ID"],
    "approve": ["memp -n my-app approve PROPOSAL_ID",
                "memp -n my-app approve PROPOSAL_ID --base-version 7"],
    "reject": ["memp -n my-app reject PROPOSAL_ID --reason 'not a fact'"],
    "audit": ["memp -n my-app audit --since 1h --key customer/123 --table",
              "memp -n my-app audit export > audit.ndjson",
              "memp -n my-app audit verify"],
    "register": ["memp -n my-app register --name planner --framework langchain --reuse"],
    "mcp": ["MEMP_API_KEY=... MEMP_NAMESPACE=my-app memp mcp"],
    "agents list": ["memp -n my-app agents list --table"],
    "agents get": ["memp -n my-app agents get AGENT_ID"],
    "agents remove": ["memp -n my-app agents remove AGENT_ID"],
    "config get": ["memp -n my-app config get"],
    "config set": ["memp -n my-app config set '{\"strategy\": \"merge\"}'",
                   "memp -n my-app config get | memp -n my-app config set -"],
    "schema put": ["memp -n my-app schema put customer @customer.schema.json "
                   "--pattern 'customer/*' --enforce"],
    "schema get": ["memp -n my-app schema get customer"],
    "schema list": ["memp -n my-app schema list --table"],
    "schema delete": ["memp -n my-app schema delete customer"],
    "key create": ["memp keys create --namespace 'my-app' --permissions read,subscribe"],
    "key list": ["memp keys list --table"],
    "key revoke": ["memp keys revoke KEY_ID"],
}


def _examples(path: str) -> str | None:
    lines = _EXAMPLES.get(path)
    return "example:\n" + "\n".join(f"  {line}" for line in lines) if lines else None


def _check_base_url(args: argparse.Namespace) -> None:
    url = getattr(args, "base_url", None) or os.environ.get("MEMP_BASE_URL")
    if url and not re.match(r"https?://[^/]", url, re.IGNORECASE):
        raise UsageError(f"the broker URL must start with http:// or https:// (got {url!r}); "
                         "e.g. --base-url http://127.0.0.1:8080")


def _warn_in_one_line(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, file: Any = None, line: str | None = None) -> None:
    text = str(message)
    label = "schema violation" if issubclass(category, SchemaViolationWarning) else "warning"
    print(f"memp: {label}: {text}", file=sys.stderr, flush=True)


def _client(args: argparse.Namespace) -> MEMP:
    _check_base_url(args)
    return MEMP(api_key=getattr(args, "api_key", None),
                namespace=getattr(args, "namespace", None),
                base_url=getattr(args, "base_url", None),
                timeout=getattr(args, "timeout", 10.0),
                ca_bundle=getattr(args, "ca_bundle", None))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.showwarning = _warn_in_one_line
    try:
        with _client(args) as broker:
            args.handler(broker, args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`memp watch | head`): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UsageError as exc:
        print(f"memp: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"memp: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConnectionFailed as exc:
        print(f"memp: {exc.message}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except MempError as exc:
        print(f"memp: {exc}", file=sys.stderr)
        if exc.status == 401:
            print("memp: the broker refused the token: set MEMP_API_KEY or pass --api-key "
                  "(an API key, or the admin key)", file=sys.stderr)
        if exc.details:
            print(json.dumps(exc.details, ensure_ascii=False), file=sys.stderr)
        return EXIT_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
