"""The objects a request reaches, in one typed `Services` that `create_app` builds
(broker/app.py) and keeps on the app; routes get it with `services(request)`."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from broker.amp.duplicates import NearDuplicates
from broker.amp.embedding import CellEmbedding
from broker.amp.lifecycle import LifecycleEngine, Purger
from broker.amp.merge import CellMerger
from broker.amp.poster import TermPoster
from broker.amp.recall import Recall
from broker.amp.service import CellService
from broker.core.clock import Clock
from broker.governance.proposals import ProposalService
from broker.governance.sweeper import ExpirySweeper, GovernanceSweeper
from broker.runtime.metrics import Metrics
from broker.runtime.settings import Settings
from broker.runtime.supervisor import Supervisor
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
from broker.streaming.changes import ChangeLog
from broker.streaming.hub import Hub
from broker.streaming.invalidations import InvalidationListener
from broker.streaming.leases import StreamLeases
from broker.streaming.revocation import StreamGuard
from broker.web.messages import MessageHandler
from broker.web.sse import SendWatchdog


@dataclass(frozen=True, slots=True)
class Services:
    """One broker process's parts, each made once: the store and the process around it, the
    MEMP services, streaming, governance, the AMP bridge and the background jobs."""

    settings: Settings
    clock: Clock
    storage: Storage
    metrics: Metrics
    failures: Failures
    supervisor: Supervisor
    schema_runner: SchemaRunner
    # the MEMP services
    auth: Authenticator
    namespaces: NamespaceRegistry
    activity: AgentActivity
    audit: AuditService
    fair_share: FairShare
    memory: MemoryService
    agents: AgentService
    messages: MessageHandler
    # governance and the AMP bridge
    proposals: ProposalService
    amp_cells: CellService
    amp_merger: CellMerger
    amp_engine: LifecycleEngine
    amp_purger: Purger
    amp_poster: TermPoster
    amp_recall: Recall
    amp_embedding: CellEmbedding
    amp_duplicates: NearDuplicates
    # streaming
    changelog: ChangeLog
    hub: Hub
    stream_guard: StreamGuard
    stream_leases: StreamLeases
    listener: InvalidationListener
    send_watchdog: SendWatchdog
    # sweepers
    sweeper: ExpirySweeper
    governance: GovernanceSweeper


def services(request: Request) -> Services:
    """The services of the app serving `request`."""
    found: Services = request.app.state.services
    return found
