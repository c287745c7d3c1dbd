"""Who may use `baton serve`, and for what.

Two kinds of credential, each with a scope — `read` (look) or `control` (look, cancel, resume):

- **logins** for people, in the browser: `BATON_SERVE_USER` / `BATON_SERVE_PASSWORD` (one
  login with the control scope, as Flower has), and `BATON_SERVE_LOGINS`, a JSON object of
  more: `{"ana": "control:<password>", "viewer": "read:<password>"}`. A login becomes a
  session held in Redis (`sessions`), which ends at logout and when the login's password or
  scope changes; failed logins are limited (`limits`).
- **tokens** for scripts: `BATON_SERVE_TOKENS`, `{"ci": "read:<token>"}`, sent as
  `Authorization: Bearer <token>`. The name is what the log says, never the token.

A request that changes something with a session cookie must also carry the header
`X-Baton-Request` (the web UI's fetch sends it); a form or link on another site cannot add a
header, so it cannot make a logged-in browser cancel a run. Every secret is held as a
`SecretStr`, so that it never reaches a log line or a repr, and compared as bytes in constant
time: as HMAC digests of one length under a key of this process, so that neither its content
nor its length shows in the time an answer takes, and any text a client sends (non-ASCII,
lone surrogates) compares as unequal instead of raising.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import BatonSettings, refuse_placeholders

Scope = Literal["read", "control"]
SCOPES: tuple[Scope, ...] = ("read", "control")

SESSION_COOKIE = "baton_session"
BROWSER_COOKIE = "baton_browser"
"""Names a browser that has logged in before (`sessions.Sessions.trust_browser`)."""
CSRF_HEADER = "X-Baton-Request"


class ServeSettings(BatonSettings):
    """`baton serve`'s configuration, from `BATON_SERVE_*` variables."""

    model_config = SettingsConfigDict(env_prefix="BATON_SERVE_", extra="ignore", frozen=True)

    user: str | None = None
    """`BATON_SERVE_USER`: one login with the control scope (with `BATON_SERVE_PASSWORD`)."""
    password: SecretStr | None = None
    logins: dict[str, SecretStr] = Field(default_factory=dict)
    """`BATON_SERVE_LOGINS`: user → `scope:password`, as a JSON object."""
    tokens: dict[str, SecretStr] = Field(default_factory=dict)
    """`BATON_SERVE_TOKENS`: name → `scope:token`, as a JSON object."""
    secret: SecretStr | None = None
    """Keys the fingerprint of each login's credential that its sessions hold; every replica
    behind one address needs the same. Without it each process makes its own, and its sessions
    end when it does; a new one ends every session."""
    session_hours: float = Field(default=12.0, gt=0)
    """How long a session lasts from its login (never extended by use)."""
    secure_cookies: bool = False
    """Mark the cookies `Secure` on every answer. Without it they are `Secure` when the request
    came over HTTPS: to `baton serve` itself, or to a proxy of `forwarded_allow_ips` that says so
    in `X-Forwarded-Proto`."""
    forwarded_allow_ips: str = ""
    """`BATON_SERVE_FORWARDED_ALLOW_IPS`: the proxies in front (addresses and networks,
    comma-separated, as uvicorn's `--forwarded-allow-ips`) whose `X-Forwarded-For` and
    `X-Forwarded-Proto` are believed. Empty: nobody's; the client is the connection's peer."""
    login_window_s: float = Field(default=900.0, gt=0)
    """The sliding window in which failed logins are counted."""
    login_failures_per_address: int = Field(default=20, ge=1)
    """Failed logins a client address (an IPv6 one by its /64) may have in the window, every
    user name together; more get a 429."""
    login_failures_per_user: int = Field(default=10, ge=1)
    """Failed logins one user name may have in the window from browsers it never logged in
    from, every address together; and each browser it did log in from, on its own."""
    flower_url: str | None = None
    """Where Flower is, for the UI's links to the task view."""
    max_body_bytes: int = 64 * 1024
    """Requests with a bigger body are refused (413) before it is read."""

    def check_secrets(self) -> None:
        """Raises `ConfigError` if a password, token or the cookie key is still an example
        file's placeholder (`baton serve` checks before it starts)."""
        secrets: dict[str, str | None] = {
            "BATON_SERVE_PASSWORD": _value(self.password),
            "BATON_SERVE_SECRET": _value(self.secret),
        }
        for table, variable in (
            (self.logins, "BATON_SERVE_LOGINS"),
            (self.tokens, "BATON_SERVE_TOKENS"),
        ):
            for name, value in table.items():
                secrets[f"{variable}[{name}]"] = value.get_secret_value().partition(":")[2]
        refuse_placeholders(secrets)

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxies(cls, value: str) -> str:
        for item in (part.strip() for part in value.split(",") if part.strip()):
            if item == "*":
                raise ValueError(
                    "'*' would believe the first X-Forwarded-For address, which any client "
                    "writes: list the proxies' addresses or networks"
                )
            try:  # as uvicorn reads them; it would take a typo for a name and trust nobody
                ipaddress.ip_network(item) if "/" in item else ipaddress.ip_address(item)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network") from None
        return value

    @field_validator("logins", "tokens")
    @classmethod
    def _scoped(cls, value: dict[str, SecretStr], info: ValidationInfo) -> dict[str, SecretStr]:
        for name, secret in value.items():
            scope, sep, rest = secret.get_secret_value().partition(":")
            if not sep or scope not in SCOPES or not rest:
                raise ValueError(
                    f"{name!r}: expected '<scope>:<secret>' with scope one of {', '.join(SCOPES)}"
                )
            if info.field_name == "tokens" and not all("!" <= c <= "~" for c in rest):
                raise ValueError(
                    f"{name!r}: a token travels in a header, which holds no spaces or "
                    "non-ASCII characters: use printable ASCII (openssl rand -hex 32)"
                )
        return value


