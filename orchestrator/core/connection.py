"""How Baton reaches Redis: the URLs it accepts, and the TLS options of every client it builds.

Every Redis client Baton makes — the run store and the quota governor (redis-py), Celery's
broker (kombu), `baton serve` (a store and a dispatcher), Flower's broker page — takes its
options from a `RedisConfig`, so that one setting, `BATON_REDIS_CA_FILE`, gives all of them
TLS with the server's certificate and name verified. (Left to itself, kombu would connect to a
`rediss://` URL without checking the certificate at all.)

A URL read from the environment is checked before anything connects (`checked_config`); the
rules, and why (docs/redis.md):

- `redis://` or `rediss://` (TLS), and no query string: connection options are Baton's to set
  (`?ssl_cert_reqs=none` would turn verification off without a word);
- a password, where the URL has one, of at least `MIN_PASSWORD_CHARS` characters and not an
  example file's placeholder;
- a Redis that is not on this host's loopback needs both a user and a password: each Baton role
  logs in as its own ACL user (k8s/baton/redis-users.acl), never as Redis's `default`
  superuser by accident of a URL without a user.
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.errors import ConfigError
from orchestrator.core.secret_settings import PLACEHOLDERS

MIN_PASSWORD_CHARS = 16
"""The shortest Redis password Baton accepts, on the client and (k8s/baton/redis-users.sh) on
the server. Redis answers AUTH as fast as a network allows and never locks a user out, so a
password must hold out against online guessing at full speed: 16 characters of
`openssl rand -hex` are 64 random bits, some 5·10^5 years at a million guesses a second."""
SCHEMES = ("redis", "rediss")


class RedisConfig(BaseModel):
    """Where Redis is and how to trust it. Build it with `checked_config` from anything a
    person typed; tests and benchmarks that start their own redis-server build it directly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(repr=False)
    """`redis://` or `rediss://` URL; may carry a password, so it is left out of the repr."""
    ca_file: Path | None = None
    """The CA bundle a `rediss://` server's certificate must chain to, besides the system's."""

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme.lower() == "rediss"

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for redis-py (`Redis.from_url`): certificate and host name checked
        against `ca_file` (and the system's CAs) for `rediss://`; nothing for `redis://`."""
        if not self.tls:
            return {}
        options: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
        if self.ca_file is not None:
            options["ssl_ca_certs"] = str(self.ca_file)
        return options

    def broker_ssl(self) -> dict[str, Any] | None:
        """Celery's `broker_use_ssl` (kombu passes it to redis-py; Flower's broker page too):
        the same checks as `client_options`, or None for `redis://`."""
        if not self.tls:
            return None
        options = self.client_options()
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED  # kombu and Flower compare to the constant
        return options


def checked_config(
    url: str, ca_file: Path | None = None, *, variable: str = "BATON_REDIS_URL"
) -> RedisConfig:
    """A `RedisConfig` for a URL that keeps the rules above.

    Raises:
        ConfigError: naming `variable` and what is wrong (never the password).
    """
    check_url(url, variable=variable)
    if ca_file is not None and not ca_file.is_file():
        raise ConfigError(f"BATON_REDIS_CA_FILE names {ca_file}, which is not a readable file")
    return RedisConfig(url=url, ca_file=ca_file)


def check_url(url: str, *, variable: str = "BATON_REDIS_URL") -> None:
    """Raises `ConfigError` unless `url` keeps the rules of this module's docstring."""
    try:
        parts = urlsplit(url)
        # `.port` raises for a port that is not a number.
        host, password, user, _ = parts.hostname, parts.password, parts.username, parts.port
    except ValueError as exc:
        raise ConfigError(f"{variable} is not a valid URL: {exc}") from None
    if parts.scheme.lower() not in SCHEMES:
        raise ConfigError(
            f"{variable} must start with redis:// or rediss:// (TLS), e.g. "
            "rediss://worker:<password>@redis.example:6379/0"
        )
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        raise ConfigError(
            f"{variable} must not carry a query string: Baton sets the connection options "
            "itself (TLS: use rediss:// and BATON_REDIS_CA_FILE)"
        )
    if not host:
        raise ConfigError(f"{variable} names no host")
    if password is not None:
        _check_password(unquote(password), variable)
    if not is_loopback(host) and not (user and password):
        raise ConfigError(
            f"{variable} points at {host}, which is not this host, without a user and a "
            "password: log in as the role's own Redis user, e.g. "
            "redis://worker:<password>@host:6379/0 (docs/redis.md)"
        )


def _check_password(password: str, variable: str) -> None:
    if password.startswith(PLACEHOLDERS):
        raise ConfigError(
            f"the password in {variable} is still the example's placeholder; set your own "
            "(openssl rand -hex 32)"
        )
    if len(password) < MIN_PASSWORD_CHARS:
        raise ConfigError(
            f"the password in {variable} is shorter than {MIN_PASSWORD_CHARS} characters; "
            "use a random one (openssl rand -hex 32)"
        )


def is_loopback(host: str) -> bool:
    """`localhost`, or an address of the loopback network (127.0.0.0/8, ::1). Any other name
    counts as remote, even one that resolves to loopback: what is checked is what was written."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
