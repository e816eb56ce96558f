"""Error codes and their one JSON shape: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

from typing import Any

import msgspec

STATUS_BY_CODE: dict[str, int] = {
    "invalid_request": 400,
    "invalid_json": 400,
    "invalid_key": 400,
    "invalid_namespace": 400,
    "invalid_pattern": 400,
    "invalid_ttl": 400,
    "invalid_schema": 400,
    "invalid_timestamp": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "write_conflict": 409,
    "precondition_failed": 412,
    "payload_too_large": 413,
    "uri_too_long": 414,
    "unsupported_media_type": 415,
    "schema_violation": 422,
    "idempotency_key_reused": 422,
    "schema_timeout": 422,
    "rate_limited": 429,
    "quota_exceeded": 429,
    "headers_too_large": 431,
    "internal": 500,
    "corrupt_record": 500,
    "unavailable": 503,
}


class MempError(Exception):
    """An error the broker reports to the client with a code and an HTTP status."""

    def __init__(
        self,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if code not in STATUS_BY_CODE:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return STATUS_BY_CODE[self.code]

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}

    def encode(self) -> bytes:
        return msgspec.json.encode(self.body())


def corrupt_record(exc: Exception) -> MempError:
    """The 500 for a stored record that cannot be decoded (storage's CorruptRecord): it names
    the record, so an operator can repair or delete it; other records are unaffected."""
    record = getattr(exc, "record", "") or str(exc)
    return MempError("corrupt_record", f"a stored record cannot be read: {exc}",
                     {"record": record})


def unavailable(reason: str = "the store is unreachable",
                details: dict[str, Any] | None = None) -> MempError:
    """The 503 every request gets while Redis cannot be reached (or cannot confirm a write)."""
    return MempError("unavailable", reason, details, headers={"Retry-After": "1"})
