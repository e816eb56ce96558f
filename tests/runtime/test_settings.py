"""Unit tests of broker/runtime/settings.py: environment conversion, validation and overrides."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from broker.runtime.settings import Settings, SettingsError

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`


def test_defaults_from_an_empty_environment() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.host == "127.0.0.1" and settings.port == 8080
    assert settings.embedded is True
    assert settings.max_value_bytes == 1024 * 1024


ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "docs" / "configuration.md"


def configuration_table() -> dict[str, str]:
    """docs/configuration.md's table of settings: each variable and the default it states."""
    section = CONFIGURATION.read_text().split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    stated: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`((?:MEMP_|AMP_)[A-Z_]+)`", cells[0])
        defaults = [d.strip().strip("`") for d in cells[1].split(",")]
        if len(defaults) != len(names):
            defaults = defaults[:1] * len(names)
        stated.update(zip(names, defaults, strict=True))
    return stated


def test_every_setting_is_in_the_configuration_page_with_its_default() -> None:
    stated = configuration_table()
    variables = {f"MEMP_{f.name.upper()}": f for f in dataclasses.fields(Settings)}
    assert set(stated) - {"AMP_PURGE_RETENTION"} == set(variables)
    for variable, field in variables.items():
        text, default = stated[variable], field.default
        if text == "unset":
            assert default in (None, "", False), variable
        elif isinstance(default, bool | str):
            assert text == str(default), variable
        elif re.fullmatch(r"[0-9.]+", text):
            assert float(text) == default, variable


