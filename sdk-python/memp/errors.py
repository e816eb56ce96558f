"""One exception per broker error code, all under `MempError`, keeping the broker's message."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from memp.models import Entry, SchemaError


class MempError(Exception):
    """An error from the broker (`code`, `status`, `message`, `details` as it sent them), or
    from reaching it (`code` "connection_error", `status` None)."""

    def __init__(self, message: str, *, code: str = "internal", status: int | None = None,
                 details: dict[str, Any] | None = None, request_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.details: dict[str, Any] = details or {}
        self.request_id = request_id  # the broker's id of the request, to quote in a report

    def __str__(self) -> str:
        status = f" {self.status}" if self.status is not None else ""
        return f"{self.code}{status}: {self.message}"

    @property
    def field(self) -> str | None:
        """The request field the broker names as wrong (`details.field`, e.g. on `/amp`)."""
        field = self.details.get("field")
        return field if isinstance(field, str) else None


class ApprovalPending(MempError):
    """202: the write needs a reviewer's approval and was not applied; `proposal` is the
    pending proposal (`memp.Proposal`), which `proposals.get(id)` follows."""

    def __init__(self, proposal: Any) -> None:
        super().__init__(f"{proposal.key} awaits approval as proposal {proposal.id}",
                         code="approval_pending", status=202, details={"id": proposal.id})
        self.proposal = proposal


class InvalidRequest(MempError):
    """400 (or 414, 415, 431): the request is malformed (`code` says which check:
    invalid_key, invalid_ttl, invalid_schema, ..., headers_too_large)."""


class Unauthorized(MempError):
    """401: missing, unknown, revoked, expired or forged token."""


class Forbidden(MempError):
    """403: the token lacks the permission on that namespace (e.g. `admin` to configure it)."""


class NotFound(MempError):
    """404: no such entry, agent, key, schema or endpoint."""


class ConflictError(MempError):
    """409 write_conflict: a newer write is stored (`winner` is that entry), or an AMP cell's
    status forbids the change (`cell_status`: archived cells are read-only, and only they may
    be deleted)."""

    @property
    def winner(self) -> Entry | None:
        return _entry_detail(self.details.get("winner"))

    @property
    def cell_status(self) -> str | None:
        status = self.details.get("status")
        return status if isinstance(status, str) else None


class PreconditionFailed(MempError):
    """412: `if_version` / `if_absent` did not hold (`current_version` is the stored version),
    or `if_revision` on a namespace configuration (`current_revision` is the stored one)."""

    @property
    def current_version(self) -> int | None:
        version = self.details.get("current_version")
        return version if isinstance(version, int) else None

    @property
    def current(self) -> Entry | None:
        return _entry_detail(self.details.get("current"))

    @property
    def current_revision(self) -> int | None:
        revision = self.details.get("current_revision")
        return revision if isinstance(revision, int) else None


class PayloadTooLarge(MempError):
    """413: value, body or batch over the broker's limit."""


class SchemaViolation(MempError):
    """422: the value does not conform to an enforcing JSON Schema; nothing was written."""

    @property
    def errors(self) -> list[SchemaError]:
        try:
            return msgspec.convert(self.details.get("errors") or [], list[SchemaError])
        except msgspec.ValidationError:
            return []


class RateLimited(MempError):
    """429 rate_limited: the agent's or the namespace's rate is spent (`scope`); nothing was
    written. `retry_after` is how many seconds to wait. The SDK retries by itself when the
    wait is within its backoff cap, and raises this otherwise."""

    @property
    def retry_after(self) -> float | None:
        wait = self.details.get("retry_after_ms")
        if isinstance(wait, int):
            return wait / 1000
        wait = self.details.get("retry_after")
        return float(wait) if isinstance(wait, int | float) else None

    @property
    def scope(self) -> str | None:
        scope = self.details.get("scope")
        return scope if isinstance(scope, str) else None


