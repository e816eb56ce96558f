"""memp-broker: `serve` runs the broker; `keys` manages API keys in Redis."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from broker.core.clock import system_clock
from broker.core.errors import MempError
from broker.core.models import PERMISSIONS, Grant
from broker.runtime.listen import PortTaken, bind, bind_each
from broker.runtime.logs import FORMATS, LEVELS
from broker.runtime.settings import Settings, SettingsError
from broker.services.audit import AuditService, actor_fields
from broker.services.auth import Principal, check_binding, check_grants, create_api_key
from broker.storage import Storage
from broker.storage.client import StoreError
from broker.storage.urls import redacted
from broker.storage.writes import settle

# Whoever runs the CLI holds Redis itself: it acts with the admin key's rights, as `cli`.
_OPERATOR = Principal(subject="cli", grants=(), superuser=True)
_OPERATOR_ACTOR = actor_fields(_OPERATOR)


# What each command's --help shows under "example:", as `memp`'s commands do.
_EXAMPLES = {
    "serve": ["memp-broker serve                      # embedded store, http://127.0.0.1:8080",
              "MEMP_ADMIN_KEY=... memp-broker serve --redis-url redis://127.0.0.1:6379/0 "
              "--workers auto"],
    "keys": ["MEMP_REDIS_URL=redis://127.0.0.1:6379/0 memp-broker keys list"],
    "create": ["memp-broker keys create --namespace 'acme-*' --permissions read,write"],
    "list": ["memp-broker keys list"],
    "revoke": ["memp-broker keys revoke KEY_ID"],
}


def _epilog(command: str, text: str = "") -> str:
    lines = "\n".join(f"  {line}" for line in _EXAMPLES[command])
    return (textwrap.fill(text, 79) + "\n\n" if text else "") + f"example:\n{lines}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memp-broker", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    raw = argparse.RawDescriptionHelpFormatter
    serve = commands.add_parser(
        "serve", help="run the broker", formatter_class=raw,
        epilog=_epilog("serve",
                       "Every setting is also an environment variable MEMP_<NAME> "
                       "(docs/configuration.md). Fair share (docs/limits.md): "
                       "MEMP_AGENT_WRITES_PER_SECOND "
                       "and MEMP_AGENT_READS_PER_SECOND (each agent's own rate in each "
                       "namespace, bursts MEMP_AGENT_WRITE_BURST and MEMP_AGENT_READ_BURST), "
                       "MEMP_MAX_STREAMS_PER_TOKEN (open streams per credential), "
                       "MEMP_STREAM_LEASE_SECONDS, MEMP_RATE_LIMIT_HOLD_MS; 0 is no limit."))
    serve.add_argument("--host", help="address to listen on (MEMP_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (MEMP_PORT, default 8080)")
    serve.add_argument(
        "--redis-url",
        help="Redis URL (MEMP_REDIS_URL); embedded store if unset. One server: "
             "redis://[user:password@]host:port[/db] or rediss://... (TLS); Sentinel: "
             "redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]; Cluster: "
             "redis+cluster://[user:password@]host:port[,host:port...] (add +tls, or ?ssl=true, "
             "for TLS)")
    serve.add_argument("--tls-cert", metavar="PEM",
                       help="serve HTTPS with this certificate chain (MEMP_TLS_CERT); a renewed "
                            "file is served to new connections while open ones keep theirs")
    serve.add_argument("--tls-key", metavar="PEM",
                       help="the certificate's private key (MEMP_TLS_KEY); default: the key in "
                            "the --tls-cert file")
    serve.add_argument("--workers", type=_workers, default=1,
                       help="worker processes: a number, or 'auto' for one per core this "
                            "process may use (CPU affinity and a cgroup CPU quota count); "
                            "more than 1 needs Redis, and 'auto' on the embedded store is 1. "
                            "'auto' is the choice for production")
    serve.add_argument("--log-level", choices=LEVELS, type=str.lower,
                       default=os.environ.get("MEMP_LOG_LEVEL", "info").lower(),
                       help="least severe level logged (MEMP_LOG_LEVEL, default info; "
                            "info includes one access line per request)")
    serve.add_argument("--log-format", choices=FORMATS, type=str.lower,
                       default=os.environ.get("MEMP_LOG_FORMAT", "text").lower(),
                       help="text lines, or one JSON object per line (MEMP_LOG_FORMAT, "
                            "default text)")

    keys = commands.add_parser("keys", help="manage API keys (needs MEMP_REDIS_URL)",
                               formatter_class=raw, epilog=_epilog("keys"))
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    create = key_commands.add_parser("create", help="create an API key and print it once",
                                     formatter_class=raw, epilog=_epilog("create"))
    create.add_argument("--namespace", action="append", required=True,
                        help="namespace glob the key may use (repeatable), e.g. 'acme-*'")
    create.add_argument("--permissions", default="read,write,subscribe",
                        help=f"comma-separated, from {', '.join(PERMISSIONS)}")
    create.add_argument("--name", default="")
    create.add_argument("--agent-id", help="bind the key to a registered agent")
    key_commands.add_parser("list", help="list API keys (never the keys themselves)",
                            formatter_class=raw, epilog=_epilog("list"))
    revoke = key_commands.add_parser("revoke", help="revoke an API key by id",
                                     formatter_class=raw, epilog=_epilog("revoke"))
    revoke.add_argument("key_id")
    return parser


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a number from 1, or auto, not {text!r}")
    return int(text)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota
    (a container limited to 2 CPUs on a 16-core host gets 2), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(cores, 1)


def _worker_count(workers: int | str, settings: Settings) -> tuple[int, str | None]:
    """--workers as a number (`auto` is one per usable core, one on the embedded store), and
    what to say about a count chosen for the operator."""
    if isinstance(workers, int):
        return workers, None
    count = 1 if settings.embedded else usable_cores()
    note = " (the embedded store is per process)" if settings.embedded else ""
    return count, (f"memp-broker: --workers auto: {count} worker process"
                   f"{'es' if count > 1 else ''}{note}")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        for value, choices, variable in ((args.log_level, LEVELS, "MEMP_LOG_LEVEL"),
                                         (args.log_format, FORMATS, "MEMP_LOG_FORMAT")):
            if value not in choices:
                parser.error(f"{variable} must be one of {', '.join(choices)}, not {value!r}")
    try:
        if args.command == "serve":
            settings = Settings.from_env(host=args.host, port=args.port,
                                         redis_url=args.redis_url, tls_cert=args.tls_cert,
                                         tls_key=args.tls_key)
            return serve(settings, args.workers, args.log_level, args.log_format)
        return asyncio.run(manage_keys(Settings.from_env(), args))
    except PortTaken as exc:
        print(f"memp-broker: {exc}", file=sys.stderr)
        return 1
    except (SettingsError, MempError) as exc:
        message = exc.message if isinstance(exc, MempError) else str(exc)
        print(f"memp-broker: {message}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"memp-broker: Redis failed: {exc}", file=sys.stderr)
        return 1


def serve(settings: Settings, requested: int | str, log_level: str, log_format: str) -> int:
    from broker.runtime import logs

    workers, note = _worker_count(requested, settings)
    if workers > 1 and settings.embedded:
        raise SettingsError("--workers > 1 needs MEMP_REDIS_URL: the embedded store is per "
                            "process")
    # The port first: a broker that cannot listen says so before anything else (and makes up
    # no admin key it would never use).
    listeners = bind_each(settings.host, settings.port, workers) if workers > 1 \
        else [bind(settings.host, settings.port)]
    if note:
        print(note, flush=True)
    if workers > 1:
        from broker.runtime.metrics import prepare_multiprocess, remove_multiprocess

        # Before the app (and prometheus_client) is imported: the workers add up their metrics.
        metrics_dir = prepare_multiprocess()
    import uvicorn

    from broker.app import create_app
    from broker.runtime.connections import ConnectionLimits, ServerConfig
    from broker.runtime.gc_tuning import tune_for_server
    from broker.runtime.tls import CertificateFiles
    from broker.runtime.workers import WorkerPool

    log_config = logs.configure(log_level, log_format)
    certificates = CertificateFiles.of(settings)
    if certificates is not None:
        certificates.load()  # a missing file or a mismatched pair stops here, with its reason
    if not settings.production and not settings.admin_key:
        # The embedded quick start: nothing outlives the run, so a key made up for it is safe
        # to show. In production mode no key is ever made up or printed.
        settings = replace(settings, admin_key=f"memp_admin_{secrets.token_urlsafe(24)}")
        print(f"memp-broker: admin key for this run: {settings.admin_key}", flush=True)
    elif not (settings.admin_key or settings.jwt_secret or settings.jwt_public_key):
        # Otherwise a first start on Redis answers every request 401 with no word why.
        print("memp-broker: no MEMP_ADMIN_KEY and no JWT key: the only tokens are API keys "
              "made with `memp-broker keys create --namespace NS` (docs/authentication.md)",
              flush=True)
    options: dict[str, Any] = dict(
        host=settings.host, port=settings.port, log_config=log_config, log_level=log_level,
        access_log=False, proxy_headers=False, timeout_graceful_shutdown=10,
        ssl_context_factory=certificates)
    limits = ConnectionLimits.of(settings)
    if workers > 1:
        # Every worker process builds its own listening context from the files
        # (`broker.runtime.tls`).
        _hand_down(settings)
        config = ServerConfig("broker.asgi:build", limits, factory=True, workers=workers,
                              **options)
    else:
        config = ServerConfig(create_app(settings), limits, **options)
        tune_for_server()
    _announce(settings, https=certificates is not None)
    if workers > 1:
        try:
            WorkerPool(config, listeners).run()
        finally:
            remove_multiprocess(metrics_dir)
    else:
        uvicorn.Server(config).run(sockets=listeners)
    return 0


def _announce(settings: Settings, https: bool) -> None:
    """The line that says where the broker listens and where its data lives."""
    where = "in memory (embedded store; gone when the broker stops)" if settings.embedded \
        else f"in Redis at {redacted(settings.redis_url or '')}"
    scheme = "https" if https else "http"
    console = f"; console at {scheme}://{settings.host}:{settings.port}/console" \
        if settings.console else ""
    print(f"memp-broker: listening on {scheme}://{settings.host}:{settings.port}; "
          f"data lives {where}{console}", flush=True)


def _hand_down(settings: Settings) -> None:
    """Worker processes read their settings from the environment (`broker.asgi`), so what the
    flags said must reach them there."""
    for name in ("host", "port", "redis_url", "tls_cert", "tls_key"):
        value = getattr(settings, name)
        if value is not None:
            os.environ[f"MEMP_{name.upper()}"] = str(value)


async def manage_keys(settings: Settings, args: argparse.Namespace) -> int:
    if settings.embedded:
        raise SettingsError("keys needs MEMP_REDIS_URL; with the embedded store, use the admin "
                            "key printed by 'memp-broker serve' and POST /v1/keys")
    storage = Storage.open(settings.redis_url, timeout=settings.redis_timeout_seconds,
                           history_limit=settings.history_limit,
                           changelog_maxlen=settings.changelog_maxlen, idempotency_window_ms=1,
                           write_replicas=settings.replicas_to_confirm,
                           write_replicas_timeout_ms=settings.write_replicas_timeout_ms)
    store = storage.accounts
    audit = AuditService(storage.audit, system_clock, storage.entries.namespaces)
    try:
        await storage.upgrade()
        if args.keys_command == "create":
            permissions = [p.strip() for p in args.permissions.split(",") if p.strip()]
            try:
                grants = msgspec.convert(
                    [{"namespace": ns, "permissions": permissions} for ns in args.namespace],
                    list[Grant])
            except msgspec.ValidationError as exc:
                raise SettingsError(f"invalid grant: {exc}") from None
            if args.agent_id is not None:
                await check_binding(_OPERATOR, store, args.agent_id)
            api_key, record = await create_api_key(
                store, settings.key_env, grants=check_grants(grants), name=args.name,
                agent_id=args.agent_id, created_by=_OPERATOR.subject, now=system_clock())
            await audit.record_for_grants(record.grants, "key-create", _OPERATOR_ACTOR,
                                          {"key": record.id, "agent": record.agent_id})
            print(json.dumps({"api_key": api_key, "key": msgspec.to_builtins(record)}))
        elif args.keys_command == "list":
            for record in await store.list_api_keys():
                print(json.dumps(msgspec.to_builtins(record)))
        elif args.keys_command == "revoke":
            revoked = [r for r in await store.list_api_keys() if r.id == args.key_id]
            if not revoked:
                print(f"memp-broker: no API key {args.key_id}", file=sys.stderr)
                return 1
            await settle(store.delete_api_key(args.key_id), lambda: audit.record_for_grants(
                revoked[0].grants, "key-revoke", _OPERATOR_ACTOR, {"key": args.key_id}))
            print(f"revoked {args.key_id}")
    finally:
        await storage.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
