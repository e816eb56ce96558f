"""One settings object, read from flags and the environment and validated at start."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from broker.keys import NAMESPACE_RE


class SettingsError(ValueError):
    """A configuration problem, reported as one line at start."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Every tunable of the broker; environment variables are `MEMP_<NAME>` upper-cased."""

    host: str = "127.0.0.1"
    port: int = 8080
    redis_url: str | None = None
    admin_key: str | None = None
    jwt_secret: str | None = None
    jwt_public_key: str | None = None
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    key_env: str = "live"
    max_value_bytes: int = 1024 * 1024
    max_request_bytes: int = 8 * 1024 * 1024
    max_key_bytes: int = 1024
    max_query_limit: int = 1000
    default_query_limit: int = 100
    max_batch: int = 100
    max_ttl_seconds: int = 10 * 365 * 24 * 3600
    history_limit: int = 16
    changelog_maxlen: int = 100_000
    idempotency_window_seconds: int = 300
    sweep_interval_seconds: float = 0.1
    sweep_batch: int = 1000
    max_clock_skew_ms: int = 60_000
    auth_cache_seconds: float = 5.0
    last_seen_flush_seconds: float = 5.0
    redis_timeout_seconds: float = 2.0
    changelog_max_age_seconds: int = 7 * 24 * 3600
    subscriber_queue_size: int = 1000
    heartbeat_seconds: float = 15.0
    sse_retry_ms: int = 2000
    sse_send_timeout_seconds: float = 30.0
    max_stream_patterns: int = 32
    reader_block_ms: int = 1000
    namespace_cache_seconds: float = 5.0
    max_schema_bytes: int = 64 * 1024
    schema_timeout_ms: int = 2000
    amp_namespace: str = "amp"
    amp_lifecycle_interval_seconds: float = 60.0
    amp_post_interval_seconds: float = 0.05
    amp_purge_retention: bool = False
    cors_origins: str = ""

    @property
    def embedded(self) -> bool:
        return not self.redis_url

    def validate(self) -> Settings:
        """Raise SettingsError with a one-line reason when a value cannot work."""
        if not 0 < self.port < 65536:
            raise SettingsError(f"port must be between 1 and 65535, not {self.port}")
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise SettingsError(
                f"MEMP_REDIS_URL must start with redis://, rediss:// or unix://: {self.redis_url!r}"
            )
        positive = (
            "max_value_bytes", "max_request_bytes", "max_key_bytes", "max_query_limit",
            "default_query_limit", "max_batch", "max_ttl_seconds", "changelog_maxlen",
            "sweep_batch", "redis_timeout_seconds", "sweep_interval_seconds",
            "subscriber_queue_size", "heartbeat_seconds", "sse_retry_ms",
            "sse_send_timeout_seconds", "max_stream_patterns", "reader_block_ms",
            "namespace_cache_seconds", "max_schema_bytes", "schema_timeout_ms",
            "amp_lifecycle_interval_seconds",
            "amp_post_interval_seconds",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be positive, not {getattr(self, name)}")
        if self.history_limit < 0 or self.idempotency_window_seconds < 0:
            raise SettingsError("history_limit and idempotency_window_seconds must be >= 0")
        if self.changelog_max_age_seconds < 0:
            raise SettingsError("changelog_max_age_seconds must be >= 0 (0 = no age limit)")
        if self.reader_block_ms >= self.redis_timeout_seconds * 1000:
            raise SettingsError("reader_block_ms must be shorter than redis_timeout_seconds")
        if self.max_key_bytes > 1024:
            raise SettingsError("max_key_bytes cannot exceed the protocol limit of 1024")
        if self.default_query_limit > self.max_query_limit:
            raise SettingsError("default_query_limit cannot exceed max_query_limit")
        if self.max_request_bytes < self.max_value_bytes:
            raise SettingsError("max_request_bytes must be at least max_value_bytes")
        if self.admin_key is not None and len(self.admin_key) < 16:
            raise SettingsError("MEMP_ADMIN_KEY must be at least 16 characters")
        if self.jwt_secret is not None and len(self.jwt_secret) < 32:
            raise SettingsError("MEMP_JWT_SECRET must be at least 32 characters")
        if not NAMESPACE_RE.fullmatch(self.amp_namespace):
            raise SettingsError(f"amp_namespace {self.amp_namespace!r} is not a namespace")
        if not self.key_env.isalnum():
            raise SettingsError("key_env must be alphanumeric")
        return self

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> Settings:
        """Build settings from `MEMP_*` variables; keyword overrides (flags) win."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in fields(cls):
            raw = environ.get(f"MEMP_{field.name.upper()}")
            if raw is None or raw == "":
                continue
            values[field.name] = _convert(field.name, field.type, raw)
        values["amp_purge_retention"] = environ.get("AMP_PURGE_RETENTION") == "1"
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        if settings.jwt_public_key and not settings.jwt_public_key.lstrip().startswith("-----"):
            path = Path(settings.jwt_public_key)
            if not path.is_file():
                raise SettingsError(f"MEMP_JWT_PUBLIC_KEY is neither a PEM key nor a file: {path}")
            settings = replace(settings, jwt_public_key=path.read_text())
        if settings.jwt_public_key:
            _check_public_key(settings.jwt_public_key)
        return settings.validate()


def _check_public_key(pem: str) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(pem.encode())
    except ValueError:
        raise SettingsError("MEMP_JWT_PUBLIC_KEY is not a readable PEM public key") from None
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise SettingsError("MEMP_JWT_PUBLIC_KEY must be an RSA or EC public key")


def _convert(name: str, kind: object, raw: str) -> Any:
    kind_text = str(kind)
    try:
        if kind_text.startswith("int"):
            return int(raw)
        number = float(raw) if kind_text.startswith("float") else None
    except ValueError:
        raise SettingsError(f"MEMP_{name.upper()} must be a number, not {raw!r}") from None
    if number is None:
        return raw
    if not math.isfinite(number):
        raise SettingsError(f"MEMP_{name.upper()} must be a finite number, not {raw!r}")
    return number
