"""The Redis URLs Baton accepts, and the TLS options every client it builds is given."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from orchestrator.core.connection import MIN_PASSWORD_CHARS, RedisConfig, checked_config
from orchestrator.core.errors import ConfigError
from orchestrator.core.queue import celery_config
from orchestrator.core.settings import QueueConfig, Settings
from orchestrator.core.store import connect

GOOD = "0123456789abcdef"
"""A password of exactly 16 characters."""


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",  # this host, no login: the demo's private redis-server
        "redis://localhost/0",
        "REDIS://LOCALHOST/0",  # a scheme and a host name are case-insensitive
        "redis://127.8.9.10:6379/0",  # all of 127.0.0.0/8 is loopback
        "redis://[::1]:6379/0",
        f"redis://worker:{GOOD}@redis.example:6379/0",
        f"rediss://worker:{GOOD}@10.0.0.7:6380/0",
        f"redis://:{GOOD}@127.0.0.1:6379/0",  # no user on this host: allowed
        f"redis://worker:{'%41' * 16}@redis:6379/0",  # 16 characters, written escaped
    ],
)
def test_urls_keeping_the_rules_are_accepted(url: str) -> None:
    assert checked_config(url).url == url


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis://redis:6379/0", "without a user and a password"),
        (f"redis://:{GOOD}@redis:6379/0", "without a user and a password"),  # the admin by default
        ("redis://worker@redis:6379/0", "without a user and a password"),
        (f"redis://worker:{GOOD}@redis:6379/0?ssl_cert_reqs=none", "query string"),
        (f"rediss://worker:{GOOD}@redis:6379/0?ssl_check_hostname=false", "query string"),
        (f"redis://worker:{GOOD}@redis:6379/0?", "query string"),
        (f"redis://worker:{GOOD}@redis:6379/0#x", "query string"),
        (f"unix://worker:{GOOD}@/run/redis.sock", "must start with redis:// or rediss://"),
        (f"http://worker:{GOOD}@redis:6379/0", "must start with redis:// or rediss://"),
        ("redis://worker:0123456789abcde@redis:6379/0", "shorter than 16 characters"),
        ("redis://worker:0123456789abcde@127.0.0.1:6379/0", "shorter than 16 characters"),
        (f"redis://worker:{'%41' * 15}@redis:6379/0", "shorter than 16 characters"),
        ("redis://worker:change-me-to-a-long-random-hex@redis/0", "placeholder"),
        ("redis://worker:replace-with-openssl-rand-hex-32@redis/0", "placeholder"),
        (f"redis://worker:{GOOD}@redis:port/0", "not a valid URL"),
        (f"redis://worker:{GOOD}@:6379/0", "names no host"),
    ],
)
def test_urls_breaking_a_rule_are_refused_saying_which(url: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        checked_config(url, variable="BATON_REDIS_URL")
    message = str(refused.value)
    assert said in message and "BATON_REDIS_URL" in message
    login = url.split("://", 1)[1].rpartition("@")[0]
    password = login.partition(":")[2]
    assert not password or password not in message


@pytest.mark.parametrize(
    "host",
    ["localhost.", "127.0.0.1.nip.io", "0.0.0.0", "[::ffff:127.0.0.1]", "2130706433", "10.1.2.3"],
)
def test_only_loopback_as_written_goes_without_a_login(host: str) -> None:
    """Names that may well reach this host count as remote: what is checked is what is
    written, never what a resolver answers."""
    with pytest.raises(ConfigError, match="without a user and a password"):
        checked_config(f"redis://{host}:6379/0")


def test_the_minimum_is_sixteen_characters() -> None:
    assert MIN_PASSWORD_CHARS == 16


def test_a_ca_file_that_is_not_there_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    with pytest.raises(ConfigError, match=f"BATON_REDIS_CA_FILE names {missing}"):
        checked_config(f"rediss://worker:{GOOD}@redis:6380/0", missing)


def test_tls_clients_check_the_certificate_and_the_host_name(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("a CA")
    tls = checked_config(f"rediss://worker:{GOOD}@redis:6380/0", ca)
    assert tls.client_options() == {
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
        "ssl_ca_certs": str(ca),
    }
    assert tls.broker_ssl() == {
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
        "ssl_check_hostname": True,
        "ssl_ca_certs": str(ca),
    }
    # The system's CAs alone, without a CA file: still verified.
    system = checked_config(f"rediss://worker:{GOOD}@redis:6380/0")
    assert system.client_options() == {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    plain = checked_config(f"redis://worker:{GOOD}@redis:6379/0", ca)
    assert (plain.client_options(), plain.broker_ssl()) == ({}, None)


def test_the_store_and_the_broker_take_the_tls_options(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("a CA")
    config = checked_config(f"rediss://worker:{GOOD}@redis:6380/0", ca)
    pool = connect(config).connection_pool
    assert pool.connection_class.__name__ == "SSLConnection"
    kwargs = pool.connection_kwargs
    assert (kwargs["ssl_cert_reqs"], kwargs["ssl_check_hostname"]) == ("required", True)
    assert kwargs["ssl_ca_certs"] == str(ca)
    celery = celery_config(config, QueueConfig())
    assert celery["broker_url"] == config.url
    assert celery["broker_use_ssl"]["ssl_cert_reqs"] == ssl.CERT_REQUIRED


def test_only_workers_acknowledge_through_redis() -> None:
    """A sender's or monitor's consumers (inspect replies, events) do not acknowledge through
    Redis, whose redelivery would need write access to the stage queues."""
    url = "redis://127.0.0.1:6379/0"
    assert "ack_emulation" not in celery_config(url, QueueConfig())["broker_transport_options"]
    options = celery_config(url, QueueConfig(), acks=False)["broker_transport_options"]
    assert options["ack_emulation"] is False


def test_settings_check_the_url_when_it_is_used_and_keep_the_password_out_of_repr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("BATON_REDIS_URL", "BATON_REDIS_URL_FILE", "BATON_REDIS_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="BATON_REDIS_URL is not set"):
        Settings().redis_section()
    monkeypatch.setenv("BATON_REDIS_URL", "redis://worker:short-secret@redis:6379/0")
    settings = Settings()
    assert "short-secret" not in repr(settings)
    with pytest.raises(ConfigError, match="shorter than 16 characters") as refused:
        settings.require_redis_url()
    assert "short-secret" not in str(refused.value)
    monkeypatch.setenv("BATON_REDIS_URL", f"redis://worker:{GOOD}@redis:6379/0")
    assert Settings().redis_section() == RedisConfig(url=f"redis://worker:{GOOD}@redis:6379/0")
