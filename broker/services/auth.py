"""Who the caller is and what it may do: API keys, JWTs, the admin key, and grants; and what
a new key may carry (its grants, the agent it is bound to), for the API and the CLI alike."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

import jwt
import msgspec
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from broker.core.errors import MempError
from broker.core.grammar import NAMESPACE_GLOB_RE, glob_covers, glob_match
from broker.core.models import ApiKeyRecord, Grant, Permission
from broker.runtime.settings import Settings
from broker.services.flights import Flights
from broker.services.identities import ADMIN, check_claimable, is_reserved
from broker.storage.accounts import AccountStore

API_KEY_PREFIX = "memp_sk_"
_ALL: list[Permission] = ["read", "write", "subscribe", "admin"]


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its grants and, when bound to one, its agent."""

    subject: str
    grants: tuple[Grant, ...]
    agent_id: str | None = None
    key_id: str | None = None
    superuser: bool = False
    expires_at: float | None = None  # a JWT's `exp` (Unix seconds)
    request_id: str = ""  # the request's X-Request-ID (or message id), for the audit log

    @property
    def writer_id(self) -> str:
        """What a write records as its author: the bound agent, else the credential."""
        return self.agent_id or self.subject

    def can(self, permission: str, namespace: str) -> bool:
        if self.superuser:
            return True
        return any(
            (permission in g.permissions or "admin" in g.permissions)
            and glob_match(g.namespace, namespace)
            for g in self.grants
        )

    def require(self, permission: str, namespace: str) -> None:
        if not self.can(permission, namespace):
            raise MempError(
                "forbidden",
                f"this token has no {permission} permission on namespace {namespace!r}",
                {"namespace": namespace, "permission": permission},
            )

    def covers(self, grant: Grant) -> bool:
        """True when this caller administers everything `grant` would hand out."""
        if self.superuser:
            return True
        return any("admin" in g.permissions and glob_covers(g.namespace, grant.namespace)
                   for g in self.grants)

    def delegated_grants(self, namespace: str, amp_namespace: str) -> list[Grant]:
        """Grants for an agent this caller registers: its own, without admin (an admin grant
        hands out read, write, subscribe and amp), and `amp` on the AMP namespace when this
        caller may use AMP there (AMP's own policy then decides, cell by cell)."""
        if self.superuser:
            return [Grant(namespace, ["read", "write", "subscribe"]),
                    Grant(amp_namespace, ["amp"])]
        grants = []
        for g in self.grants:
            permissions: list[Permission] = [p for p in g.permissions if p != "admin"]
            if "admin" in g.permissions:
                permissions = ["read", "write", "subscribe", "amp"]
            if permissions:
                grants.append(Grant(g.namespace, sorted(set(permissions))))
        return grants


def hash_api_key(api_key: str) -> str:
    """SHA-256 is enough: keys carry 256 random bits, so there is nothing to brute-force."""
    return hashlib.sha256(api_key.encode()).hexdigest()


def new_api_key(env: str) -> str:
    return f"{API_KEY_PREFIX}{env}_{secrets.token_urlsafe(32)}"


def new_key_id() -> str:
    return f"key_{secrets.token_hex(8)}"


def _unauthorized(message: str) -> MempError:
    return MempError("unauthorized", message, headers={"WWW-Authenticate": 'Bearer realm="memp"'})


