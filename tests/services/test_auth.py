"""Authentication and authorisation over real HTTP, on both backends: API keys, the admin key,
JWTs, namespace grants, permissions and the binding of registered agents to their writes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from broker.services.auth import hash_api_key
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, data_client, start_broker
from tests.support.clients import assert_error, create_key
from tests.support.stored import stored

JWT_SECRET = "jwt-secret-for-tests-0123456789-abcdef"
OTHER_SECRET = "another-secret-for-tests-0123456789-xyz"


# ---- helpers ----


def register(client: httpx.Client, ns: str, name: str = "agent") -> dict[str, Any]:
    response = client.post("/v1/agents", json={"name": name, "namespace": ns,
                                               "framework": "custom"})
    assert response.status_code == 201, response.text
    registration: dict[str, Any] = response.json()
    return registration


def put(client: httpx.Client, ns: str, key: str, value: object) -> httpx.Response:
    return client.put(f"/v1/namespaces/{ns}/memory/{key}", json={"value": value})


def get(client: httpx.Client, ns: str, key: str) -> httpx.Response:
    return client.get(f"/v1/namespaces/{ns}/memory/{key}")


def bearer(broker: Broker, authorization: str | None) -> httpx.Client:
    headers = {"Authorization": authorization} if authorization is not None else {}
    return httpx.Client(base_url=broker.url, headers=headers, timeout=15)


# ---- the Authorization header ----


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(None, id="missing-header"),
        pytest.param("", id="empty-header"),
        pytest.param(f"Basic {base64.b64encode(b'admin:' + ADMIN_KEY.encode()).decode()}",
                     id="basic-scheme"),
        pytest.param(f"Token {ADMIN_KEY}", id="token-scheme"),
        pytest.param(ADMIN_KEY, id="no-scheme"),
        pytest.param("Bearer", id="bearer-without-token"),
        pytest.param(f"Bearer{ADMIN_KEY}", id="no-space"),
        pytest.param("Bearer memp_sk_live_" + "A" * 43, id="unknown-api-key"),
        pytest.param("Bearer not-a-token-at-all", id="opaque-garbage"),
        pytest.param(f"Bearer {ADMIN_KEY}x", id="admin-key-plus-one"),
        pytest.param(f"Bearer {ADMIN_KEY[:-1]}", id="admin-key-minus-one"),
        pytest.param("Bearer a.b.c", id="jwt-shaped-without-jwt-config"),
    ],
)
def test_bad_credentials_are_refused(broker: Broker, admin: httpx.Client, ns: str,
                                     authorization: str | None) -> None:
    put(admin, ns, "k", "kept")
    with bearer(broker, authorization) as client:
        assert_error(get(client, ns, "k"), 401, "unauthorized")
        assert_error(put(client, ns, "k", "overwritten"), 401, "unauthorized")
        assert_error(client.get("/v1/keys"), 401, "unauthorized")
    entry = get(admin, ns, "k").json()
    assert (entry["value"], entry["version"]) == ("kept", 1)


def test_health_endpoints_need_no_token(broker: Broker) -> None:
    with bearer(broker, None) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200


def test_admin_key_is_a_full_admin(broker: Broker, ns: str) -> None:
    with bearer(broker, f"bearer {ADMIN_KEY}") as client:  # the scheme is case-insensitive
        assert put(client, ns, "any/key", 1).status_code == 201
        assert put(client, f"{ns}-elsewhere", "k", 2).status_code == 201
        assert client.get(f"/v1/namespaces/{ns}/memory", params={"pattern": "*"}).json()[
            "entries"][0]["agent_id"] == "admin"
        api_key, _ = create_key(client, ("*", ["read", "write", "subscribe", "admin"]))
        assert client.get("/v1/keys").status_code == 200
    with bearer(broker, f"Bearer {api_key}") as client:
        assert get(client, f"{ns}-elsewhere", "k").json()["value"] == 2


def test_unknown_api_key_writes_nothing(broker: Broker, admin: httpx.Client, ns: str) -> None:
    with bearer(broker, "Bearer memp_sk_live_" + secrets.token_urlsafe(32)) as client:
        assert_error(put(client, ns, "k", 1), 401, "unauthorized")
    assert_error(get(admin, ns, "k"), 404, "not_found")


# ---- API keys ----


def test_revoked_key_is_refused_at_once(broker: Broker, admin: httpx.Client, ns: str) -> None:
    api_key, key_id = create_key(admin, (ns, ["read", "write"]))
    with bearer(broker, f"Bearer {api_key}") as client:
        assert put(client, ns, "k", 1).status_code == 201  # now cached by the authenticator
        revoked = admin.delete(f"/v1/keys/{key_id}")
        assert revoked.status_code == 204
        assert_error(put(client, ns, "k", 2), 401, "unauthorized")
        assert_error(get(client, ns, "k"), 401, "unauthorized")
    assert key_id not in [k["id"] for k in admin.get("/v1/keys").json()["keys"]]
    assert_error(admin.delete(f"/v1/keys/{key_id}"), 404, "not_found")
    assert get(admin, ns, "k").json()["version"] == 1


def test_api_keys_look_like_memp_keys(admin: httpx.Client, ns: str) -> None:
    api_key, key_id = create_key(admin, (ns, ["read"]))
    assert api_key.startswith("memp_sk_")
    listed = {k["id"]: k for k in admin.get("/v1/keys").json()["keys"]}
    assert listed[key_id]["grants"] == [{"namespace": ns, "permissions": ["read"]}]
    assert api_key not in json.dumps(listed)


def _sync_redis(broker: Broker, redis_url: str) -> Any:
    """A synchronous client on the broker's own data (the same fakeredis server when embedded)."""
    return data_client(broker.app)