@dataclass(frozen=True)
class Principal:
    """Who is asking: a login's user or a token's name, and what they may do."""

    name: str
    scope: Scope
    via: Literal["session", "token", "none"]

    @property
    def may_control(self) -> bool:
        return self.scope == "control"


ANONYMOUS_CONTROL = Principal("anonymous", "control", "none")
"""Everyone, when the server runs with `--no-auth`."""


@dataclass(frozen=True)
class _Credential:
    name: str
    scope: Scope
    secret: bytes


class Authenticator:
    """Checks passwords and bearer tokens against the configured ones, and says whether a
    session's login is still the one it was made for."""

    def __init__(self, settings: ServeSettings) -> None:
        self.logins = _credentials(settings.logins)
        if settings.user and settings.password:
            password = _utf8(settings.password.get_secret_value())
            self.logins[settings.user] = _Credential(settings.user, "control", password)
        elif settings.user or settings.password:
            raise ConfigError("set both BATON_SERVE_USER and BATON_SERVE_PASSWORD, or neither")
        self.tokens = list(_credentials(settings.tokens).values())
        self._compare_key = secrets.token_bytes(32)
        key = _utf8(settings.secret.get_secret_value()) if settings.secret else None
        self._fingerprint_key = hashlib.sha256(
            b"baton-credential:" + (key or secrets.token_bytes(32))
        ).digest()

    @property
    def configured(self) -> bool:
        return bool(self.logins or self.tokens)

    def log_in(self, user: str, password: str) -> Principal | None:
        found = self.logins.get(user)
        # Compare against something even for an unknown user, so that timing does not tell.
        expected = found.secret if found else self._compare_key
        if not self._same(expected, _utf8(password)) or found is None:
            return None
        return Principal(found.name, found.scope, "session")

    def bearer(self, token: str) -> Principal | None:
        match = None
        given = _utf8(token)
        for credential in self.tokens:  # every one compared: no early exit to time
            if self._same(credential.secret, given):
                match = credential
        return Principal(match.name, match.scope, "token") if match else None

    def fingerprint(self, user: str) -> str | None:
        """A digest of the login `user` as configured now (its name, scope and password),
        keyed by `BATON_SERVE_SECRET`; None if there is no such login. A session keeps the one
        of its login's, and stands only while they are equal."""
        login = self.logins.get(user)
        if login is None:
            return None
        message = b"\0".join((_utf8(login.name), login.scope.encode(), login.secret))
        return hmac.new(self._fingerprint_key, message, hashlib.sha256).hexdigest()

    def resume(self, user: str, fingerprint: str) -> Principal | None:
        """The principal of a session made for `user` when its credential had `fingerprint`,
        if the login still has it; None after a change of its password or scope, its removal,
        or a new `BATON_SERVE_SECRET`."""
        current = self.fingerprint(user)
        if current is None or not self._same(current.encode(), _utf8(fingerprint)):
            return None
        return Principal(user, self.logins[user].scope, "session")

    def _same(self, expected: bytes, given: bytes) -> bool:
        """Whether two secrets are equal, in a time that depends on neither's content or
        length."""
        return hmac.compare_digest(self._digest(expected), self._digest(given))

    def _digest(self, value: bytes) -> bytes:
        return hmac.new(self._compare_key, value, hashlib.sha256).digest()


def _utf8(text: str) -> bytes:
    """`text` as bytes, whatever a client sent: a lone surrogate is encoded, not refused."""
    return text.encode("utf-8", "surrogatepass")


def _value(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret else None


def _credentials(table: dict[str, SecretStr]) -> dict[str, _Credential]:
    found = {}
    for name, value in table.items():
        scope, _, secret = value.get_secret_value().partition(":")
        found[name] = _Credential(name, scope, _utf8(secret))  # type: ignore[arg-type]
    return found
