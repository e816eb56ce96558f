"""create_app(settings): builds the broker's parts once (`Services`), declares its background
loops in one list, and serves them: the routes, the error handlers, the middleware and the
lifespan that starts and stops everything."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware

from broker.amp.duplicates import NearDuplicates
from broker.amp.embedders import open_embedder
from broker.amp.embedding import CellEmbedding
from broker.amp.lifecycle import LifecycleEngine, Purger
from broker.amp.merge import CellMerger
from broker.amp.nearest import NearestCells
from broker.amp.poster import TermPoster
from broker.amp.recall import Recall
from broker.amp.service import CellService
from broker.amp.visibility import CellVisibility
from broker.core.clock import Clock, system_clock
from broker.governance.gate import ProposalGate
from broker.governance.proposals import ProposalService
from broker.governance.sweeper import ExpirySweeper, GovernanceSweeper
from broker.mcp import mount as mcp
from broker.runtime.logs import RequestIdMiddleware, Throttle
from broker.runtime.metrics import Metrics, MetricsMiddleware
from broker.runtime.settings import Settings
from broker.runtime.supervisor import Backoff, Supervised, Supervisor
from broker.schemas.runner import SchemaRunner
from broker.services.activity import AgentActivity
from broker.services.agents import AgentService
from broker.services.audit import AuditService
from broker.services.auth import Authenticator
from broker.services.failures import Failures
from broker.services.limits import FairShare
from broker.services.memory import MemoryService
from broker.services.namespaces import NamespaceRegistry
from broker.storage import Storage
from broker.storage.amp_merge import CellMergeStore
from broker.storage.client import STORE_DOWN, StoreError
from broker.streaming.changes import ChangeLog
from broker.streaming.hub import Hub
from broker.streaming.invalidations import InvalidationListener
from broker.streaming.leases import StreamLeases
from broker.streaming.revocation import StreamGuard
from broker.web import errors, frames
from broker.web.console import routes as console
from broker.web.http import InternalErrorMiddleware
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
from broker.web.services import Services
from broker.web.sse import AbortableApp, SendWatchdog

if TYPE_CHECKING:
    from broker.mcp.server import McpServer


def build(settings: Settings, clock: Clock, storage: Storage) -> Services:
    """Every part of one broker process, each made once and handed what it uses."""
    failures = Failures()
    # Store errors that mean it is out of reach are expected: a warning, not a traceback, and
    # one a period while it lasts (the outage throttle), then a line when the store is back.
    supervisor = Supervisor(transient=(*STORE_DOWN, OSError), throttle=failures.throttle)
    metrics = Metrics()
    storage.observe(metrics)
    activity = AgentActivity(storage.accounts)
    audit_service = AuditService(storage.audit, clock, storage.entries.namespaces)
    schema_runner = SchemaRunner(settings.schema_timeout_ms / 1000)
    registry = NamespaceRegistry(storage.config, settings.namespace_cache_seconds,
                                 runner=schema_runner)
    auth = Authenticator(settings, storage.accounts)
    fair_share = FairShare(settings, storage.fair_share, metrics, clock)
    # AMP's read policy for its namespace, and the gate that gated writes go through: the core
    # is handed both and imports neither.
    cell_visibility = CellVisibility(settings.amp_namespace)
    approvals = ProposalGate(storage.proposals, registry, fair_share, clock,
                             settings.proposal_ttl_seconds, settings.max_pending_proposals)
    memory_service = MemoryService(settings, storage.entries, registry, activity, clock,
                                   cell_visibility, fair_share, approvals)
    agent_service = AgentService(settings, storage.accounts, activity, clock, audit_service)
    amp_cells = CellService(storage.cells(settings.amp_namespace), clock, fair_share, registry,
                            approvals)
    embedder = open_embedder(settings)
    vectors = storage.vectors(settings.amp_namespace)
    nearest = NearestCells(vectors, embedder.model, metrics) if embedder is not None else None
    recall = Recall(vectors, embedder, nearest)
    proposal_service = ProposalService(storage.proposals, memory_service, amp_cells, clock)
    changelog = ChangeLog(storage.changes, cell_visibility, frames.change)
    stream_guard = StreamGuard(auth, registry, supervisor)
    return Services(
        settings=settings, clock=clock, storage=storage, metrics=metrics, failures=failures,
        supervisor=supervisor, schema_runner=schema_runner,
        auth=auth, namespaces=registry, activity=activity, audit=audit_service,
        fair_share=fair_share, memory=memory_service, agents=agent_service,
        messages=MessageHandler(memory_service, agent_service, clock, proposal_service,
                                failures),
        proposals=proposal_service, amp_cells=amp_cells,
        amp_merger=CellMerger(amp_cells, CellMergeStore(amp_cells.index)),
        amp_engine=LifecycleEngine(amp_cells, clock),
        amp_purger=Purger(amp_cells, clock, settings.amp_purge_retention, audit_service),
        amp_poster=TermPoster(amp_cells.index),
        amp_recall=recall,
        amp_duplicates=NearDuplicates(amp_cells, recall),
        amp_embedding=CellEmbedding(amp_cells.index, vectors, embedder, clock, metrics),
        changelog=changelog,
        hub=Hub(changelog, settings.reader_block_ms, settings.redis_timeout_seconds * 2,
                supervisor),
        stream_guard=stream_guard,
        stream_leases=StreamLeases(settings, fair_share, registry, supervisor, clock),
        listener=InvalidationListener(registry, auth, stream_guard, settings.reader_block_ms),
        send_watchdog=SendWatchdog(settings.sse_send_timeout_seconds),
        sweeper=ExpirySweeper(storage.entries, clock, settings.sweep_interval_seconds,
                              settings.sweep_batch, settings.changelog_max_age_seconds * 1000),
        governance=GovernanceSweeper(storage.entries, proposal_service, storage.audit, clock,
                                     settings.audit_retention_seconds * 1000,
                                     settings.proposal_retention_seconds * 1000),
    )


def loops(s: Services) -> list[Supervised]:
    """The process's background loops, each under the supervisor (docs/design.md,
    "Background loops run under one supervisor"); the hub starts its readers itself."""
    settings = s.settings
    return [
        Supervised("expiry sweeper", s.sweeper.run),
        Supervised("last-seen flusher", s.activity.flush, every=settings.last_seen_flush_seconds),
        # Revocations must reach every process within 2 s: it tries again at least every 1 s.
        Supervised("invalidation listener", lambda: s.listener.listen(s.storage),
                   backoff=Backoff(cap=1.0)),
        Supervised("stream guard", s.stream_guard.run),
        Supervised("AMP lifecycle engine", lambda: s.amp_engine.run_forever(
            settings.amp_lifecycle_interval_seconds, s.metrics.amp_pass)),
        Supervised("AMP term poster",
                   lambda: s.amp_poster.run_forever(settings.amp_post_interval_seconds)),
        Supervised("AMP embedder", lambda: s.amp_embedding.run_forever(
            settings.amp_embed_interval_seconds)),
        *([Supervised("AMP vector index", s.amp_recall.index.run_forever)]
          if s.amp_recall.index is not None else []),
        Supervised("SSE send watchdog", s.send_watchdog.run),
        Supervised("governance sweeper", s.governance.sweep_once,
                   every=max(settings.sweep_interval_seconds, 1.0)),
        Supervised("stream lease renewer", s.stream_leases.run),
        Supervised("store watch", lambda: _watch_store(s.storage, s.failures.outage)),
        # Writes move to a new Sentinel primary within a second of its announcement.
        *([Supervised("sentinel follower", s.storage.follow_failovers,
                      backoff=Backoff(cap=1.0))] if s.storage.follows_failovers else []),
    ]


async def _watch_store(storage: Storage, outage: Throttle) -> None:
    """While the store is out of reach, ping it each second; say so once it answers."""
    while True:
        await asyncio.sleep(1.0)
        if outage.failing:
            await storage.ping()
            outage.recovered("the store is reachable again")


def _mcp(s: Services) -> mcp.McpMount:
    """`/mcp`, whose server is built on its first request."""

    def server() -> McpServer:
        # Imported here: only once /mcp is first used (broker/mcp/mount.py).
        from broker.mcp.resources import Resources
        from broker.mcp.server import McpServer
        from broker.mcp.tools import Toolbox
        from broker.mcp.watch import Watcher

        return McpServer(Toolbox(s.memory, s.amp_cells, s.agents, s.amp_recall, s.amp_merger),
                         Resources(s.memory),
                         Watcher(s.settings, s.hub, s.namespaces, s.memory, s.stream_guard,
                                 s.stream_leases),
                         s.settings.max_request_bytes, s.failures)

    return mcp.McpMount(s.auth, server)


def create_app(settings: Settings, *, clock: Clock = system_clock,
               storage: Storage | None = None) -> Starlette:
    """Build the broker. `storage` may be passed in (tests); otherwise it is opened from
    settings."""
    storage = storage or Storage.open(
        settings.redis_url, timeout=settings.redis_timeout_seconds,
        history_limit=settings.history_limit, changelog_maxlen=settings.changelog_maxlen,
        idempotency_window_ms=settings.idempotency_window_seconds * 1000,
        write_replicas=settings.replicas_to_confirm,
        write_replicas_timeout_ms=settings.write_replicas_timeout_ms,
    )
    s = build(settings, clock, storage)
    mcp_mount = _mcp(s)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await storage.ping()
            await storage.upgrade()
        except StoreError as exc:
            s.failures.outage.failure("store not reachable at start (%s); serving 503 until "
                                      "it is", exc)
        s.supervisor.start_all(loops(s))
        try:
            yield
        finally:
            await mcp_mount.close()
            await s.hub.close()
            with contextlib.suppress(*StoreError, OSError):
                await s.stream_leases.release_all()
            await s.supervisor.close()
            if s.amp_recall.embedder is not None:
                await s.amp_recall.embedder.close()
            with contextlib.suppress(*StoreError, OSError):
                await s.activity.flush()
            await storage.close()
            s.schema_runner.close()

    app = AbortableApp(
        # Memory first: no other route matches its paths, and it serves most requests.
        routes=[*memory.routes, *system.routes, *agents.routes, *messages.routes, *api_keys.routes,
                *subscribe.routes, *namespaces.routes, *audit.routes, *proposals.routes,
                *amp.routes,
                mcp.route(mcp_mount),
                *(console.routes() if settings.console else [])],
        exception_handlers=errors.handlers(),
        lifespan=lifespan,
    )
    app.router.redirect_slashes = False  # `/v1/keys/` is a 404, not a redirect built from Host
    app.state.services = s
    app.add_middleware(MetricsMiddleware, metrics=s.metrics)
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