def _everything_stored(client: Any) -> bytes:
    """Every key name and value in the database, concatenated."""
    return b"\n".join(part if isinstance(part, bytes) else str(part).encode()
                      for _, key, values in stored(client) for part in (key, *values))


def test_api_keys_are_stored_hashed(broker: Broker, admin: httpx.Client, ns: str,
                                    redis_url: str) -> None:
    api_key, _ = create_key(admin, (ns, ["read", "write"]))
    agent_key = register(admin, ns)["credentials"]["api_key"]
    client = _sync_redis(broker, redis_url)
    try:
        stored = _everything_stored(client)
    finally:
        client.close()
    for plain in (api_key, agent_key):
        secret_part = plain.split("_", 3)[3]  # memp_sk_<env>_<secret>
        assert plain.encode() not in stored
        assert secret_part.encode() not in stored
        assert hash_api_key(plain).encode() in stored  # we looked in the right place


# ---- namespace grants and permissions ----


def test_key_for_one_namespace_is_forbidden_on_another(broker: Broker, admin: httpx.Client,
                                                       ns: str) -> None:
    crm, support = f"{ns}-crm", f"{ns}-support"
    put(admin, support, "ticket/1", "secret")
    api_key, _ = create_key(admin, (crm, ["read", "write", "subscribe"]))
    with bearer(broker, f"Bearer {api_key}") as client:
        assert put(client, crm, "customer/1", "mine").status_code == 201
        assert get(client, crm, "customer/1").status_code == 200
        assert_error(get(client, support, "ticket/1"), 403, "forbidden")
        assert_error(put(client, support, "ticket/1", "stolen"), 403, "forbidden")
        assert_error(client.delete(f"/v1/namespaces/{support}/memory/ticket/1"), 403,
                     "forbidden")
        assert_error(client.get(f"/v1/namespaces/{support}/memory", params={"pattern": "*"}),
                     403, "forbidden")
        assert_error(client.get(f"/v1/namespaces/{support}/history/ticket/1"), 403,
                     "forbidden")
        assert_error(client.get(f"/v1/namespaces/{support}/agents"), 403, "forbidden")
        message = client.post("/v1/messages", json={
            "memp": "1.0", "type": "memory.get", "namespace": support, "key": "ticket/1"})
        assert message.status_code == 403
        assert message.json()["error"]["code"] == "forbidden"
        assert "value" not in message.text
    entry = get(admin, support, "ticket/1").json()
    assert (entry["value"], entry["version"]) == ("secret", 1)


def test_glob_grant_covers_matching_namespaces_only(broker: Broker, admin: httpx.Client,
                                                    ns: str) -> None:
    api_key, _ = create_key(admin, (f"{ns}-*", ["read", "write"]))
    with bearer(broker, f"Bearer {api_key}") as client:
        for namespace in (f"{ns}-crm", f"{ns}-support", f"{ns}-a.b"):
            assert put(client, namespace, "k", namespace).status_code == 201
            assert get(client, namespace, "k").json()["value"] == namespace
        assert_error(put(client, ns, "k", 1), 403, "forbidden")
        assert_error(put(client, f"x{ns}-crm", "k", 1), 403, "forbidden")