class _JWTVerifier:
    """Verifies JWTs. The algorithm allow-list follows the configured key, never the token's
    header, so an HS256 token cannot be checked against a public key (algorithm confusion) and
    `alg: none` is never accepted."""

    def __init__(self, settings: Settings) -> None:
        self.keys: dict[str, Any] = {}
        if settings.jwt_secret:
            self.keys["HS256"] = settings.jwt_secret
        if settings.jwt_public_key:
            public = load_pem_public_key(settings.jwt_public_key.encode())
            if isinstance(public, rsa.RSAPublicKey):
                self.keys["RS256"] = public
            elif isinstance(public, ec.EllipticCurvePublicKey):
                self.keys["ES256"] = public
            else:
                raise ValueError("MEMP_JWT_PUBLIC_KEY must be an RSA or EC public key")
        self.audience = settings.jwt_audience
        self.issuer = settings.jwt_issuer

    def verify(self, token: str) -> dict[str, Any]:
        try:
            alg = jwt.get_unverified_header(token).get("alg")
        except jwt.InvalidTokenError:
            raise _unauthorized("malformed token") from None
        key = self.keys.get(alg) if isinstance(alg, str) else None
        if key is None or not isinstance(alg, str):
            raise _unauthorized(f"token algorithm {alg!r} is not accepted")
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=[alg], audience=self.audience, issuer=self.issuer,
                options={"require": ["exp"], "verify_aud": self.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise _unauthorized("token has expired") from None
        except jwt.ImmatureSignatureError:
            raise _unauthorized("token is not valid yet") from None
        except jwt.InvalidTokenError as exc:
            raise _unauthorized(f"invalid token: {exc}") from None
        return claims



class Authenticator:
    """Turns an Authorization header into a Principal, caching API key look-ups briefly."""

    def __init__(self, settings: Settings, store: AccountStore) -> None:
        self.store = store
        self.admin_key = settings.admin_key
        self.cache_seconds = settings.auth_cache_seconds
        self.jwt = _JWTVerifier(settings) if (settings.jwt_secret or settings.jwt_public_key) \
            else None
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._lookups: Flights[str, Principal | None] = Flights()

    async def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise _unauthorized("missing Authorization: Bearer token")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthorized("Authorization must be 'Bearer <token>'")
        if self.admin_key and hmac.compare_digest(token.encode(), self.admin_key.encode()):
            return Principal(subject=ADMIN, grants=(Grant("*", list(_ALL)),), superuser=True)
        cached = self._cache.get(token)
        if cached is not None and cached[0] > time.monotonic():
            principal = cached[1]
        else:
            principal = await self._lookups.load(
                token, lambda: self._resolve(token),
                lambda found: self._keep(token, found))
        if principal is None:
            raise _unauthorized("unknown or revoked API key")
        return principal

    def _keep(self, token: str, principal: Principal | None) -> None:
        if len(self._cache) > 10_000:
            self._cache.clear()
        ttl = self.cache_seconds if principal is not None else min(self.cache_seconds, 1.0)
        self._cache[token] = (time.monotonic() + ttl, principal)

    def forget(self) -> None:
        """Drop cached look-ups (after a key is revoked, here or in another process)."""
        self._cache.clear()
        self._lookups.invalidate()

    async def live_keys(self, key_ids: set[str]) -> set[str]:
        """Those of these API key ids that are not revoked."""
        return await self.store.live_api_keys(key_ids) if key_ids else set()

    async def removed_agents(self, agent_ids: set[str]) -> set[str]:
        """Those of these agent ids that were removed (their JWTs no longer authenticate)."""
        return await self.store.removed_agents(agent_ids)

    async def _resolve(self, token: str) -> Principal | None:
        if token.startswith(API_KEY_PREFIX):
            record = await self.store.load_api_key(hash_api_key(token))
            if record is None:
                return None
            return Principal(subject=record.id, grants=tuple(record.grants),
                             agent_id=record.agent_id, key_id=record.id)
        if token.count(".") == 2 and self.jwt is not None:
            principal = _principal_from_claims(self.jwt.verify(token))
            if principal.agent_id and await self.store.removed_agents({principal.agent_id}):
                raise _unauthorized(f"the agent {principal.agent_id!r} was removed")
            return principal
        raise _unauthorized("token is neither a MEMP API key nor an accepted JWT")


def _principal_from_claims(claims: dict[str, Any]) -> Principal:
    try:
        grants = msgspec.convert(claims.get("grants", []), list[Grant])
    except msgspec.ValidationError as exc:
        raise _unauthorized(f"invalid grants claim: {exc}") from None
    subject = claims.get("sub")
    agent_id = subject if isinstance(subject, str) and subject else None
    if agent_id is not None and not (len(agent_id) <= _MAX_SUBJECT and agent_id.isprintable()):
        # It becomes the author of writes and part of Redis keys: no control characters, no
        # lone surrogates (not UTF-8), nothing unbounded.
        raise _unauthorized(f"the token's subject must be 1-{_MAX_SUBJECT} printable characters")
    if agent_id is not None and is_reserved(agent_id):
        raise _unauthorized(f"the token's subject {agent_id!r} is a reserved identity")
    expires = claims.get("exp")
    return Principal(subject=f"jwt:{agent_id or 'anonymous'}", grants=tuple(grants),
                     agent_id=agent_id,
                     expires_at=float(expires) if isinstance(expires, int | float) else None)


async def create_api_key(store: AccountStore, env: str, *, grants: list[Grant], name: str,
                         agent_id: str | None, created_by: str, now: int
                         ) -> tuple[str, ApiKeyRecord]:
    """Create and store a key; the plain key is returned once and never stored. The name is
    cut to 200 characters."""
    api_key = new_api_key(env)
    record = ApiKeyRecord(id=new_key_id(), name=name[:200], grants=grants, agent_id=agent_id,
                          created_at=now, created_by=created_by)
    await save_api_key(store, api_key, record)
    return api_key, record


async def save_api_key(store: AccountStore, api_key: str, record: ApiKeyRecord) -> None:
    """Store a key's record under its hash (again, for a registration run again)."""
    await store.save_api_key(hash_api_key(api_key), record)


def check_grants(grants: list[Grant]) -> list[Grant]:
    """Grants name namespace globs and at least one permission each."""
    if not grants:
        raise MempError("invalid_request", "a key needs at least one grant")
    for grant in grants:
        if not NAMESPACE_GLOB_RE.fullmatch(grant.namespace):
            raise MempError("invalid_namespace",
                            f"grant namespace {grant.namespace!r} is not a namespace glob")
        if not grant.permissions:
            raise MempError("invalid_request", "every grant needs at least one permission")
    return grants


_MAX_SUBJECT = 256
_AGENT_ID_RE = re.compile(r"[A-Za-z0-9._:@+-]{1,128}")


async def check_binding(principal: Principal, store: AccountStore, agent_id: str) -> str:
    """A key may act as an agent only if its creator could: the full admin binds any id the
    broker does not reserve; a namespace admin binds only agents registered in a namespace it
    administers."""
    if not _AGENT_ID_RE.fullmatch(agent_id):
        raise MempError("invalid_request", "agent_id must be 1-128 characters of A-Z a-z 0-9 "
                        ". _ : @ + -", {"field": "agent_id"})
    check_claimable(agent_id)
    if await store.removed_agents({agent_id}):
        raise MempError("forbidden", f"agent {agent_id!r} was removed and cannot be bound again",
                        {"agent_id": agent_id})
    if principal.superuser:
        return agent_id
    home = await store.agent_home(agent_id)
    if home is None or not principal.can("admin", home):
        raise MempError("forbidden", "a key can be bound only to an agent registered in a "
                        "namespace this token administers", {"agent_id": agent_id})
    return agent_id