class QuotaExceeded(MempError):
    """429 quota_exceeded: the write (or stream, or proposal) would take the namespace past
    `limit` (`max_keys`, `max_bytes`, `max_streams`, `max_streams_per_token`,
    `max_pending_proposals`); `used` of `maximum` are in use. Nothing was written; waiting
    does not help, deleting (or deciding proposals) does. Never retried."""

    @property
    def limit(self) -> str | None:
        limit = self.details.get("limit")
        return limit if isinstance(limit, str) else None

    @property
    def used(self) -> int | None:
        used = self.details.get("used")
        return used if isinstance(used, int) else None

    @property
    def maximum(self) -> int | None:
        maximum = self.details.get("max")
        return maximum if isinstance(maximum, int) else None


class Unavailable(MempError):
    """503: the broker cannot reach its store; safe to retry later."""


class ConnectionFailed(MempError):
    """The broker could not be reached, or the connection broke, after every retry."""


class SchemaViolationWarning(UserWarning):
    """A write was stored but its value does not conform to the namespace's JSON Schema."""


_BY_STATUS: dict[int, tuple[type[MempError], str]] = {
    400: (InvalidRequest, "invalid_request"), 401: (Unauthorized, "unauthorized"),
    403: (Forbidden, "forbidden"), 404: (NotFound, "not_found"),
    409: (ConflictError, "write_conflict"), 412: (PreconditionFailed, "precondition_failed"),
    413: (PayloadTooLarge, "payload_too_large"), 415: (InvalidRequest, "unsupported_media_type"),
    422: (SchemaViolation, "schema_violation"), 429: (RateLimited, "rate_limited"),
    503: (Unavailable, "unavailable"),
}
# The exception for each of the broker's error codes (openapi.yaml's ErrorCode, checked by
# sdk-python/tests/test_models.py); a code from a newer broker falls back to its status.
ERROR_CLASSES: dict[str, type[MempError]] = {
    **dict.fromkeys(("invalid_request", "invalid_json", "invalid_key", "invalid_namespace",
                     "invalid_pattern", "invalid_ttl", "invalid_schema", "invalid_timestamp",
                     "unsupported_media_type", "uri_too_long", "headers_too_large"),
                    InvalidRequest),
    "request_timeout": MempError,
    "unauthorized": Unauthorized, "forbidden": Forbidden, "not_found": NotFound,
    "method_not_allowed": MempError, "write_conflict": ConflictError,
    "precondition_failed": PreconditionFailed, "payload_too_large": PayloadTooLarge,
    "schema_violation": SchemaViolation, "schema_timeout": MempError,
    "idempotency_key_reused": MempError, "rate_limited": RateLimited,
    "quota_exceeded": QuotaExceeded, "internal": MempError, "corrupt_record": MempError,
    "unavailable": Unavailable,
}


def _entry_detail(raw: Any) -> Entry | None:
    if not isinstance(raw, dict):
        return None
    try:
        return msgspec.convert(raw, Entry)
    except msgspec.ValidationError:
        return None


def error_from_body(code: str, message: str, details: dict[str, Any] | None = None,
                    status: int | None = None) -> MempError:
    """The exception for an error the broker reported in a body (a message's reply)."""
    kind = ERROR_CLASSES.get(code, MempError)
    return kind(message, code=code, status=status, details=details or {})


def error_from_response(response: httpx.Response) -> MempError:
    """The exception for a (read) error response, from its `{"error": {...}}` body if any."""
    kind, code = _BY_STATUS.get(response.status_code, (MempError, "internal"))
    message = response.reason_phrase or f"HTTP {response.status_code}"
    details: dict[str, Any] = {}
    request_id = response.headers.get("x-request-id")
    try:
        body = msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        code = str(error.get("code", code))
        message = str(error.get("message", message))
        details = error.get("details") if isinstance(error.get("details"), dict) else {}
        kind = ERROR_CLASSES.get(code, kind)
        if isinstance(error.get("request_id"), str):
            request_id = error["request_id"]
    return kind(message, code=code, status=response.status_code, details=details,
                request_id=request_id)