def test_every_variable_the_code_names_is_on_the_configuration_page() -> None:
    """Beyond the settings: what `serve`, the SDKs and the CLI read (`MEMP_LOG_LEVEL`,
    `MEMP_BASE_URL`, ...), found in their sources. A `_FILE` form counts as its setting's."""
    sources = [*ROOT.glob("broker/**/*.py"), *ROOT.glob("sdk-python/memp/**/*.py"),
               *ROOT.glob("sdk-js/src/**/*.ts")]
    named = {name for source in sources
             for name in re.findall(r"\bMEMP_[A-Z0-9_]*[A-Z0-9]\b", source.read_text())}
    assert "MEMP_LOG_LEVEL" in named and "MEMP_BASE_URL" in named  # the search finds them
    page = CONFIGURATION.read_text()
    missing = {name for name in named
               if f"`{name}`" not in page and f"`{name.removesuffix('_FILE')}`" not in page}
    assert not missing, sorted(missing)


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
        pytest.param({"MEMP_PORT": "abc"}, "MEMP_PORT must be a whole number, not 'abc'",
                     id="port-text"),
        pytest.param({"MEMP_PORT": "80.5"}, "MEMP_PORT must be a whole number", id="port-float"),
        pytest.param({"MEMP_PORT": "0"}, "port must be between 1 and 65535", id="port-zero"),
        pytest.param({"MEMP_PORT": "65536"}, "port must be between 1 and 65535", id="port-high"),
        pytest.param({"MEMP_SWEEP_INTERVAL_SECONDS": "soon"},
                     "MEMP_SWEEP_INTERVAL_SECONDS must be a number", id="float-text"),
        pytest.param({"MEMP_SWEEP_INTERVAL_SECONDS": "nan"},
                     "MEMP_SWEEP_INTERVAL_SECONDS must be a finite number", id="float-nan"),
        pytest.param({"MEMP_REDIS_TIMEOUT_SECONDS": "inf"},
                     "MEMP_REDIS_TIMEOUT_SECONDS must be a finite number", id="float-inf"),
        pytest.param({"MEMP_REDIS_URL": "http://x"},
                     r"MEMP_REDIS_URL must start with one of redis://, rediss://, unix://, "
                     r"redis\+sentinel://", id="redis-url-scheme"),
        pytest.param({"MEMP_MAX_VALUE_BYTES": "-1"}, "max_value_bytes must be positive, not -1",
                     id="negative-value-limit"),
        pytest.param({"MEMP_MAX_BATCH": "0"}, "max_batch must be positive", id="zero-batch"),
        pytest.param({"MEMP_HISTORY_LIMIT": "-1"}, "history_limit must be >= 0, not -1",
                     id="negative-history"),
        pytest.param({"MEMP_IDEMPOTENCY_WINDOW_SECONDS": "-1"},
                     "idempotency_window_seconds must be >= 0, not -1", id="negative-window"),
        pytest.param({"MEMP_AUDIT_RETENTION_SECONDS": "-1"},
                     r"audit_retention_seconds must be >= 0 \(0 = keep every record\), not -1",
                     id="negative-audit-retention"),
        pytest.param({"MEMP_CHANGELOG_MAX_AGE_SECONDS": "-5"},
                     r"changelog_max_age_seconds must be >= 0 \(0 = no age limit\), not -5",
                     id="negative-changelog-age"),
        pytest.param({"MEMP_AGENT_WRITES_PER_SECOND": "1000001"},
                     r"agent_writes_per_second must be between 0 \(no limit\) and 1000000, "
                     r"not 1000001.0", id="agent-rate-over-ceiling"),
        pytest.param({"MEMP_MAX_STREAMS_PER_TOKEN": "-1"},
                     r"max_streams_per_token must be between 0 \(no limit\) and 1000000",
                     id="negative-stream-cap"),
        pytest.param({"MEMP_AGENT_READS_PER_SECOND": "0.0001"},
                     r"agent_reads_per_second must be 0 \(no limit\) or at least 0.001",
                     id="agent-rate-too-small"),
        pytest.param({"MEMP_RATE_LIMIT_HOLD_MS": "10001"},
                     r"rate_limit_hold_ms must be between 0 \(off\) and 10000, not 10001",
                     id="hold-over-ceiling"),
        pytest.param({"MEMP_STREAM_LEASE_SECONDS": "2"},
                     "stream_lease_seconds must be between 3 and 3600, not 2.0",
                     id="lease-too-short"),
        pytest.param({"MEMP_HISTORY_LIMIT": "20", "MEMP_MAX_HISTORY_LIMIT": "10"},
                     "history_limit cannot exceed max_history_limit", id="history-over-ceiling"),
        pytest.param({"MEMP_MAX_REGISTRATION_BYTES": "0"}, "max_registration_bytes must be "
                     "positive", id="zero-registration-limit"),
        pytest.param({"MEMP_MAX_KEY_CREATION_BYTES": "-5"}, "max_key_creation_bytes must be "
                     "positive", id="negative-key-creation-limit"),
        pytest.param({"MEMP_MAX_CONFIG_BYTES": "0"}, "max_config_bytes must be positive",
                     id="zero-config-limit"),
        pytest.param({"MEMP_MAX_AMP_BODY_BYTES": "0"}, "max_amp_body_bytes must be positive",
                     id="zero-amp-body-limit"),
        pytest.param({"MEMP_MAX_QUERY_SCAN": "0"}, "max_query_scan must be positive",
                     id="zero-query-scan"),
        pytest.param({"MEMP_SCHEMA_CHECK_TIMEOUT_MS": "0"},
                     "schema_check_timeout_ms must be positive", id="zero-schema-check-budget"),
        pytest.param({"MEMP_MAX_HISTORY_LIMIT": "0", "MEMP_HISTORY_LIMIT": "0"},
                     "max_history_limit must be positive", id="zero-history-ceiling"),
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
        pytest.param({"MEMP_EMBEDDER": "magic"}, "embedder must be builtin, openai or none",
                     id="embedder"),
        pytest.param({"MEMP_EMBEDDER": "openai"}, "needs MEMP_EMBEDDINGS_URL",
                     id="openai-embedder-without-url"),
        pytest.param({"MEMP_EMBEDDINGS_TIMEOUT_SECONDS": "0"}, "embeddings_timeout_seconds "
                     "must be positive", id="embeddings-timeout"),
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


def test_tls_key_needs_its_certificate() -> None:
    with pytest.raises(SettingsError, match="MEMP_TLS_KEY is set without MEMP_TLS_CERT"):
        Settings.from_env({"MEMP_TLS_KEY": "/etc/memp/key.pem"})
    # Files are read by `serve` (broker/runtime/tls.py), not here.
    assert Settings.from_env({"MEMP_TLS_CERT": "/nonexistent.pem"}).tls_cert == "/nonexistent.pem"


# ---- parsing by declared type ----

