"""MCP at /mcp, driven by the `mcp` package's own client over real HTTP, on both wires the
package speaks: the handshake era (`initialize`, `resources/subscribe`) and 2026-07-28
(`server/discover`, `subscriptions/listen`). The same Bearer tokens and grants hold as on
every other route. (`memp mcp`, the stdio transport, is tested in sdk-python/tests.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated

from broker.amp.cells import MAX_POLICY_GLOBS
from broker.mcp.resources import entry_uri, parse_uri
from broker.mcp.tools import TOOLS
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, BrokerProcess
from tests.support.mcp import (
    LEGACY_SUBSCRIBE,
    WAIT,
    call,
    connect,
    open_session,
    raw_tool_call,
    refused,
    register,
    run,
)

MODES = [pytest.param("legacy", id="handshake-era"), pytest.param("auto", id="2026-07-28")]


def key_for(broker: Broker, grants: list[dict[str, Any]]) -> str:
    with broker.client() as admin:
        reply = admin.post("/v1/keys", json={"name": "mcp test", "grants": grants})
        assert reply.status_code == 201, reply.text
        return str(reply.json()["api_key"])


@pytest.mark.parametrize("mode", MODES)
def test_tools_are_listed_with_json_schema_inputs(broker: Broker, mode: str) -> None:
    async def main() -> None:
        async with connect(broker, ADMIN_KEY, mode) as client:
            listed = (await client.list_tools()).tools
            assert [t.name for t in listed] == [
                "memory_put", "memory_get", "memory_query", "memory_delete", "memory_history",
                "amp_remember", "amp_recall", "amp_merge", "amp_forget"]
            for tool in listed:
                schema = tool.input_schema
                assert schema["type"] == "object" and schema["additionalProperties"] is False
                assert len(tool.description or "") > 80, tool.name  # written for a model
                for name, field in schema["properties"].items():
                    assert field.get("description"), f"{tool.name}.{name}"
            put = next(t for t in listed if t.name == "memory_put").input_schema
            assert put["required"] == ["key", "value"]
            assert client.server_info is not None and client.server_info.name == "memp-broker"

    run(main())


@pytest.mark.parametrize("mode", MODES)
def test_write_read_and_query(broker: Broker, ns: str, mode: str) -> None:
    agent_id, token = register(broker, ns)

    async def main() -> None:
        async with connect(broker, token, mode) as client:
            # No namespace: the agent's own.
            entry = await call(client, "memory_put", key="customer/42",
                               value={"plan": "pro", "seats": 3})
            assert (entry["namespace"], entry["version"], entry["agent_id"]) == (ns, 1, agent_id)
            again = await call(client, "memory_put", key="customer/42", namespace=ns,
                               value={"plan": "team"}, if_version=1)
            assert again["version"] == 2
            assert (await call(client, "memory_get", key="customer/42"))["value"] == \
                {"plan": "team"}
            await call(client, "memory_put", key="customer/7", value=[1, "two", None])
            page = await call(client, "memory_query", pattern="customer/*")
            assert [e["key"] for e in page["entries"]] == ["customer/42", "customer/7"]
            assert page["next_cursor"] is None
            first = await call(client, "memory_query", pattern="customer/*", limit=1)
            assert [e["key"] for e in first["entries"]] == ["customer/42"]
            rest = await call(client, "memory_query", pattern="customer/*",
                              cursor=first["next_cursor"])
            assert [e["key"] for e in rest["entries"]] == ["customer/7"]
            history = await call(client, "memory_history", key="customer/42")
            assert [v["version"] for v in history["versions"]] == [2, 1]
            gone = await call(client, "memory_delete", key="customer/7")
            assert gone["deleted"] is True and gone["version"] == 2
            missing = await refused(client, "memory_get", key="customer/7")
            assert missing["code"] == "not_found"
            stale = await refused(client, "memory_put", key="customer/42", value=1,
                                  if_version=1)
            assert stale["code"] == "precondition_failed"
            assert stale["details"]["current_version"] == 2

            # Every entry is a resource; a template lists a pattern.
            contents = (await client.read_resource(entry_uri(ns, "customer/42"))).contents
            assert isinstance(contents[0], types.TextResourceContents)
            assert (contents[0].text, contents[0].mime_type) == ('{"plan":"team"}',
                                                                 "application/json")
            assert contents[0].meta is not None and contents[0].meta["memp"]["version"] == 2
            listing = (await client.read_resource(f"memp://{ns}?pattern=customer/*")).contents
            assert isinstance(listing[0], types.TextResourceContents)
            assert '"key":"customer/42"' in listing[0].text
            listed = (await client.list_resources()).resources
            assert [r.uri for r in listed] == [f"memp://{ns}/customer/42"]
            templates = (await client.list_resource_templates()).resource_templates
            assert {t.uri_template for t in templates} == {
                "memp://{namespace}/{+key}", "memp://{namespace}{?pattern,cursor}"}
            with pytest.raises(MCPError) as caught:
                await client.read_resource(entry_uri(ns, "customer/7"))
            assert caught.value.data["code"] == "not_found"

    run(main())


@LEGACY_SUBSCRIBE
def test_resources_subscribe_hears_another_agents_write(broker: Broker, ns: str) -> None:
    _, token = register(broker, ns)
    _, other = register(broker, ns, "writer")
    uri = entry_uri(ns, "doc/readme")
    heard: asyncio.Queue[str] = asyncio.Queue()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            heard.put_nowait(message.params.uri)

    async def main() -> None:
        async with connect(broker, token, "legacy", on_message) as client, \
                connect(broker, other, "legacy") as writer:
            assert client.server_capabilities.resources is not None
            assert client.server_capabilities.resources.subscribe is True
            await client.subscribe_resource(uri)
            await call(writer, "memory_put", key="doc/readme", value="v1")
            assert await asyncio.wait_for(heard.get(), WAIT) == uri
            await call(writer, "memory_put", key="doc/other", value="not followed")
            with broker.client(other) as rest:  # a write by any route is heard
                assert rest.delete(f"/v1/namespaces/{ns}/memory/doc/readme").status_code == 200
            assert await asyncio.wait_for(heard.get(), WAIT) == uri
            assert heard.empty()
            await client.unsubscribe_resource(uri)
            await call(writer, "memory_put", key="doc/readme", value="v3")
            await asyncio.sleep(0.3)
            assert heard.empty()

    run(main())


def test_subscriptions_listen_hears_changes(broker: Broker, ns: str) -> None:
    _, token = register(broker, ns)
    uri = entry_uri(ns, "doc/readme")
    pattern_uri = f"memp://{ns}?pattern=notes/*"

    async def main() -> None:
        async with connect(broker, token) as client:
            assert client.protocol_version == "2026-07-28"
            async with client.listen(resource_subscriptions=[uri, pattern_uri]) as events:
                assert events.honored.resource_subscriptions == [uri, pattern_uri]
                await call(client, "memory_put", key="doc/readme", value="v1")
                assert await asyncio.wait_for(anext(events), WAIT) == ResourceUpdated(uri)
                await call(client, "memory_put", key="notes/monday", value="v1")
                assert await asyncio.wait_for(anext(events), WAIT) == \
                    ResourceUpdated(pattern_uri)

    run(main())


def test_a_filtered_pattern_subscription_hears_only_matching_changes(broker: Broker,
                                                                     ns: str) -> None:
    _, token = register(broker, ns)
    done = f"memp://{ns}?pattern=tasks/*&filter=%2Fstatus%20%3D%3D%20%22done%22"
    every = f"memp://{ns}?pattern=tasks/*"

    async def main() -> None:
        async with connect(broker, token) as client:
            async with client.listen(resource_subscriptions=[done, every]) as events:
                await call(client, "memory_put", key="tasks/1", value={"status": "open"})
                assert await asyncio.wait_for(anext(events), WAIT) == ResourceUpdated(every)
                await call(client, "memory_put", key="tasks/1", value={"status": "done"})
                heard = {await asyncio.wait_for(anext(events), WAIT) for _ in range(2)}
                assert heard == {ResourceUpdated(every), ResourceUpdated(done)}
                # Had the open task been heard on the filtered URI, this would not come next.
                await call(client, "memory_put", key="tasks/2", value={"status": "open"})
                assert await asyncio.wait_for(anext(events), WAIT) == ResourceUpdated(every)
            bad = f"memp://{ns}?pattern=tasks/*&filter=%2Fstatus%20%3D"
            with pytest.raises(MCPError) as caught:
                async with client.listen(resource_subscriptions=[bad]) as events:
                    await asyncio.wait_for(anext(events), WAIT)
            assert "position" in str(caught.value)

    run(main())


@LEGACY_SUBSCRIBE
@pytest.mark.parametrize("mode", MODES)
def test_a_token_without_the_grant_is_refused(broker: Broker, ns: str, mode: str) -> None:
    reader = key_for(broker, [{"namespace": ns, "permissions": ["read"]}])
    elsewhere = key_for(broker, [{"namespace": f"{ns}-other", "permissions": ["read", "write",
                                                                                "subscribe"]}])
    with broker.client() as admin:
        admin.put(f"/v1/namespaces/{ns}/memory/secret", json={"value": "s3cret"})

    async def main() -> None:
        async with connect(broker, reader, mode) as client:
            assert (await call(client, "memory_get", namespace=ns, key="secret"))["value"] \
                == "s3cret"
            error = await refused(client, "memory_put", namespace=ns, key="secret", value=1)
            assert error == {"code": "forbidden", "details": {"namespace": ns,
                                                              "permission": "write"},
                             "message": f"this token has no write permission on namespace "
                                        f"{ns!r}"}
            assert (await refused(client, "memory_delete", namespace=ns, key="secret"))[
                "code"] == "forbidden"
            # No `amp` permission on the AMP namespace: AMP tools are refused too.
            assert (await refused(client, "amp_recall", agent="someone"))["code"] == \
                "forbidden"
            listen_or_subscribe = client.listen(resource_subscriptions=[
                entry_uri(ns, "secret")]) if mode == "auto" else None
            with pytest.raises(MCPError) as caught:
                if listen_or_subscribe is not None:
                    async with listen_or_subscribe:
                        pass
                else:
                    await client.session.subscribe_resource(entry_uri(ns, "secret"))
            assert caught.value.data["code"] == "forbidden"
        async with connect(broker, elsewhere, mode) as client:
            assert (await refused(client, "memory_get", namespace=ns, key="secret"))[
                "code"] == "forbidden"
            with pytest.raises(MCPError) as caught:
                await client.read_resource(entry_uri(ns, "secret"))
            assert caught.value.data["code"] == "forbidden"
            assert (await client.list_resources()).resources == []
            bad = await refused(client, "memory_put", namespace=ns, key="a", value=1,
                                unknown=True)
            assert bad["code"] == "invalid_request"

    run(main())


@pytest.mark.parametrize("token", [None, "memp_sk_live_forged", "not-a-token"])
def test_no_valid_token_is_401_before_mcp(broker: Broker, token: str | None) -> None:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    reply = httpx.post(f"{broker.url}/mcp", json=initialize, headers=headers, timeout=WAIT)
    assert reply.status_code == 401
    assert reply.json()["error"]["code"] == "unauthorized"
    assert reply.headers["www-authenticate"] == 'Bearer realm="memp"'


def test_a_session_belongs_to_the_credential_that_opened_it(broker: Broker, ns: str) -> None:
    _, token = register(broker, ns)
    with httpx.Client(base_url=broker.url, timeout=WAIT) as http:
        theirs = open_session(http, token)
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        assert http.post("/mcp", json=listing, headers=theirs).status_code == 200
        admins = {**theirs, "Authorization": f"Bearer {ADMIN_KEY}"}
        assert http.post("/mcp", json=listing, headers=admins).status_code == 404
        assert http.delete("/mcp", headers=theirs).status_code == 200


@pytest.mark.parametrize("literal", [
    pytest.param("NaN", id="nan"),
    pytest.param('{"a": [1, Infinity]}', id="nested-infinity"),
    pytest.param("-Infinity", id="minus-infinity"),
    pytest.param("1e400", id="beyond-a-double"),
])
def test_mcp_refuses_numbers_json_has_not_as_rest_does(broker: Broker, ns: str,
                                                        literal: str) -> None:
    """`memory_put` with NaN or an infinity is `invalid_json`, as the same value sent over
    REST is, and nothing is stored (it used to store null); so is `amp_remember`'s
    metadata."""
    _, token = register(broker, ns)
    with httpx.Client(base_url=broker.url, timeout=WAIT) as http:
        theirs = open_session(http, token)
        calls = (("memory_put", f'{{"key": "k", "value": {literal}}}'),
                 ("amp_remember", f'{{"text": "t", "metadata": {{"m": {literal}}}}}'))
        for tool, arguments in calls:
            result = raw_tool_call(http, theirs, tool, arguments)
            assert result["isError"], result
            assert result["structuredContent"]["error"]["code"] == "invalid_json", result
        assert raw_tool_call(http, theirs, "memory_put", '{"key": "k", "value": 1.5}'
                              )["structuredContent"]["value"] == 1.5
        rest = http.put(f"/v1/namespaces/{ns}/memory/k2", content=f'{{"value": {literal}}}',
                        headers={"Authorization": f"Bearer {token}",
                                 "Content-Type": "application/json"})
        assert rest.status_code == 400 and rest.json()["error"]["code"] == "invalid_json"
    with broker.client(token) as client:
        assert client.get(f"/v1/namespaces/{ns}/memory/k").json()["version"] == 1
        assert client.get(f"/v1/namespaces/{ns}/memory/k2").status_code == 404


def test_amp_tools_follow_the_amp_rules(broker: Broker, ns: str) -> None:
    agent_id, token = register(broker, ns, "rememberer")
    _, stranger = register(broker, ns, "stranger")

    async def main() -> None:
        async with connect(broker, token) as client, connect(broker, stranger) as other:
            # A named owner is a user unless said otherwise, as in both SDKs.
            cell = await call(client, "amp_remember", text="The user prefers dark roast coffee",
                              owner_id="u-1", importance=0.9, metadata={"topic": "coffee"})
            assert cell["identity"] == {"owner_id": "u-1", "owner_type": "user",
                                        "created_by": agent_id, "session_id": None}
            own = await call(client, "amp_remember", text="I brew at 93 degrees")
            assert (own["identity"]["owner_id"], own["identity"]["owner_type"]) == (agent_id,
                                                                                     "agent")
            team = await call(client, "amp_remember", text="The team orders beans on Monday",
                              owner_id="org-1", owner_type="organization")
            assert team["identity"]["owner_type"] == "organization"
            assert cell["lifecycle"]["status"] == "active"
            found = await call(client, "amp_recall", query="coffee roast", mode="keyword")
            assert [hit["cell"]["id"] for hit in found["results"]] == [cell["id"]]
            for _ in range(300):  # recalled by meaning once the embedder has its vector
                meant = await call(client, "amp_recall", query="which hot drink does the "
                                   "user like?", mode="semantic", min_score=0.15,
                                   owner_id="u-1", owner_type="user")
                if meant["results"]:
                    break
                await asyncio.sleep(0.05)
            assert meant["results"][0]["cell"]["id"] == cell["id"]
            assert (await refused(client, "amp_recall", query="coffee", min_score=3)
                    )["details"]["field"] == "min_score"
            by_label = await call(client, "amp_recall", metadata={"topic": "coffee"},
                                  owner_id="u-1", owner_type="user")
            assert len(by_label["results"]) == 1
            # The cell is private to its creator: another agent never finds it, by words or
            # by meaning (its own cells may still rank).
            for mode in ("keyword", "semantic", "hybrid"):
                seen = await call(other, "amp_recall", query="coffee", mode=mode)
                assert cell["id"] not in [hit["cell"]["id"] for hit in seen["results"]]
            # Only archived cells may be deleted; this one is active.
            refusal = await refused(client, "amp_forget", id=cell["id"])
            assert refusal["code"] == "write_conflict"
            assert refusal["details"] == {"status": "active"}
            assert (await refused(other, "amp_forget", id=cell["id"]))["code"] == "forbidden"
            # Acting as another agent needs the impersonate permission.
            assert (await refused(client, "amp_recall", agent="someone-else"))["code"] == \
                "forbidden"
            # At most MAX_POLICY_GLOBS readers, as on /amp; nothing stored over it.
            wide = await refused(client, "amp_remember", text="The user's shoe size is 42",
                                 readable_by=[f"team-{n}" for n in range(MAX_POLICY_GLOBS + 1)])
            assert (wide["code"], wide["details"]["field"]) == ("invalid_request",
                                                               "access_policy.readable_by")
            assert (await call(client, "amp_recall", query="shoe size", mode="keyword")
                    )["results"] == []
            mine = await call(client, "amp_remember", text="I summarise tickets", public=True,
                              type="procedural")
            assert mine["identity"]["owner_id"] == agent_id
            assert (await call(other, "amp_recall", query="tickets"))["results"][0]["cell"][
                "id"] == mine["id"]

    run(main())


def test_amp_merge_merges_one_owners_cells_and_refuses_bad_sources_whole(broker: Broker,
                                                                         ns: str) -> None:
    with broker.client() as admin:
        made = admin.post("/v1/agents", json={"name": "merger", "framework": "claude",
                                              "namespace": ns}).json()
    agent_id, token = made["agent"]["id"], made["credentials"]["api_key"]
    _, stranger = register(broker, ns, "merge-stranger")
    owner = f"u-{ns}"

    async def owned(client: Any) -> set[str]:
        page = await call(client, "amp_recall", owner_id=owner, owner_type="user", limit=100)
        return {hit["cell"]["id"] for hit in page["results"]}

    async def main() -> None:
        async with connect(broker, token) as client, connect(broker, stranger) as other:
            a, b, c = [await call(client, "amp_remember", text=text, owner_id=owner)
                       for text in ("Ana likes tea", "Ana drinks green tea", "Ana has a cat")]
            elsewhere = await call(client, "amp_remember", text="Bob likes tea",
                                   owner_id=f"{owner}-b")
            private = await call(other, "amp_remember", text="Ana likes oolong",
                                 owner_id=owner)
            unknown = "01J00000000000000000000000"
            before = await owned(client)
            refusals: list[tuple[dict[str, Any], str, str]] = [
                ({"ids": [a["id"], unknown]}, "not_found", "ids[1]"),
                ({"ids": [a["id"], elsewhere["id"]]}, "invalid_request", "ids[1]"),
                ({"ids": [a["id"], private["id"]]}, "forbidden", "ids[1]"),
                ({"ids": ["*" * 128, a["id"]]}, "invalid_request", "ids[0]"),
                ({"ids": [a["id"], a["id"]]}, "invalid_request", "ids[1]"),
                ({"ids": [a["id"]]}, "invalid_request", "ids"),
                ({"ids": [a["id"], b["id"]], "text": ""}, "invalid_request", "text"),
                ({"ids": [a["id"], b["id"]], "importance": 2}, "invalid_request",
                 "importance"),
                ({"ids": [a["id"], b["id"]],
                  "readable_by": [f"team-{n}" for n in range(MAX_POLICY_GLOBS + 1)]},
                 "invalid_request", "access_policy.readable_by"),
            ]
            for arguments, code, field in refusals:
                error = await refused(client, "amp_merge", **{"text": "Ana likes tea",
                                                              **arguments})
                assert (error["code"], error["details"].get("field")) == (code, field), error
            assert await owned(client) == before  # nothing written

            merged = await call(client, "amp_merge", ids=[a["id"], b["id"]],
                                text="Ana likes tea, green above all", importance=0.9,
                                metadata={"topic": "drinks"})
            assert merged["provenance"] == {"source_type": "merge", "extraction_method": "merge",
                                            "source_ref": f"{a['id']},{b['id']}"}
            assert (merged["identity"]["owner_id"], merged["identity"]["created_by"],
                    merged["scoring"]["importance"], merged["content"]["metadata"]) == (
                owner, agent_id, 0.9, {"topic": "drinks"})
            assert await owned(client) == {merged["id"], c["id"]}
            # The sources are archived now: merging one again is a conflict naming it.
            again = await refused(client, "amp_merge", ids=[c["id"], a["id"]], text="x")
            assert (again["code"], again["details"]["field"], again["details"]["status"]) == (
                "write_conflict", "ids[1]", "archived")
            assert await owned(client) == {merged["id"], c["id"]}

    run(main())
    # A revoked key is refused before MCP, and nothing is merged.
    with httpx.Client(base_url=broker.url, timeout=WAIT) as http:
        theirs = open_session(http, token)
        page = raw_tool_call(http, theirs, "amp_recall", json.dumps(
            {"owner_id": owner, "owner_type": "user"}))["structuredContent"]["results"]
        ids = sorted(hit["cell"]["id"] for hit in page)
        with broker.client() as admin:
            revoked = admin.delete(f"/v1/keys/{made['credentials']['key_id']}")
            assert revoked.status_code in (200, 204), revoked.text
        call_body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": "amp_merge", "arguments": {"ids": ids, "text": "all of it"}}}
        reply = http.post("/mcp", json=call_body, headers=theirs)
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "unauthorized"
    with broker.client() as admin:
        left = admin.post("/amp/memories/search", headers={"X-AMP-Agent-ID": agent_id},
                          json={"owner_id": owner, "owner_type": "user"})
        assert sorted(hit["cell"]["id"] for hit in left.json()["results"]) == ids


def test_amp_merge_on_two_processes_at_once_archives_each_source_once(
        broker_processes: Callable[..., list[BrokerProcess]], ns: str) -> None:
    """Two broker processes on one Redis get amp_merge calls over MCP at once for overlapping
    sources: one merge is made, the other is refused with write_conflict naming an archived
    source, and each source is archived once, by the merge that won."""
    if "redis" not in BACKENDS:
        pytest.skip("two broker processes share one Redis")
    first, second = broker_processes(2, MEMP_AMP_NAMESPACE=ns,
                                     MEMP_AMP_LIFECYCLE_INTERVAL_SECONDS="3600")
    with httpx.Client(base_url=first.url, timeout=WAIT,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        made = admin.post("/v1/agents", json={"name": "merger", "namespace": ns})
        assert made.status_code == 201, made.text
        token = made.json()["credentials"]["api_key"]

        def archived(owner: str, cell_id: str) -> int:
            """How many stored versions of the owner's cell archive it."""
            key = f"cells/user/{owner}/{cell_id}"
            versions = admin.get(f"/v1/namespaces/{ns}/history/{key}", params={"limit": 100})
            assert versions.status_code == 200, versions.text
            return sum(v["value"]["lifecycle"]["status"] == "archived"
                       for v in versions.json()["versions"] if v.get("value"))

        for round_ in range(3):
            owner = f"u-{ns}-{round_}"
            outcome: dict[str, Any] = {}

            async def main(owner: str = owner, outcome: dict[str, Any] = outcome) -> None:
                async with connect(first, token) as one, connect(second, token) as two:
                    ids = [(await call(one, "amp_remember", text=f"Ana likes tea, note {n}",
                                       owner_id=owner))["id"] for n in range(3)]
                    outcome["ids"] = ids
                    outcome["results"] = await asyncio.gather(
                        one.call_tool("amp_merge", {"ids": ids[:2], "text": "merged"}),
                        two.call_tool("amp_merge", {"ids": ids[1:], "text": "merged"}))

            run(main())
            ids, results = outcome["ids"], outcome["results"]
            assert sorted(r.is_error for r in results) == [False, True], results
            won = next(r.structured_content for r in results if not r.is_error)
            lost = next(r.structured_content["error"] for r in results if r.is_error)
            assert (lost["code"], lost["details"]["status"]) == ("write_conflict", "archived")
            merged_from = won["provenance"]["source_ref"].split(",")
            assert [archived(owner, i) for i in ids] == [int(i in merged_from) for i in ids]


