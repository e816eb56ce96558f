"""MEMP SDK: `from memp import MEMP` — shared, versioned memory for AI agents."""

from memp._version import __version__
from memp.aclient import AsyncMEMP, AsyncQueryResult
from memp.client import MEMP, QueryResult
from memp.errors import (
    ConflictError,
    ConnectionFailed,
    Forbidden,
    InvalidRequest,
    MempError,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    RateLimited,
    SchemaViolation,
    SchemaViolationWarning,
    Unauthorized,
    Unavailable,
)
from memp.models import (
    Agent,
    ApiKey,
    Conflict,
    CreatedKey,
    Credentials,
    Entry,
    Event,
    Grant,
    Page,
    SchemaError,
)
from memp.subscription import AsyncSubscription, Subscription

__all__ = [
    "MEMP",
    "Agent",
    "ApiKey",
    "AsyncMEMP",
    "AsyncQueryResult",
    "AsyncSubscription",
    "Conflict",
    "ConflictError",
    "ConnectionFailed",
    "CreatedKey",
    "Credentials",
    "Entry",
    "Event",
    "Forbidden",
    "Grant",
    "InvalidRequest",
    "MempError",
    "NotFound",
    "Page",
    "PayloadTooLarge",
    "PreconditionFailed",
    "QueryResult",
    "RateLimited",
    "SchemaError",
    "SchemaViolation",
    "SchemaViolationWarning",
    "Subscription",
    "Unauthorized",
    "Unavailable",
    "__version__",
]