def test_read_only_key_cannot_write(broker: Broker, admin: httpx.Client, ns: str) -> None:
    put(admin, ns, "k", "kept")
    api_key, _ = create_key(admin, (ns, ["read"]))
    with bearer(broker, f"Bearer {api_key}") as client:
        assert get(client, ns, "k").json()["value"] == "kept"
        assert client.get(f"/v1/namespaces/{ns}/memory", params={"pattern": "*"}
                          ).status_code == 200
        assert_error(put(client, ns, "k", "changed"), 403, "forbidden")
        assert_error(put(client, ns, "new", 1), 403, "forbidden")
        assert_error(client.delete(f"/v1/namespaces/{ns}/memory/k"), 403, "forbidden")
        assert_error(client.post("/v1/agents", json={"name": "a", "namespace": ns}), 403,
                     "forbidden")
        message = client.post("/v1/messages", json={
            "memp": "1.0", "type": "memory.put", "namespace": ns, "key": "k", "value": 9})
        assert message.status_code == 403
        assert message.json()["error"]["code"] == "forbidden"
        assert_error(client.post("/v1/keys", json={
            "grants": [{"namespace": ns, "permissions": ["read"]}]}), 403, "forbidden")
    entry = get(admin, ns, "k").json()
    assert (entry["value"], entry["version"]) == ("kept", 1)
    assert_error(get(admin, ns, "new"), 404, "not_found")
    assert admin.get(f"/v1/namespaces/{ns}/agents").json()["agents"] == []


def test_write_only_key_cannot_read(broker: Broker, admin: httpx.Client, ns: str) -> None:
    api_key, _ = create_key(admin, (ns, ["write"]))
    with bearer(broker, f"Bearer {api_key}") as client:
        assert put(client, ns, "k", "written").status_code == 201
        assert_error(get(client, ns, "k"), 403, "forbidden")
        assert_error(client.get(f"/v1/namespaces/{ns}/memory", params={"pattern": "*"}), 403,
                     "forbidden")
        assert_error(client.get(f"/v1/namespaces/{ns}/history/k"), 403, "forbidden")
        assert_error(client.get(f"/v1/namespaces/{ns}/agents"), 403, "forbidden")
        message = client.post("/v1/messages", json={
            "memp": "1.0", "type": "memory.get", "namespace": ns, "key": "k"})
        assert message.status_code == 403
        assert "written" not in message.text
    assert get(admin, ns, "k").json()["value"] == "written"


# ---- creating keys ----


def test_key_creation_needs_admin_covering_the_grants(broker: Broker, admin: httpx.Client,
                                                      ns: str) -> None:
    tenant_admin, _ = create_key(admin, (f"{ns}-*", ["admin"]))
    plain_writer, _ = create_key(admin, (f"{ns}-crm", ["read", "write"]))
    with bearer(broker, f"Bearer {tenant_admin}") as client:
        made, made_id = create_key(client, (f"{ns}-crm", ["read"]))
        create_key(client, (f"{ns}-sub*", ["write"]))  # a narrower glob is covered too
        for grants in (
            [{"namespace": f"{ns}x", "permissions": ["read"]}],
            [{"namespace": "*", "permissions": ["read"]}],
            [{"namespace": f"{ns}*", "permissions": ["read"]}],
            [{"namespace": f"{ns}-crm", "permissions": ["read"]},
             {"namespace": "elsewhere", "permissions": ["read"]}],
        ):
            assert_error(client.post("/v1/keys", json={"grants": grants}), 403, "forbidden")
        assert made_id in [k["id"] for k in client.get("/v1/keys").json()["keys"]]
    with bearer(broker, f"Bearer {plain_writer}") as client:
        assert_error(client.post("/v1/keys", json={
            "grants": [{"namespace": f"{ns}-crm", "permissions": ["read"]}]}), 403, "forbidden")
        assert_error(client.get("/v1/keys"), 403, "forbidden")
    with bearer(broker, f"Bearer {made}") as client:
        assert put(admin, f"{ns}-crm", "k", 1).status_code == 201
        assert get(client, f"{ns}-crm", "k").status_code == 200
        assert_error(put(client, f"{ns}-crm", "k", 2), 403, "forbidden")


# ---- JWTs ----


@pytest.fixture(scope="module")
def signing_keys() -> dict[str, Any]:
    """An RSA and an EC P-256 key pair, with the public halves as PEM text."""
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())

    def pem(key: Any) -> str:
        return str(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())

    return {"RS256": rsa_key, "ES256": ec_key, "RS256-pem": pem(rsa_key),
            "ES256-pem": pem(ec_key)}


