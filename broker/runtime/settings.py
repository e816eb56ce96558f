"""One settings object, read from flags and the environment and validated at start.

Every setting `MEMP_<NAME>` may instead be given as `MEMP_<NAME>_FILE`, the path of a file
holding the value (Docker and Kubernetes secrets, systemd credentials); never both."""

from __future__ import annotations

import functools
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from broker.core.grammar import NAMESPACE_RE
from broker.core.nesting import DEFAULT_MAX_DEPTH, MAX_DEPTH_SETTING
from broker.storage import urls


class SettingsError(ValueError):
    """A configuration problem, reported as one line at start."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Every tunable of the broker; environment variables are `MEMP_<NAME>` upper-cased."""

    host: str = "127.0.0.1"
    port: int = 8080
    # Secrets (a Redis URL may hold a password) are kept out of repr, and so out of logs.
    redis_url: str | None = field(default=None, repr=False)
    # None: 1 on Sentinel and Cluster URLs (replicated topologies), 0 on one server.
    write_replicas: int | None = None
    write_replicas_timeout_ms: int = 1000
    tls_cert: str | None = None
    tls_key: str | None = None
    admin_key: str | None = field(default=None, repr=False)
    jwt_secret: str | None = field(default=None, repr=False)
    jwt_public_key: str | None = None
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    key_env: str = "live"
    max_value_bytes: int = 1024 * 1024
    max_request_bytes: int = 8 * 1024 * 1024
    max_registration_bytes: int = 64 * 1024
    max_key_creation_bytes: int = 64 * 1024
    max_config_bytes: int = 256 * 1024
    max_amp_body_bytes: int = 256 * 1024
    max_key_bytes: int = 1024
    # How deep any JSON a tenant sends may nest (broker/core/nesting.py, docs/security.md).
    max_json_depth: int = DEFAULT_MAX_DEPTH
    max_query_limit: int = 1000
    default_query_limit: int = 100
    max_query_scan: int = 10_000
    max_batch: int = 100
    max_ttl_seconds: int = 10 * 365 * 24 * 3600
    history_limit: int = 16
    max_history_limit: int = 1000
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
    subscriber_queue_bytes: int = 16 * 1024 * 1024
    heartbeat_seconds: float = 15.0
    sse_retry_ms: int = 2000
    sse_send_timeout_seconds: float = 30.0
    max_stream_patterns: int = 32
    reader_block_ms: int = 1000
    namespace_cache_seconds: float = 5.0
    max_schema_bytes: int = 64 * 1024
    schema_timeout_ms: int = 2000
    schema_check_timeout_ms: int = 15_000  # a 64 KiB schema of tiny subschemas takes ~4 s
    amp_namespace: str = "amp"
    amp_lifecycle_interval_seconds: float = 60.0
    amp_post_interval_seconds: float = 0.05
    amp_purge_retention: bool = False
    # Recall by meaning (docs/amp.md): `builtin` (weights installed with the broker), `openai`
    # (an OpenAI-compatible /v1/embeddings at embeddings_url) or `none` (keyword search only).
    embedder: str = "builtin"
    embeddings_url: str = ""
    embeddings_model: str = ""
    embeddings_api_key: str | None = field(default=None, repr=False)
    embeddings_timeout_seconds: float = 5.0
    amp_embed_interval_seconds: float = 0.05
    cors_origins: str = ""
    # Fair share (docs/limits.md): every agent's own rates per namespace, and a cap on each
    # credential's open streams; 0 = none. Bursts default to the rate.
    agent_writes_per_second: float = 0.0
    agent_write_burst: int = 0
    agent_reads_per_second: float = 0.0
    agent_read_burst: int = 0
    max_streams_per_token: int = 0
    stream_lease_seconds: float = 30.0
    rate_limit_hold_ms: int = 1000  # a flood over its rate gets its 429s this late, at most
    proposal_ttl_seconds: int = 7 * 24 * 3600
    proposal_retention_seconds: int = 7 * 24 * 3600  # how long a closed proposal is kept
    max_pending_proposals: int = 1000  # per namespace (docs/limits.md); 0 = none
    audit_retention_seconds: int = 30 * 24 * 3600  # 0: keep every audit record
    # Connections (broker/runtime/connections.py, docs/security.md): request heads and deadlines.
    max_head_bytes: int = 64 * 1024
    max_header_line_bytes: int = 16 * 1024
    max_header_fields: int = 100
    head_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 30.0
    keep_alive_seconds: int = 5
    # The review console at /console (docs/console.md): static files, off with MEMP_CONSOLE=0.
    console: bool = True

    @property
    def embedded(self) -> bool:
        return not self.redis_url

    @property
    def replicas_to_confirm(self) -> int:
        """`MEMP_WRITE_REPLICAS`, or its default: 1 where the URL names a replicated topology
        (Sentinel, Cluster), where an acknowledgement should mean more than "on one node";
        0 on one server and the embedded store."""
        if self.write_replicas is not None:
            return self.write_replicas
        if self.redis_url and urls.parse(self.redis_url).kind in ("sentinel", "cluster"):
            return 1
        return 0

    @property
    def production(self) -> bool:
        """Production mode: a Redis is configured, so data outlives the process and other
        processes share it. The broker then never makes up an admin key, let alone prints one."""
        return not self.embedded

    def validate(self) -> Settings:
        """Raise SettingsError with a one-line reason when a value cannot work."""
        _check_bounds(self)
        if self.redis_url:
            try:
                urls.parse(self.redis_url)
            except urls.UrlError as exc:
                raise SettingsError(str(exc)) from None
        if ((self.write_replicas is not None and self.write_replicas < 0)
                or self.write_replicas_timeout_ms <= 0):
            raise SettingsError("write_replicas must be >= 0 and write_replicas_timeout_ms "
                                "positive")
        if self.write_replicas and not self.redis_url:
            raise SettingsError("MEMP_WRITE_REPLICAS needs MEMP_REDIS_URL: the embedded store "
                                "has no replicas")
        positive = (
            "max_value_bytes", "max_request_bytes", "max_registration_bytes",
            "max_key_creation_bytes", "max_config_bytes", "max_amp_body_bytes", "max_key_bytes",
            "max_query_limit", "default_query_limit", "max_query_scan", "max_batch",
            "max_ttl_seconds", "max_history_limit", "changelog_maxlen",
            "sweep_batch", "redis_timeout_seconds", "sweep_interval_seconds",
            "subscriber_queue_size", "subscriber_queue_bytes", "heartbeat_seconds", "sse_retry_ms",
            "sse_send_timeout_seconds", "max_stream_patterns", "reader_block_ms",
            "namespace_cache_seconds", "max_schema_bytes", "schema_timeout_ms",
            "schema_check_timeout_ms", "amp_lifecycle_interval_seconds",
            "amp_post_interval_seconds", "amp_embed_interval_seconds",
            "embeddings_timeout_seconds", "proposal_ttl_seconds", "proposal_retention_seconds",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be positive, not {getattr(self, name)}")
        for name in ("agent_writes_per_second", "agent_reads_per_second"):
            if 0 < getattr(self, name) < 0.001:
                raise SettingsError(f"{name} must be 0 (no limit) or at least 0.001")
        if self.history_limit > self.max_history_limit:
            raise SettingsError("history_limit cannot exceed max_history_limit")
        if self.reader_block_ms >= self.redis_timeout_seconds * 1000:
            raise SettingsError("reader_block_ms must be shorter than redis_timeout_seconds")
        if self.max_key_bytes > 1024:
            raise SettingsError("max_key_bytes cannot exceed the protocol limit of 1024")
        if self.default_query_limit > self.max_query_limit:
            raise SettingsError("default_query_limit cannot exceed max_query_limit")
        if self.max_header_line_bytes > self.max_head_bytes:
            raise SettingsError("max_header_line_bytes cannot exceed max_head_bytes")
        if self.max_request_bytes < self.max_value_bytes:
            raise SettingsError("max_request_bytes must be at least max_value_bytes")
        if self.tls_key and not self.tls_cert:
            raise SettingsError("MEMP_TLS_KEY is set without MEMP_TLS_CERT, the certificate "
                                "it belongs to")
        if self.admin_key is not None and len(self.admin_key) < 16:
            raise SettingsError("MEMP_ADMIN_KEY must be at least 16 characters")
        if self.jwt_secret is not None and len(self.jwt_secret) < 32:
            raise SettingsError("MEMP_JWT_SECRET must be at least 32 characters")
        if not NAMESPACE_RE.fullmatch(self.amp_namespace):
            raise SettingsError(f"amp_namespace {self.amp_namespace!r} is not a namespace")
        if self.embedder not in ("builtin", "openai", "none"):
            raise SettingsError(f"embedder must be builtin, openai or none, not "
                                f"{self.embedder!r}")
        if self.embedder == "openai" and not (self.embeddings_url and self.embeddings_model):
            raise SettingsError("MEMP_EMBEDDER=openai needs MEMP_EMBEDDINGS_URL and "
                                "MEMP_EMBEDDINGS_MODEL")
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
        for name, kind in _field_types().items():
            variable = f"MEMP_{name.upper()}"
            raw = _variable(environ, variable)
            if raw is not None and raw != "":
                values[name] = _parse(variable, kind, raw)
        retention = _purge_retention(environ)
        if retention is not None:
            values["amp_purge_retention"] = retention
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


# Bounds of the settings that may be 0 or have a ceiling: (lowest, what the lowest means,
# highest; None for no ceiling).
_BOUNDS: dict[str, tuple[float, str, float | None]] = {
    "port": (1, "", 65535),
    "max_json_depth": (1, "", MAX_DEPTH_SETTING),
    **{name: (0, " (no limit)", 1_000_000) for name in (
        "agent_writes_per_second", "agent_write_burst", "agent_reads_per_second",
        "agent_read_burst", "max_streams_per_token", "max_pending_proposals")},
    "rate_limit_hold_ms": (0, " (off)", 10_000),
    "max_head_bytes": (1024, "", 1024 * 1024),
    "max_header_line_bytes": (256, "", 1024 * 1024),
    "max_header_fields": (8, "", 10_000),
    "head_timeout_seconds": (0.1, "", 3600),
    "body_timeout_seconds": (0.1, "", 3600),
    "keep_alive_seconds": (1, "", 3600),
    "stream_lease_seconds": (3, "", 3600),
    "history_limit": (0, "", None),
    "idempotency_window_seconds": (0, "", None),
    "audit_retention_seconds": (0, " (0 = keep every record)", None),
    "changelog_max_age_seconds": (0, " (0 = no age limit)", None),
}


def _check_bounds(settings: Settings) -> None:
    """Raise SettingsError for the first setting outside its `_BOUNDS`."""
    for name, (lowest, meaning, highest) in _BOUNDS.items():
        value = getattr(settings, name)
        if highest is None and value < lowest:
            raise SettingsError(f"{name} must be >= {lowest}{meaning}, not {value}")
        if highest is not None and not lowest <= value <= highest:
            raise SettingsError(f"{name} must be between {lowest}{meaning} and {highest}, "
                                f"not {value}")


def _check_public_key(pem: str) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(pem.encode())
    except ValueError:
        raise SettingsError("MEMP_JWT_PUBLIC_KEY is not a readable PEM public key") from None
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise SettingsError("MEMP_JWT_PUBLIC_KEY must be an RSA or EC public key")


# Settings whose value is a path already: `MEMP_TLS_CERT_FILE` would read the certificate
# itself as the path, so it is refused with the variable to use instead.
_PATH_SETTINGS = frozenset({"MEMP_TLS_CERT", "MEMP_TLS_KEY"})


def _variable(environ: Mapping[str, str], variable: str) -> str | None:
    """`variable`'s value, or the content of the file `<variable>_FILE` names, stripped (a
    mounted secret usually ends in a newline). Both set stops the start: which one was meant
    would be a guess."""
    path = environ.get(f"{variable}_FILE")
    if not path:
        return environ.get(variable)
    if variable in _PATH_SETTINGS:
        raise SettingsError(f"{variable} is a path already: set {variable}={path}, "
                            f"not {variable}_FILE")
    if environ.get(variable):
        raise SettingsError(f"{variable} and {variable}_FILE are both set; set one of them")
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise SettingsError(f"{variable}_FILE: cannot read {path}: {reason}") from None
    if not text:
        raise SettingsError(f"{variable}_FILE: {path} is empty")
    return text


_INT_RE = re.compile(r"[+-]?[0-9]{1,30}")  # no setting needs more digits
_BOOLS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@functools.cache
def _field_types() -> dict[str, object]:
    """Each field's declared type, `X | None` unwrapped to `X` (an empty variable is unset)."""
    hints = typing.get_type_hints(Settings)
    declared: dict[str, object] = {}
    for setting in fields(Settings):
        kind = hints[setting.name]
        if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
            kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
        declared[setting.name] = kind
    return declared


def _parse(variable: str, kind: object, raw: str) -> Any:
    """One environment value, parsed by its field's declared type."""
    text = raw.strip()
    if kind is bool:
        if text.lower() not in _BOOLS:
            raise SettingsError(f"{variable} must be one of 1, 0, true, false, yes, no, "
                                f"not {raw!r}")
        return _BOOLS[text.lower()]
    if kind is int:
        if not _INT_RE.fullmatch(text):
            raise SettingsError(f"{variable} must be a whole number, not {raw!r}")
        return int(text)
    if kind is float:
        try:
            number = float(text)
        except ValueError:
            raise SettingsError(f"{variable} must be a number, not {raw!r}") from None
        if not math.isfinite(number):
            raise SettingsError(f"{variable} must be a finite number, not {raw!r}")
        return number
    if kind is str:
        return raw
    raise TypeError(f"{variable}: settings of type {kind!r} cannot be read from the environment")


def _purge_retention(environ: Mapping[str, str]) -> bool | None:
    """AMP's own `AMP_PURGE_RETENTION` and `MEMP_AMP_PURGE_RETENTION` mean the same; when both
    are set they must agree, since one silently winning could erase cells nobody meant to."""
    raw = {name: _variable(environ, name)
           for name in ("AMP_PURGE_RETENTION", "MEMP_AMP_PURGE_RETENTION")}
    given = {name: _parse(name, bool, text) for name, text in raw.items() if text}
    if len(set(given.values())) > 1:
        raise SettingsError(
            f"AMP_PURGE_RETENTION={raw['AMP_PURGE_RETENTION']!r} and "
            f"MEMP_AMP_PURGE_RETENTION={raw['MEMP_AMP_PURGE_RETENTION']!r} disagree; "
            "set one of them")
    return next(iter(given.values()), None)
