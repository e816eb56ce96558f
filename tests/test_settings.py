"""Unit tests of broker/settings.py: environment conversion, validation and overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from broker.settings import Settings, SettingsError


def test_defaults_from_an_empty_environment() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.host == "127.0.0.1" and settings.port == 8080
    assert settings.embedded is True
    assert settings.max_value_bytes == 1024 * 1024


def test_environment_values_are_converted_to_their_types() -> None:
    settings = Settings.from_env({
        "MEMP_HOST": "0.0.0.0",
        "MEMP_PORT": "9000",
        "MEMP_REDIS_URL": "redis://localhost:6379/2",
        "MEMP_MAX_VALUE_BYTES": "2048",
        "MEMP_SWEEP_INTERVAL_SECONDS": "0.25",
        "MEMP_ADMIN_KEY": "a" * 16,
        "MEMP_KEY_ENV": "test",
    })
    assert settings.host == "0.0.0.0"
    assert settings.port == 9000
    assert settings.redis_url == "redis://localhost:6379/2"
    assert settings.embedded is False
    assert settings.max_value_bytes == 2048
    assert settings.sweep_interval_seconds == 0.25
    assert settings.admin_key == "a" * 16
    assert settings.key_env == "test"


def test_empty_variables_mean_unset() -> None:
    settings = Settings.from_env({"MEMP_PORT": "", "MEMP_REDIS_URL": ""})
    assert settings.port == 8080 and settings.redis_url is None


def test_variables_without_the_prefix_are_ignored() -> None:
    assert Settings.from_env({"PORT": "1", "REDIS_URL": "http://x"}) == Settings()


def test_overrides_win_over_the_environment() -> None:
    environ = {"MEMP_PORT": "9000", "MEMP_HOST": "0.0.0.0", "MEMP_REDIS_URL": "redis://a/0"}
    settings = Settings.from_env(environ, port=9100, redis_url="redis://b/0")
    assert settings.port == 9100
    assert settings.redis_url == "redis://b/0"
    assert settings.host == "0.0.0.0"


def test_none_overrides_leave_the_environment_alone() -> None:
    settings = Settings.from_env({"MEMP_PORT": "9000"}, port=None, host=None)
    assert settings.port == 9000 and settings.host == "127.0.0.1"


def test_overrides_are_validated_too() -> None:
    with pytest.raises(SettingsError, match="port must be between 1 and 65535, not 70000"):
        Settings.from_env({"MEMP_PORT": "9000"}, port=70000)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        pytest.param({"MEMP_PORT": "abc"}, "MEMP_PORT must be a number, not 'abc'", id="port-text"),
        pytest.param({"MEMP_PORT": "80.5"}, "MEMP_PORT must be a number", id="port-float"),
        pytest.param({"MEMP_PORT": "0"}, "port must be between 1 and 65535", id="port-zero"),
        pytest.param({"MEMP_PORT": "65536"}, "port must be between 1 and 65535", id="port-high"),
        pytest.param({"MEMP_SWEEP_INTERVAL_SECONDS": "soon"},
                     "MEMP_SWEEP_INTERVAL_SECONDS must be a number", id="float-text"),
        pytest.param({"MEMP_SWEEP_INTERVAL_SECONDS": "nan"},
                     "MEMP_SWEEP_INTERVAL_SECONDS must be a finite number", id="float-nan"),
        pytest.param({"MEMP_REDIS_TIMEOUT_SECONDS": "inf"},
                     "MEMP_REDIS_TIMEOUT_SECONDS must be a finite number", id="float-inf"),
        pytest.param({"MEMP_REDIS_URL": "http://x"}, "MEMP_REDIS_URL must start with redis://",
                     id="redis-url-scheme"),
        pytest.param({"MEMP_MAX_VALUE_BYTES": "-1"}, "max_value_bytes must be positive, not -1",
                     id="negative-value-limit"),
        pytest.param({"MEMP_MAX_BATCH": "0"}, "max_batch must be positive", id="zero-batch"),
        pytest.param({"MEMP_HISTORY_LIMIT": "-1"}, "history_limit", id="negative-history"),
        pytest.param({"MEMP_MAX_KEY_BYTES": "2048"}, "protocol limit of 1024",
                     id="key-limit-over-protocol"),
        pytest.param({"MEMP_DEFAULT_QUERY_LIMIT": "2000"},
                     "default_query_limit cannot exceed max_query_limit", id="default-over-max"),
        pytest.param({"MEMP_MAX_VALUE_BYTES": "10", "MEMP_MAX_REQUEST_BYTES": "5"},
                     "max_request_bytes must be at least max_value_bytes",
                     id="request-below-value"),
        pytest.param({"MEMP_ADMIN_KEY": "short"}, "MEMP_ADMIN_KEY must be at least 16 characters",
                     id="short-admin-key"),
        pytest.param({"MEMP_JWT_SECRET": "x" * 31}, "MEMP_JWT_SECRET must be at least 32",
                     id="short-jwt-secret"),
        pytest.param({"MEMP_KEY_ENV": "li_ve"}, "key_env must be alphanumeric", id="key-env"),
        pytest.param({"MEMP_JWT_PUBLIC_KEY": "/no/such/file.pem"},
                     "MEMP_JWT_PUBLIC_KEY is neither a PEM key nor a file", id="public-key-path"),
        pytest.param({"MEMP_JWT_PUBLIC_KEY": "-----BEGIN PUBLIC KEY-----\nabc\n"
                                             "-----END PUBLIC KEY-----\n"},
                     "MEMP_JWT_PUBLIC_KEY", id="public-key-garbage-pem"),
    ],
)
def test_broken_configuration_names_the_problem(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as raised:
        Settings.from_env(environ)
    assert "\n" not in str(raised.value)


def test_public_key_is_read_from_a_file(tmp_path: Path) -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    path = tmp_path / "jwt.pem"
    path.write_text(pem)
    assert Settings.from_env({"MEMP_JWT_PUBLIC_KEY": str(path)}).jwt_public_key == pem
    assert Settings.from_env({"MEMP_JWT_PUBLIC_KEY": pem}).jwt_public_key == pem


def test_validate_returns_the_settings() -> None:
    settings = Settings(port=1, max_value_bytes=1)
    assert settings.validate() is settings


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("redis://127.0.0.1:6379/0", id="redis"),
        pytest.param("rediss://user:pw@example.com:6380/1", id="tls"),
        pytest.param("unix:///tmp/redis.sock", id="unix"),
    ],
)
def test_redis_url_schemes_accepted(url: str) -> None:
    assert Settings.from_env({"MEMP_REDIS_URL": url}).redis_url == url