PEM = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
# A valid value other than the default, for each field that is text.
TEXT_SAMPLES = {
    "host": "0.0.0.0", "redis_url": "redis://127.0.0.1:6390/3", "admin_key": "k" * 20,
    "jwt_secret": "s" * 40, "jwt_public_key": PEM, "jwt_audience": "memp", "jwt_issuer": "idp",
    "key_env": "test", "amp_namespace": "cells", "cors_origins": "https://example.com",
    "tls_cert": "/etc/memp/cert.pem", "tls_key": "/etc/memp/key.pem",
    "embedder": "openai", "embeddings_url": "http://127.0.0.1:11434",
    "embeddings_model": "nomic-embed-text", "embeddings_api_key": "sk-test",
}


def sample(field: dataclasses.Field[Any], kind: object) -> tuple[str, Any]:
    """A variable's text and the value it must give: not the default, and valid."""
    default = field.default
    if kind is bool:
        return ("yes", True) if default is False else ("no", False)
    if kind is int:
        if default is None:  # a count chosen by the deployment (write_replicas): give one
            return "2", 2
        assert isinstance(default, int)
        number = default + 1 if default == 0 else default - 1  # counts of 0 mean "none"
        return str(number), number
    if kind is float:
        assert isinstance(default, float)
        value = default / 2 if default else 1.5  # a rate of 0 means "none"
        return str(value), value
    return TEXT_SAMPLES[field.name], TEXT_SAMPLES[field.name]


def field_kinds() -> list[tuple[dataclasses.Field[Any], object]]:
    hints = typing.get_type_hints(Settings)
    return [(f, next(a for a in (*typing.get_args(hints[f.name]), hints[f.name])
                     if a is not type(None))) for f in dataclasses.fields(Settings)]


def test_every_field_is_settable_from_its_variable() -> None:
    environ: dict[str, str] = {}
    expected: dict[str, Any] = {}
    for field, kind in field_kinds():
        assert kind in (bool, int, float, str), f"{field.name}: no parser for {kind!r}"
        environ[f"MEMP_{field.name.upper()}"], expected[field.name] = sample(field, kind)
    settings = Settings.from_env(environ)
    for name, value in expected.items():
        assert getattr(settings, name) == value, name
        assert getattr(settings, name) != getattr(Settings(), name), name


def test_every_field_is_settable_from_a_file(tmp_path: Path) -> None:
    environ: dict[str, str] = {}
    expected: dict[str, Any] = {}
    for field, kind in field_kinds():
        if field.name in ("tls_cert", "tls_key"):
            continue  # paths already: see the next test
        text, expected[field.name] = sample(field, kind)
        path = tmp_path / field.name
        path.write_text(f"{text}\n")  # a mounted secret usually ends in a newline
        environ[f"MEMP_{field.name.upper()}_FILE"] = str(path)
    settings = Settings.from_env(environ)
    for name, value in expected.items():
        assert getattr(settings, name) == (value.strip() if isinstance(value, str) else value)


