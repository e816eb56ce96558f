"""create_app(settings): wires the store, services, routes and background jobs together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from broker.amp.lifecycle import LifecycleEngine, Purger
from broker.amp.poster import TermPoster
from broker.amp.service import CellService
from broker.amp.visibility import CellVisibility
from broker.core.clock import Clock, system_clock
from broker.core.errors import MempError, corrupt_record
from broker.governance.gate import ProposalGate
from broker.governance.proposals import ProposalService
from broker.governance.sweeper import ExpirySweeper, GovernanceSweeper
from broker.mcp import mount as mcp
from broker.runtime.logs import RequestIdMiddleware, Throttle
from broker.runtime.metrics import Metrics, MetricsMiddleware
from broker.runtime.settings import Settings
from broker.runtime.supervisor import Backoff, Supervisor
from broker.schemas.runner import SchemaRunner
from broker.services.activity import AgentActivity
from broker.services.agents import AgentService
from broker.services.approval import Proposed
from broker.services.audit import AuditService
from broker.services.auth import Authenticator
from broker.services.limits import FairShare, RateLimited
from broker.services.memory import MemoryService
from broker.services.namespaces import NamespaceRegistry
from broker.storage import Storage
from broker.storage.client import STORE_DOWN, StoreError, out_of_memory, store_down
from broker.storage.records import CorruptRecord
from broker.streaming.changes import ChangeLog
from broker.streaming.hub import Hub
from broker.streaming.invalidations import InvalidationListener
from broker.streaming.leases import StreamLeases
from broker.streaming.revocation import StreamGuard
from broker.web.console import routes as console
from broker.web.http import InternalErrorMiddleware, error_response, json_response
from broker.web.messages import MessageHandler
from broker.web.routes import (
    agents,
    amp,
    api_keys,
    audit,
    memory,
    messages,
    namespaces,
    proposals,
    subscribe,
    system,
)
from broker.web.sse import AbortableApp, SendWatchdog

if TYPE_CHECKING:
    from broker.mcp.server import McpServer

log = logging.getLogger("memp")
OUTAGE_LOG_SECONDS = 30.0  # while the store is out of reach, one warning per this many seconds

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
               415: "unsupported_media_type"}


async def _mempe_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, MempError)
    if isinstance(exc, RateLimited) and exc.hold_ms:
        await asyncio.sleep(exc.hold_ms / 1000)  # a flood's refusals come late (limits.py)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "invalid_request")
    message = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
    headers, details = {}, {}
    if exc.status_code == 404:  # whoever opens the broker's root in a browser learns where to go
        details["api_reference"] = "/docs"
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(_allowed_methods(request))
    return error_response(MempError(code, message, details, headers=headers))


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (GET, PUT and DELETE are separate routes)."""
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches({**request.scope, "method": next(iter(route.methods))})
            if match == Match.FULL:
                methods |= route.methods
    return sorted(methods)


async def _proposed(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Proposed)
    return json_response(exc.proposal, 202, {"Location": f"/v1/namespaces/{exc.proposal.namespace}"
                                                          f"/proposals/{exc.proposal.id}"})


async def _store_down(request: Request, exc: Exception) -> Response:
    if out_of_memory(exc):  # Redis answers: no outage, whose end the store watch would say
        request.app.state.store_full.failure("Redis is out of memory, refusing writes: %s", exc)
    else:
        request.app.state.outage.failure("store unavailable, answering 503: %s", exc)
    return error_response(store_down(exc))


async def _corrupt(request: Request, exc: Exception) -> Response:
    log.error("corrupt record on %s %s: %s", request.method, request.url.path, exc)
    return error_response(corrupt_record(exc))


async def _watch_store(storage: Storage, outage: Throttle) -> None:
    """While the store is out of reach, ping it each second; say so once it answers."""
    while True:
        await asyncio.sleep(1.0)
        if outage.failing:
            await storage.ping()
            outage.recovered("the store is reachable again")


