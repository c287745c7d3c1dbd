"""Who may use `baton serve`, and for what.

Two kinds of credential, each with a scope — `read` (look) or `control` (look, cancel, resume):

- **logins** for people, in the browser: `BATON_SERVE_USER` / `BATON_SERVE_PASSWORD` (one
  login with the control scope, as Flower has), and `BATON_SERVE_LOGINS`, a JSON object of
  more: `{"ana": "control:<password>", "viewer": "read:<password>"}`. A login becomes a
  session cookie: signed (HMAC-SHA256), HttpOnly, SameSite=Strict, expiring.
- **tokens** for scripts: `BATON_SERVE_TOKENS`, `{"ci": "read:<token>"}`, sent as
  `Authorization: Bearer <token>`. The name is what the log says, never the token.

A request that changes something with a session cookie must also carry the header
`X-Baton-Request` (the web UI's fetch sends it); a form or link on another site cannot add a
header, so it cannot make a logged-in browser cancel a run. Every secret is compared in
constant time and held as a `SecretStr`, so that it never reaches a log line or a repr.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from orchestrator.errors import ConfigError
from orchestrator.settings import BatonSettings, refuse_placeholders

Scope = Literal["read", "control"]
SCOPES: tuple[Scope, ...] = ("read", "control")

SESSION_COOKIE = "baton_session"
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
    """Signs session cookies; every replica behind one address needs the same. Without it each
    process makes its own, and its sessions end when it does."""
    session_hours: float = 12.0
    secure_cookies: bool = False
    """Mark the session cookie `Secure` (set it when the UI is served over HTTPS)."""
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

    @field_validator("logins", "tokens")
    @classmethod
    def _scoped(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, secret in value.items():
            scope, sep, rest = secret.get_secret_value().partition(":")
            if not sep or scope not in SCOPES or not rest:
                raise ValueError(
                    f"{name!r}: expected '<scope>:<secret>' with scope one of {', '.join(SCOPES)}"
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
    """Checks passwords, bearer tokens and session cookies against the configured ones."""

    def __init__(self, settings: ServeSettings) -> None:
        self.logins = _credentials(settings.logins)
        if settings.user and settings.password:
            password = settings.password.get_secret_value().encode()
            self.logins[settings.user] = _Credential(settings.user, "control", password)
        elif settings.user or settings.password:
            raise ConfigError("set both BATON_SERVE_USER and BATON_SERVE_PASSWORD, or neither")
        self.tokens = list(_credentials(settings.tokens).values())
        key = settings.secret.get_secret_value() if settings.secret else secrets.token_hex(32)
        self._key = hashlib.sha256(b"baton-session:" + key.encode()).digest()
        self.session_s = settings.session_hours * 3600

    @property
    def configured(self) -> bool:
        return bool(self.logins or self.tokens)

    def log_in(self, user: str, password: str) -> Principal | None:
        found = self.logins.get(user)
        # Compare against something even for an unknown user, so that timing does not tell.
        expected = found.secret if found else secrets.token_bytes(16)
        if not hmac.compare_digest(expected, password.encode()) or found is None:
            return None
        return Principal(found.name, found.scope, "session")

    def bearer(self, token: str) -> Principal | None:
        match = None
        for credential in self.tokens:  # every one compared: no early exit to time
            if hmac.compare_digest(credential.secret, token.encode()):
                match = credential
        return Principal(match.name, match.scope, "token") if match else None

    def session_cookie(self, principal: Principal, *, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + self.session_s)
        body = json.dumps({"u": principal.name, "s": principal.scope, "e": expires})
        payload = base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")
        return f"{payload}.{self._sign(payload)}"

    def session(self, cookie: str, *, now: float | None = None) -> Principal | None:
        """The principal a session cookie stands for, if it is ours, unexpired, and its login
        still exists with the same scope."""
        payload, _, signature = cookie.partition(".")
        if not hmac.compare_digest(self._sign(payload), signature):
            return None
        try:
            body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            user, scope, expires = str(body["u"]), body["s"], float(body["e"])
        except (ValueError, KeyError, TypeError):
            return None
        login = self.logins.get(user)
        if expires < (time.time() if now is None else now) or login is None:
            return None
        if login.scope != scope:
            return None
        return Principal(user, login.scope, "session")

    def _sign(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()


def _value(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret else None


def _credentials(table: dict[str, SecretStr]) -> dict[str, _Credential]:
    found = {}
    for name, value in table.items():
        scope, _, secret = value.get_secret_value().partition(":")
        found[name] = _Credential(name, scope, secret.encode())  # type: ignore[arg-type]
    return found