@pytest.mark.parametrize("variable", ["MEMP_TLS_CERT", "MEMP_TLS_KEY"])
def test_settings_that_are_paths_have_no_file_variable(variable: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({f"{variable}_FILE": "/etc/memp/tls.pem"})
    assert str(raised.value) == (f"{variable} is a path already: set "
                                 f"{variable}=/etc/memp/tls.pem, not {variable}_FILE")


def test_a_file_value_is_stripped_and_flags_still_win(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("  admin-key-from-a-file-0123\r\n\n")
    (tmp_path / "url").write_text("redis://memp:pw@127.0.0.1:6390/0\n")
    environ = {"MEMP_ADMIN_KEY_FILE": str(tmp_path / "key"),
               "MEMP_REDIS_URL_FILE": str(tmp_path / "url")}
    settings = Settings.from_env(environ)
    assert settings.admin_key == "admin-key-from-a-file-0123"
    assert settings.redis_url == "redis://memp:pw@127.0.0.1:6390/0"
    flagged = Settings.from_env(environ, redis_url="redis://127.0.0.1:6391/0")
    assert flagged.redis_url == "redis://127.0.0.1:6391/0"


def test_an_empty_file_variable_means_unset() -> None:
    assert Settings.from_env({"MEMP_ADMIN_KEY_FILE": "", "MEMP_PORT": "9000"}).port == 9000


@pytest.mark.parametrize(
    ("contents", "message"),
    [
        pytest.param(None, "MEMP_ADMIN_KEY_FILE: cannot read .*: No such file or directory",
                     id="missing"),
        pytest.param(b"", "MEMP_ADMIN_KEY_FILE: .* is empty", id="empty"),
        pytest.param(b" \n\t\n", "MEMP_ADMIN_KEY_FILE: .* is empty", id="blank"),
        pytest.param(b"\xff\xfe-not-utf8-0123456789", "cannot read .*: not UTF-8 text",
                     id="not-utf8"),
        pytest.param(b"short", "MEMP_ADMIN_KEY must be at least 16", id="validated-too"),
    ],
)
def test_a_file_that_cannot_give_a_value_stops_the_start(
        tmp_path: Path, contents: bytes | None, message: str) -> None:
    path = tmp_path / "admin_key"
    if contents is not None:
        path.write_bytes(contents)
    with pytest.raises(SettingsError, match=message) as raised:
        Settings.from_env({"MEMP_ADMIN_KEY_FILE": str(path)})
    assert "\n" not in str(raised.value)


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="MEMP_JWT_SECRET_FILE: cannot read"):
        Settings.from_env({"MEMP_JWT_SECRET_FILE": str(tmp_path)})


def test_a_variable_and_its_file_together_stop_the_start(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("s" * 40)
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({"MEMP_JWT_SECRET": "t" * 40, "MEMP_JWT_SECRET_FILE": str(path)})
    assert str(raised.value) == ("MEMP_JWT_SECRET and MEMP_JWT_SECRET_FILE are both set; "
                                 "set one of them")


def test_purge_retention_from_a_file_must_agree_with_the_amp_name(tmp_path: Path) -> None:
    path = tmp_path / "retention"
    path.write_text("1\n")
    environ = {"MEMP_AMP_PURGE_RETENTION_FILE": str(path)}
    assert Settings.from_env(environ).amp_purge_retention is True
    with pytest.raises(SettingsError, match="disagree"):
        Settings.from_env({**environ, "AMP_PURGE_RETENTION": "0"})


def test_secrets_stay_out_of_repr() -> None:
    settings = Settings(redis_url="redis://memp:url-password@h:1/0", admin_key="a" * 20 + "xyz",
                        jwt_secret="jwt-secret-" + "j" * 30)
    shown = repr(settings)
    for secret in ("url-password", "axyz", "jwt-secret-"):
        assert secret not in shown
    assert "max_value_bytes=" in shown


def test_production_mode_is_a_configured_redis() -> None:
    assert Settings().production is False
    assert Settings(redis_url="redis://127.0.0.1:6379/0").production is True


@pytest.mark.parametrize(
    ("raw", "value"),
    [pytest.param(raw, value, id=raw) for raw, value in [
        ("1", True), ("0", False), ("true", True), ("false", False), ("yes", True), ("no", False),
        ("TRUE", True), ("False", False), ("Yes", True), ("NO", False), (" 1 ", True)]],
)
def test_bools_accept_the_usual_words(raw: str, value: bool) -> None:
    assert Settings.from_env({"MEMP_AMP_PURGE_RETENTION": raw}).amp_purge_retention is value


@pytest.mark.parametrize("raw", ["2", "on", "off", "y", "n", "truthy", "-1", "1.0"])
def test_bools_refuse_anything_else(raw: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({"MEMP_AMP_PURGE_RETENTION": raw})
    message = str(raised.value)
    assert message == (f"MEMP_AMP_PURGE_RETENTION must be one of 1, 0, true, false, yes, no, "
                       f"not {raw!r}")


@pytest.mark.parametrize("raw", ["1.5", "1e3", "0x10", "1_000", "abc", "nan", "inf", "١٢",
                                 "9" * 40, "+", "1 2"])
def test_ints_refuse_floats_and_junk(raw: str) -> None:
    with pytest.raises(SettingsError, match="MEMP_MAX_BATCH must be a whole number") as raised:
        Settings.from_env({"MEMP_MAX_BATCH": raw})
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("raw", "value"),
    [pytest.param("7", 7, id="plain"), pytest.param("+7", 7, id="plus"),
     pytest.param(" 7\n", 7, id="spaces")],
)
def test_ints_accept_whole_numbers(raw: str, value: int) -> None:
    assert Settings.from_env({"MEMP_MAX_BATCH": raw}).max_batch == value


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "Infinity", "1e400"])
def test_floats_refuse_what_is_not_finite(raw: str) -> None:
    with pytest.raises(SettingsError, match="MEMP_HEARTBEAT_SECONDS must be a finite number"):
        Settings.from_env({"MEMP_HEARTBEAT_SECONDS": raw})