def create_app(settings: Settings, *, clock: Clock = system_clock,
               storage: Storage | None = None) -> Starlette:
    """Build the broker. `storage` may be passed in (tests); otherwise it is opened from
    settings."""
    storage = storage or Storage.open(
        settings.redis_url, timeout=settings.redis_timeout_seconds,
        history_limit=settings.history_limit, changelog_maxlen=settings.changelog_maxlen,
        idempotency_window_ms=settings.idempotency_window_seconds * 1000,
        write_replicas=settings.write_replicas,
        write_replicas_timeout_ms=settings.write_replicas_timeout_ms,
    )
    # Store errors that mean it is out of reach are expected: a warning, not a traceback, and
    # one per OUTAGE_LOG_SECONDS while it lasts, then a line when the store is back.
    outage = Throttle(logging.getLogger("memp.store"), OUTAGE_LOG_SECONDS)
    supervisor = Supervisor(transient=(*STORE_DOWN, OSError), outage=outage)
    activity = AgentActivity(storage.accounts)
    audit_service = AuditService(storage.audit, clock, storage.entries.namespaces)
    metrics = Metrics()
    storage.observe(metrics)
    schema_runner = SchemaRunner(settings.schema_timeout_ms / 1000)
    registry = NamespaceRegistry(storage.config, settings.namespace_cache_seconds,
                                 runner=schema_runner)
    cell_visibility = CellVisibility(settings.amp_namespace)
    fair_share = FairShare(settings, storage.fair_share, metrics, clock)
    stream_leases = StreamLeases(settings, fair_share, registry, supervisor, clock)
    approvals = ProposalGate(storage.proposals, registry, fair_share, clock,
                             settings.proposal_ttl_seconds, settings.max_pending_proposals)
    memory_service = MemoryService(settings, storage.entries, registry, activity, clock,
                                   cell_visibility, fair_share, approvals)
    agent_service = AgentService(settings, storage.accounts, activity, clock, audit_service)
    sweeper = ExpirySweeper(storage.entries, clock, settings.sweep_interval_seconds,
                            settings.sweep_batch, settings.changelog_max_age_seconds * 1000)
    amp_cells = CellService(storage.cells(settings.amp_namespace), clock, fair_share, registry,
                            approvals)
    proposal_service = ProposalService(storage.proposals, memory_service, amp_cells, clock)
    governance = GovernanceSweeper(storage.entries, proposal_service, storage.audit, clock,
                                   settings.audit_retention_seconds * 1000)
    amp_engine = LifecycleEngine(amp_cells, clock)
    amp_poster = TermPoster(amp_cells.index)
    changelog = ChangeLog(storage.changes, cell_visibility)
    hub = Hub(changelog, settings.reader_block_ms, settings.redis_timeout_seconds * 2,
              supervisor)
    send_watchdog = SendWatchdog(settings.sse_send_timeout_seconds)
    auth = Authenticator(settings, storage.accounts)
    stream_guard = StreamGuard(auth, registry, supervisor)
    listener = InvalidationListener(registry, auth, stream_guard, settings.reader_block_ms)

    def mcp_server() -> McpServer:
        # Imported here: only once /mcp is first used (broker/mcp/mount.py).
        from broker.mcp.resources import Resources
        from broker.mcp.server import McpServer
        from broker.mcp.tools import Toolbox
        from broker.mcp.watch import Watcher

        return McpServer(Toolbox(memory_service, amp_cells, agent_service),
                         Resources(memory_service),
                         Watcher(settings, hub, registry, memory_service, stream_guard,
                                 stream_leases),
                         settings.max_request_bytes)

    mcp_mount = mcp.McpMount(auth, mcp_server)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await storage.ping()
            await storage.upgrade()
        except StoreError as exc:
            outage.failure("store not reachable at start (%s); serving 503 until it is", exc)
        supervisor.start("expiry sweeper", sweeper.run)
        supervisor.every("last-seen flusher", settings.last_seen_flush_seconds, activity.flush)
        # Revocations must reach every process within 2 s: it tries again at least every 1 s.
        supervisor.start("invalidation listener", lambda: listener.listen(storage),
                         Backoff(cap=1.0))
        supervisor.start("stream guard", stream_guard.run)
        supervisor.start("AMP lifecycle engine",
                         lambda: amp_engine.run_forever(settings.amp_lifecycle_interval_seconds,
                                                       metrics.amp_pass))
        supervisor.start("AMP term poster",
                         lambda: amp_poster.run_forever(settings.amp_post_interval_seconds))
        supervisor.start("SSE send watchdog", send_watchdog.run)
        supervisor.every("governance sweeper", max(settings.sweep_interval_seconds, 1.0),
                         governance.sweep_once)
        supervisor.start("stream lease renewer", stream_leases.run)
        supervisor.start("store watch", lambda: _watch_store(storage, outage))
        try:
            yield
        finally:
            await mcp_mount.close()
            await hub.close()
            with contextlib.suppress(*StoreError, OSError):
                await stream_leases.release_all()
            await supervisor.close()
            with contextlib.suppress(*StoreError, OSError):
                await activity.flush()
            await storage.close()
            schema_runner.close()

    app = AbortableApp(
        # Memory first: no other route matches its paths, and it serves most requests.
        routes=[*memory.routes, *system.routes, *agents.routes, *messages.routes, *api_keys.routes,
                *subscribe.routes, *namespaces.routes, *audit.routes, *proposals.routes,
                *amp.routes,
                mcp.route(mcp_mount),
                *(console.routes() if settings.console else [])],
        exception_handlers={
            MempError: _mempe_error,
            Proposed: _proposed,
            HTTPException: _http_error,
            **dict.fromkeys(STORE_DOWN, _store_down),
            CorruptRecord: _corrupt,
        },
        lifespan=lifespan,
    )
    app.router.redirect_slashes = False  # `/v1/keys/` is a 404, not a redirect built from Host
    app.state.settings = settings
    app.state.clock = clock
    app.state.storage = storage
    app.state.metrics = metrics
    app.state.supervisor = supervisor
    app.state.outage = outage
    app.state.store_full = Throttle(logging.getLogger("memp.store"), OUTAGE_LOG_SECONDS)
    app.state.sweeper = sweeper
    app.state.changelog = changelog
    app.state.hub = hub
    app.state.send_watchdog = send_watchdog
    app.state.namespaces = registry
    app.state.amp_cells = amp_cells
    app.state.amp_engine = amp_engine
    app.state.amp_purger = Purger(amp_cells, clock, settings.amp_purge_retention,
                                  audit_service)
    app.state.activity = activity
    app.state.auth = auth
    app.state.audit = audit_service
    app.state.proposals = proposal_service
    app.state.stream_guard = stream_guard
    app.state.memory = memory_service
    app.state.fair_share = fair_share
    app.state.stream_leases = stream_leases
    app.state.agents = agent_service
    app.state.messages = MessageHandler(memory_service, agent_service, clock,
                                        proposal_service)
    app.state.mcp = mcp_mount
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(InternalErrorMiddleware)
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=origins, allow_methods=["*"], max_age=600,
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "If-Match",
                           "If-None-Match", "Last-Event-ID", "X-AMP-Agent-ID", "X-Request-ID"],
            expose_headers=["ETag", "MEMP-Warning", "Retry-After", "X-Request-ID"],
        )
    app.add_middleware(RequestIdMiddleware)  # outermost: every reply and line carries the id
    return app
