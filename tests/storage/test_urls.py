"""The three forms of MEMP_REDIS_URL (broker/storage/urls.py), and what a bad one says."""

from __future__ import annotations

import pytest

from broker.runtime.settings import Settings, SettingsError
from broker.storage.urls import RedisTarget, UrlError, parse, redacted

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`


def test_one_server_urls_go_to_redis_py_as_they_are() -> None:
    for url in ("redis://127.0.0.1:6379/2", "rediss://u:p@h:6380/0", "unix:///run/r.sock"):
        target = parse(url)
        assert (target.kind, target.url) == ("single", url)


def test_a_sentinel_url_names_sentinels_service_database_and_credentials() -> None:
    target = parse("redis+sentinel://memp:s%40cret@10.0.0.1:26379,10.0.0.2:26380/cache/3"
                   "?sentinel_password=sp")
    assert target == RedisTarget(
        "sentinel", target.url, (("10.0.0.1", 26379), ("10.0.0.2", 26380)), "cache", 3,
        "memp", "s@cret", "memp", "sp", False, {})
    shared = parse("redis+sentinel://memp:pw@h:1/svc")
    assert (shared.sentinel_username, shared.sentinel_password) == ("memp", "pw")
    open_sentinels = parse("redis+sentinel://memp:pw@h:1/svc?sentinel_password=")
    assert (open_sentinels.sentinel_username, open_sentinels.sentinel_password) == ("memp", None)
    assert target.connection_options() == {"username": "memp", "password": "s@cret", "db": 3}


def test_a_cluster_url_names_seed_nodes_and_tls_options() -> None:
    target = parse("redis+cluster+tls://:pw@h1:7000,h2:7001?ssl_ca_certs=/ca.pem"
                   "&ssl_check_hostname=false")
    assert (target.kind, target.hosts, target.password) == (
        "cluster", (("h1", 7000), ("h2", 7001)), "pw")
    assert target.connection_options() == {
        "username": None, "password": "pw", "ssl": True, "ssl_ca_certs": "/ca.pem",
        "ssl_check_hostname": False}
    assert parse("redis+cluster://h:1?ssl=true").connection_options()["ssl"] is True


@pytest.mark.parametrize("url", [
    pytest.param("http://localhost:6379", id="wrong-scheme"),
    pytest.param("redis+sentinel://h:26379", id="sentinel-without-service"),
    pytest.param("redis+sentinel://h:26379/svc/x", id="sentinel-database-not-a-number"),
    pytest.param("redis+sentinel://h:26379/svc/1/2", id="sentinel-too-many-parts"),
    pytest.param("redis+cluster://h:7000/0", id="cluster-with-database"),
    pytest.param("redis+cluster://h", id="host-without-port"),
    pytest.param("redis+cluster://h:port", id="port-not-a-number"),
    pytest.param("redis+cluster://", id="no-host"),
    pytest.param("redis+cluster://h:1?frobnicate=1", id="unknown-option"),
])
def test_a_bad_url_is_refused_at_start_with_the_reason(url: str) -> None:
    with pytest.raises(UrlError):
        parse(url)
    with pytest.raises(SettingsError):
        Settings.from_env(environ={"MEMP_REDIS_URL": url})


def test_write_replicas_need_redis() -> None:
    with pytest.raises(SettingsError, match="MEMP_WRITE_REPLICAS"):
        Settings.from_env(environ={"MEMP_WRITE_REPLICAS": "1"})
    settings = Settings.from_env(environ={"MEMP_WRITE_REPLICAS": "1",
                                          "MEMP_REDIS_URL": "redis+cluster://h:1"})
    assert settings.write_replicas == 1


def test_passwords_are_redacted_in_what_the_broker_prints() -> None:
    assert redacted("redis+sentinel://u:secret@h:1,h:2/svc") == "redis+sentinel://***@h:1,h:2/svc"
    assert redacted("redis://h:1/0") == "redis://h:1/0"
