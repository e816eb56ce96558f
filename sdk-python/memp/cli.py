"""`memp`: the command line for a MEMP broker (put, get, query, delete, history, watch, config,
schema, proposals, approve, reject, audit, ...).

Output is JSON (one document, or one per line for lists and events) unless `--table` asks for
a readable table. Exit codes: 0 done, 1 the broker refused (message on stderr), 2 bad usage,
3 the broker could not be reached, 130 interrupted (Ctrl-C)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from memp._commands import (
    UsageError,
    cmd_agents_get,
    cmd_agents_list,
    cmd_agents_remove,
    cmd_approve,
    cmd_audit,
    cmd_config_get,
    cmd_config_set,
    cmd_delete,
    cmd_get,
    cmd_history,
    cmd_keys_create,
    cmd_keys_list,
    cmd_keys_revoke,
    cmd_mcp,
    cmd_proposal,
    cmd_proposals,
    cmd_put,
    cmd_query,
    cmd_register,
    cmd_reject,
    cmd_schema_delete,
    cmd_schema_get,
    cmd_schema_list,
    cmd_schema_put,
    cmd_watch,
)
from memp._transport import NamespaceMissing
from memp._version import __version__
from memp.client import MEMP
from memp.errors import ConnectionFailed, MempError, SchemaViolationWarning

EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 1, 2, 3, 130


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
    group.add_argument("--retry-for", type=float, metavar="SECONDS", default=argparse.SUPPRESS,
                       help="how long to keep retrying a broker out of reach or answering 503, "
                            "e.g. during a Redis failover (MEMP_RETRY_FOR; default 20, 0: no "
                            "retries)")
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
    proposals.add_argument("--table", action="store_true",
                           help="print a readable table (agents by name)")
    proposals.add_argument("--wide", action="store_true",
                           help="a table with each agent's full id beside its name")
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
    audit.add_argument("--after", metavar="ID",
                       help="only records appended after this record id (the newest id of a "
                            "previous export: export incrementally)")
    audit.add_argument("--limit", type=int, help="at most this many records (default: all)")
    audit.add_argument("--table", action="store_true",
                       help="print a readable table (agents by name)")
    audit.add_argument("--wide", action="store_true",
                       help="a table with each actor's full id beside its name")

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
    watch.add_argument("--filter", help='only changes this expression accepts, e.g. '
                       "'/status == \"done\"' (docs/subscriptions.md)")

    register = command("register", cmd_register,
                       "register an agent; prints it and its API key (shown once)")
    register.add_argument("--name", required=True)
    register.add_argument("--framework", default="custom",
                          help="langchain, crewai, claude, autogen, custom, ...")
    register.add_argument("--new", action="store_true",
                          help="register another agent of this name (by default a name this "
                               "token registered before is that agent, with a new API key)")
    register.add_argument("--reuse", action="store_true",
                          help="if an agent of this name is registered in the namespace, by "
                               "any token, use it (with a new API key of the grants its first "
                               "key had) instead of registering another")

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
            "clients (needs the mcp extra: pip install -e './sdk-python[mcp]'); "
            "MEMP_NAMESPACE, if set, is the default namespace")

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
              "memp -n my-app audit export --after \"$(head -1 audit.ndjson | jq -r .id)\"",
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
                retry_for=getattr(args, "retry_for", None),
                ca_bundle=getattr(args, "ca_bundle", None))


def _say_retries() -> None:
    """The SDK logs what a call waits for when it retries ("memp: the broker ... is
    unavailable (503); retrying ..."): print it on stderr, as it happens."""
    logger = logging.getLogger("memp")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.showwarning = _warn_in_one_line
    _say_retries()
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
    except NamespaceMissing:
        print("memp: no namespace: pass -n NAMESPACE (--namespace) or set MEMP_NAMESPACE",
              file=sys.stderr)
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