@pytest.mark.parametrize(("raw", "value"), [("2", 2.0), ("0.5", 0.5), ("1e1", 10.0)])
def test_floats_accept_numbers(raw: str, value: float) -> None:
    assert Settings.from_env({"MEMP_HEARTBEAT_SECONDS": raw}).heartbeat_seconds == value


def test_text_is_kept_as_given() -> None:
    settings = Settings.from_env({"MEMP_CORS_ORIGINS": " https://a.example, https://b "})
    assert settings.cors_origins == " https://a.example, https://b "


# ---- AMP_PURGE_RETENTION (the AMP spec's name) and MEMP_AMP_PURGE_RETENTION ----


@pytest.mark.parametrize(
    ("environ", "value"),
    [
        pytest.param({}, False, id="neither"),
        pytest.param({"AMP_PURGE_RETENTION": "1"}, True, id="amp-name"),
        pytest.param({"MEMP_AMP_PURGE_RETENTION": "1"}, True, id="memp-name"),
        pytest.param({"AMP_PURGE_RETENTION": "0"}, False, id="amp-name-off"),
        pytest.param({"MEMP_AMP_PURGE_RETENTION": "0"}, False, id="memp-name-off"),
        pytest.param({"AMP_PURGE_RETENTION": "1", "MEMP_AMP_PURGE_RETENTION": "true"}, True,
                     id="both-on"),
        pytest.param({"AMP_PURGE_RETENTION": "no", "MEMP_AMP_PURGE_RETENTION": "0"}, False,
                     id="both-off"),
        pytest.param({"AMP_PURGE_RETENTION": "", "MEMP_AMP_PURGE_RETENTION": "1"}, True,
                     id="empty-is-unset"),
    ],
)
def test_purge_retention_is_read_under_both_names(environ: dict[str, str], value: bool) -> None:
    assert Settings.from_env(environ).amp_purge_retention is value


@pytest.mark.parametrize(
    ("amp", "memp"),
    [pytest.param("1", "0", id="amp-on"), pytest.param("false", "yes", id="memp-on")],
)
def test_purge_retention_names_that_disagree_stop_the_start(amp: str, memp: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({"AMP_PURGE_RETENTION": amp, "MEMP_AMP_PURGE_RETENTION": memp})
    assert str(raised.value) == (f"AMP_PURGE_RETENTION={amp!r} and "
                                 f"MEMP_AMP_PURGE_RETENTION={memp!r} disagree; set one of them")


def test_purge_retention_under_the_amp_name_is_parsed_as_a_bool() -> None:
    with pytest.raises(SettingsError, match="AMP_PURGE_RETENTION must be one of 1, 0, true"):
        Settings.from_env({"AMP_PURGE_RETENTION": "please"})


@pytest.mark.parametrize(("url", "replicas"), [
    (None, 0), ("redis://127.0.0.1:6390/0", 0), ("unix:///run/redis.sock", 0),
    ("redis+sentinel://127.0.0.1:26379/memp", 1), ("redis+cluster://127.0.0.1:7000", 1)])
def test_writes_wait_for_a_replica_by_default_on_replicated_topologies(
        url: str | None, replicas: int) -> None:
    """`MEMP_WRITE_REPLICAS` unset: 1 on Sentinel and Cluster, 0 on one server or embedded;
    set, it is what it says (0 included)."""
    environ = {"MEMP_REDIS_URL": url} if url else {}
    assert Settings.from_env(environ).replicas_to_confirm == replicas
    if url:
        assert Settings.from_env({**environ, "MEMP_WRITE_REPLICAS": "0"}
                                 ).replicas_to_confirm == 0
        assert Settings.from_env({**environ, "MEMP_WRITE_REPLICAS": "2"}
                                 ).replicas_to_confirm == 2