@pytest.fixture(scope="module", params=BACKENDS)
def jwt_brokers(request: pytest.FixtureRequest, redis_url: str,
                signing_keys: dict[str, Any]) -> Iterator[dict[str, Broker]]:
    """Brokers configured for one JWT algorithm each: HS256, RS256 and ES256.

    Module-scoped (started once per backend with conftest's start_broker, as broker_factory
    does) so the JWT cases do not start two dozen brokers."""
    brokers = {
        "HS256": start_broker(request.param, redis_url, jwt_secret=JWT_SECRET),
        "RS256": start_broker(request.param, redis_url,
                              jwt_public_key=signing_keys["RS256-pem"]),
        "ES256": start_broker(request.param, redis_url,
                              jwt_public_key=signing_keys["ES256-pem"]),
    }
    yield brokers
    for handle in brokers.values():
        handle.stop()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def b64json(obj: object) -> str:
    return b64url(json.dumps(obj, separators=(",", ":")).encode())


def claims(ns: str, **extra: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {
        "sub": "jwt-agent-7", "iat": now, "exp": now + 300,
        "grants": [{"namespace": ns, "permissions": ["read", "write"]}],
    }
    base.update(extra)
    return {k: v for k, v in base.items() if v is not None}


def hs256_by_hand(payload: dict[str, Any], secret: bytes, header: dict[str, Any] | None = None
                  ) -> str:
    signing_input = f"{b64json(header or {'alg': 'HS256', 'typ': 'JWT'})}.{b64json(payload)}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(signature)}"


@pytest.mark.parametrize("alg", ["HS256", "RS256", "ES256"])
def test_jwt_with_grants_is_accepted(jwt_brokers: dict[str, Broker],
                                     signing_keys: dict[str, Any], ns: str, alg: str) -> None:
    broker = jwt_brokers[alg]
    key = JWT_SECRET if alg == "HS256" else signing_keys[alg]
    token = jwt.encode(claims(ns), key, algorithm=alg)
    with bearer(broker, f"Bearer {token}") as client:
        written = put(client, ns, "k", alg)
        assert written.status_code == 201, written.text
        assert written.json()["agent_id"] == "jwt-agent-7"
        assert get(client, ns, "k").json()["value"] == alg
        assert_error(put(client, f"{ns}-other", "k", 1), 403, "forbidden")
        assert_error(client.get("/v1/keys"), 403, "forbidden")


def _refused_tokens() -> list[Any]:
    def alg_none(alg: str) -> Callable[[str, dict[str, Any]], str]:
        return lambda ns, keys: f"{b64json({'alg': alg, 'typ': 'JWT'})}.{b64json(claims(ns))}."

    def tampered(ns: str, keys: dict[str, Any]) -> str:
        header, _, signature = jwt.encode(claims(ns), JWT_SECRET, algorithm="HS256").split(".")
        wider = claims(ns, grants=[{"namespace": "*", "permissions": ["admin"]}])
        return f"{header}.{b64json(wider)}.{signature}"

    def bad_signature(alg: str) -> Callable[[str, dict[str, Any]], str]:
        def build(ns: str, keys: dict[str, Any]) -> str:
            header, payload, signature = jwt.encode(claims(ns), keys[alg], algorithm=alg
                                                    ).split(".")
            raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
            raw[len(raw) // 2] ^= 0x01
            return f"{header}.{payload}.{b64url(bytes(raw))}"
        return build

    def foreign_key(alg: str) -> Callable[[str, dict[str, Any]], str]:
        def build(ns: str, keys: dict[str, Any]) -> str:
            other = rsa.generate_private_key(public_exponent=65537, key_size=2048) \
                if alg == "RS256" else ec.generate_private_key(ec.SECP256R1())
            return jwt.encode(claims(ns), other, algorithm=alg)
        return build

    def confusion(alg: str) -> Callable[[str, dict[str, Any]], str]:
        # HS256 "signed" with the broker's own public key as the HMAC secret: accepted by a
        # verifier that lets the token's header pick the algorithm for a given key.
        return lambda ns, keys: hs256_by_hand(claims(ns), keys[f"{alg}-pem"].encode())

    def hs(**extra: Any) -> Callable[[str, dict[str, Any]], str]:
        return lambda ns, keys: jwt.encode(claims(ns, **extra), JWT_SECRET, algorithm="HS256")

    now = int(time.time())
    return [
        pytest.param("HS256", alg_none("none"), id="alg-none"),
        pytest.param("HS256", alg_none("None"), id="alg-None"),
        pytest.param("RS256", alg_none("none"), id="alg-none-rs256-broker"),
        pytest.param("HS256", hs(exp=now - 60), id="expired"),
        pytest.param("HS256", hs(nbf=now + 3600), id="nbf-in-the-future"),
        pytest.param("HS256", hs(exp=None), id="missing-exp"),
        pytest.param("HS256", hs(grants="everything"), id="grants-not-a-list"),
        pytest.param("HS256", lambda ns, keys: jwt.encode(claims(ns), OTHER_SECRET,
                                                          algorithm="HS256"), id="wrong-secret"),
        pytest.param("HS256", tampered, id="tampered-payload"),
        pytest.param("RS256", bad_signature("RS256"), id="rs256-bad-signature"),
        pytest.param("ES256", bad_signature("ES256"), id="es256-bad-signature"),
        pytest.param("RS256", foreign_key("RS256"), id="rs256-other-key"),
        pytest.param("ES256", foreign_key("ES256"), id="es256-other-key"),
        pytest.param("RS256", confusion("RS256"), id="hs256-signed-with-rsa-public-key"),
        pytest.param("ES256", confusion("ES256"), id="hs256-signed-with-ec-public-key"),
        pytest.param("RS256", lambda ns, keys: jwt.encode(claims(ns), keys["ES256"],
                                                          algorithm="ES256"),
                     id="es256-on-rs256-broker"),
        pytest.param("HS256", lambda ns, keys: jwt.encode(claims(ns), keys["RS256"],
                                                          algorithm="RS256"),
                     id="rs256-on-hs256-broker"),
        pytest.param("HS256", lambda ns, keys: "eyJhbGciOiJIUzI1NiJ9.!!!.???",
                     id="malformed"),
        # a subject naming one of the broker's own identities would be attributed its writes
        pytest.param("HS256", hs(sub="admin"), id="sub-admin"),
        pytest.param("HS256", hs(sub="ADMIN"), id="sub-admin-upper-case"),
        pytest.param("HS256", hs(sub="amp-lifecycle"), id="sub-amp-engine"),
        pytest.param("HS256", hs(sub="key_0123456789abcdef"), id="sub-an-api-key-id"),
        pytest.param("HS256", hs(sub="jwt:anonymous"), id="sub-jwt-prefixed"),
        # a subject is an identity written into records, keys and events: printable text only
        pytest.param("HS256", hs(sub="\ud800"), id="sub-lone-surrogate"),
        pytest.param("HS256", hs(sub="a\x00b"), id="sub-nul"),
        pytest.param("HS256", hs(sub="a\r\nb"), id="sub-crlf"),
        pytest.param("HS256", hs(sub="x" * 257), id="sub-too-long"),
    ]


@pytest.mark.parametrize(("alg", "make_token"), _refused_tokens())
def test_bad_jwt_is_refused(jwt_brokers: dict[str, Broker], signing_keys: dict[str, Any],
                            ns: str, alg: str,
                            make_token: Callable[[str, dict[str, Any]], str]) -> None:
    broker = jwt_brokers[alg]
    token = make_token(ns, signing_keys)
    with broker.client() as admin:
        put(admin, ns, "k", "kept")
    with bearer(broker, f"Bearer {token}") as client:
        assert_error(put(client, ns, "k", "overwritten"), 401, "unauthorized")
        assert_error(put(client, ns, "new", 1), 401, "unauthorized")
        assert_error(get(client, ns, "k"), 401, "unauthorized")
    with broker.client() as admin:
        entry = get(admin, ns, "k").json()
        assert (entry["value"], entry["version"]) == ("kept", 1)
        assert_error(get(admin, ns, "new"), 404, "not_found")


# ---- agents: registration binds requests to the agent ----


def test_writes_record_the_registered_agent(broker: Broker, admin: httpx.Client,
                                            ns: str) -> None:
    registration = register(admin, ns, "support-bot")
    agent, credentials = registration["agent"], registration["credentials"]
    assert credentials["agent_id"] == agent["id"]
    with bearer(broker, f"Bearer {credentials['api_key']}") as client:
        assert put(client, ns, "rest", 1).json()["agent_id"] == agent["id"]
        ack = client.post("/v1/messages", json={
            "memp": "1.0", "type": "memory.put", "id": "m-1", "namespace": ns,
            "agent_id": agent["id"], "key": "message", "value": 2})
        assert ack.status_code == 200, ack.text
        assert ack.json()["entry"]["agent_id"] == agent["id"]
        anonymous = client.post("/v1/messages", json={
            "memp": "1.0", "type": "memory.put", "namespace": ns, "key": "plain", "value": 3})
        assert anonymous.json()["entry"]["agent_id"] == agent["id"]
        deleted = client.delete(f"/v1/namespaces/{ns}/memory/rest")
        assert deleted.json()["agent_id"] == agent["id"]
        assert_error(put(client, f"{ns}-other", "k", 1), 403, "forbidden")
    for key in ("message", "plain"):
        assert get(admin, ns, key).json()["agent_id"] == agent["id"]
    versions = admin.get(f"/v1/namespaces/{ns}/history/rest").json()["versions"]
    assert [v["agent_id"] for v in versions] == [agent["id"], agent["id"]]


def test_agent_cannot_claim_to_be_another_agent(broker: Broker, admin: httpx.Client,
                                                ns: str) -> None:
    alice = register(admin, ns, "alice")
    bob = register(admin, ns, "bob")
    put(admin, ns, "shared", "original")
    with bearer(broker, f"Bearer {alice['credentials']['api_key']}") as client:
        for message in (
            {"type": "memory.put", "key": "shared", "value": "as bob"},
            {"type": "memory.put", "key": "fresh", "value": "as bob"},
            {"type": "memory.delete", "key": "shared"},
        ):
            spoofed = client.post("/v1/messages", json={
                "memp": "1.0", "namespace": ns, "agent_id": bob["agent"]["id"], **message})
            assert spoofed.status_code == 403, spoofed.text
            assert spoofed.json()["type"] == "error"
            assert spoofed.json()["error"]["code"] == "forbidden"
        batch = client.post("/v1/messages", json=[
            {"memp": "1.0", "type": "memory.put", "namespace": ns,
             "agent_id": bob["agent"]["id"], "key": "batch/spoofed", "value": 1},
            {"memp": "1.0", "type": "memory.put", "namespace": ns,
             "agent_id": alice["agent"]["id"], "key": "batch/honest", "value": 2},
        ])
        assert batch.status_code == 200
        replies = batch.json()
        assert replies[0]["type"] == "error" and replies[0]["error"]["code"] == "forbidden"
        assert replies[1]["type"] == "ack"
    shared = get(admin, ns, "shared").json()
    assert (shared["value"], shared["version"], shared["agent_id"]) == ("original", 1, "admin")
    assert_error(get(admin, ns, "fresh"), 404, "not_found")
    assert_error(get(admin, ns, "batch/spoofed"), 404, "not_found")
    assert get(admin, ns, "batch/honest").json()["agent_id"] == alice["agent"]["id"]


def test_registered_agent_is_readable(broker: Broker, admin: httpx.Client, ns: str) -> None:
    registration = register(admin, ns, "reader")
    agent = registration["agent"]
    assert agent["namespace"] == ns and agent["framework"] == "custom"
    with bearer(broker, f"Bearer {registration['credentials']['api_key']}") as client:
        got = client.get(f"/v1/namespaces/{ns}/agents/{agent['id']}")
        assert got.status_code == 200 and got.json()["id"] == agent["id"]
        listed = client.get(f"/v1/namespaces/{ns}/agents").json()["agents"]
        assert [a["id"] for a in listed] == [agent["id"]]
        assert_error(client.get(f"/v1/namespaces/{ns}-other/agents"), 403, "forbidden")


@pytest.mark.parametrize("backend", BACKENDS)
def test_last_seen_is_flushed_periodically(broker_factory: Callable[..., Broker], ns: str,
                                           backend: str) -> None:
    broker = broker_factory(backend, last_seen_flush_seconds=0.2)
    with broker.client() as admin:
        registration = register(admin, ns)
        agent = registration["agent"]
        url = f"/v1/namespaces/{ns}/agents/{agent['id']}"
        with bearer(broker, f"Bearer {registration['credentials']['api_key']}") as client:
            deadline = time.monotonic() + 15
            last_seen = agent["last_seen"]
            while last_seen <= agent["last_seen"] and time.monotonic() < deadline:
                time.sleep(0.05)
                assert put(client, ns, "heartbeat", time.time()).status_code in (200, 201)
                last_seen = admin.get(url).json()["last_seen"]
        assert last_seen > agent["last_seen"], "last_seen never rose"
        assert admin.get(url).json()["created_at"] == agent["created_at"]