@pytest.mark.parametrize(("uri", "namespace", "key", "pattern"), [
    pytest.param("memp://acme/customer/42", "acme", "customer/42", "customer/42", id="entry"),
    pytest.param("memp://acme/a%20b/%3F%23%25", "acme", "a b/?#%", "a b/?#%", id="escaped"),
    pytest.param("memp://acme?pattern=customer/*", "acme", None, "customer/*", id="pattern"),
    pytest.param("memp://acme", "acme", None, "*", id="everything"),
])
def test_resource_uris(uri: str, namespace: str, key: str | None, pattern: str) -> None:
    target = parse_uri(uri)
    assert (target.namespace, target.key, target.watched) == (namespace, key, pattern)
    if key is not None:
        assert entry_uri(namespace, key) == uri


def test_every_tool_is_described_once() -> None:
    assert len({tool.name for tool in TOOLS}) == len(TOOLS) == 9


def test_a_broker_imports_mcp_only_once_mcp_is_used() -> None:
    """Building the app leaves the `mcp` package unimported (seconds of CPU in every broker
    process); broker/mcp/mount.py imports it on the first request to /mcp."""
    script = ("import sys\n"
              "from broker.app import create_app\n"
              "from broker.runtime.settings import Settings\n"
              f"create_app(Settings.from_env(environ={{}}, admin_key={ADMIN_KEY!r}))\n"
              "print(sorted(m for m in sys.modules if m == 'broker.mcp.server'"
              " or m.split('.')[0] in ('mcp', 'mcp_types')))\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True)
    assert run.stdout.strip() == "[]", run.stdout


@pytest.mark.parametrize("mode", MODES)
def test_the_first_requests_to_a_new_broker_start_mcp_once(broker_factory: Callable[..., Broker],
                                                           mode: str) -> None:
    """Clients arriving together at a broker whose /mcp was never used all get through."""
    fresh = broker_factory("embedded")

    async def main() -> None:
        async def tools() -> list[str]:
            async with connect(fresh, ADMIN_KEY, mode) as client:
                return [tool.name for tool in (await client.list_tools()).tools]

        listed = await asyncio.gather(*(tools() for _ in range(4)))
        assert listed == [[tool.name for tool in TOOLS]] * 4

    run(main())
