"""`baton serve`'s login sessions and the browsers its users logged in from, held in Redis so
that they can end.

A session cookie is 32 random bytes (base64url, 43 characters) and nothing else. What it
stands for is a record under `keys.serve_session(<SHA-256 of the cookie>)`: the login's user,
scope and credential fingerprint (`Authenticator.fingerprint`) and the expiry, which is also
the record's Redis expiry. So:

- logging out deletes the record: every copy of the cookie is refused from then on;
- a changed password or scope, a removed login or a new `BATON_SERVE_SECRET` changes the
  login's fingerprint: a replica running the new configuration refuses the login's sessions
  (one still running the old configuration during a rolling update accepts them until it is
  replaced);
- a session lasts `session_hours` from its login, never extended;
- Redis holds digests of cookies, never cookies: reading it gives nobody a session.

Why records rather than a signed cookie with a per-user generation counter: ending one
browser's session at its logout would end all of the user's, and a password changed in the
configuration would still need the credential's fingerprint, since nothing would count up
the generation. A record costs one GET per request, on the Redis every answer reads anyway.

A browser cookie (`BROWSER_COOKIE`, made the same way, for `TRUSTED_BROWSER_S`) remembers
that a browser has logged in as a user: `limits` counts that browser's failed logins apart
from everybody else's, so an attacker failing as the user cannot lock the user out of it.
It grants nothing else.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from collections.abc import Callable

import redis

from orchestrator.control.server.auth import Authenticator, Principal
from orchestrator.core import keys

TRUSTED_BROWSER_S = 30 * 24 * 3600
"""How long a browser's failed logins count apart from others' after it last logged in."""
COOKIE_VALUE = re.compile(r"[A-Za-z0-9_-]{43}")
"""What `secrets.token_urlsafe(32)` makes; any other cookie is refused before Redis is asked."""


class Sessions:
    """Begins, finds and ends login sessions in Redis; remembers the browsers logins came
    from."""

    def __init__(
        self,
        client: redis.Redis,
        authenticator: Authenticator,
        session_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = client
        self.authenticator = authenticator
        self.session_s = session_s
        self.clock = clock

    def begin(self, who: Principal) -> str:
        """A new session for `who`, a login that just gave its password: its cookie."""
        fingerprint = self.authenticator.fingerprint(who.name)
        assert fingerprint is not None, f"{who.name} is not a login"
        cookie = secrets.token_urlsafe(32)
        record = {"user": who.name, "scope": who.scope, "fingerprint": fingerprint,
                  "expires_at": self.clock() + self.session_s}  # fmt: skip
        ttl_ms = max(1, int(self.session_s * 1000))
        self.redis.set(keys.serve_session(digest(cookie)), json.dumps(record), px=ttl_ms)
        return cookie

    def principal(self, cookie: str | None) -> Principal | None:
        """Who the session of `cookie` is, if it exists, has not expired and its login is
        still configured as it was when it began."""
        if cookie is None or not COOKIE_VALUE.fullmatch(cookie):
            return None
        raw = self.redis.get(keys.serve_session(digest(cookie)))
        if raw is None:
            return None
        try:
            record = json.loads(raw)
            user, fingerprint = str(record["user"]), str(record["fingerprint"])
            expires_at = float(record["expires_at"])
        except (ValueError, KeyError, TypeError):
            return None
        if expires_at <= self.clock():
            return None
        return self.authenticator.resume(user, fingerprint)

    def end(self, cookie: str | None) -> None:
        """Ends the session of `cookie`, for every copy of it."""
        if cookie is not None and COOKIE_VALUE.fullmatch(cookie):
            self.redis.delete(keys.serve_session(digest(cookie)))

    def trust_browser(self, user: str, cookie: str | None) -> str:
        """A new browser cookie naming `user`, who just logged in with it; the browser's
        previous one (`cookie`) stops counting."""
        if cookie is not None and COOKIE_VALUE.fullmatch(cookie):
            self.redis.delete(keys.serve_browser(digest(cookie)))
        fresh = secrets.token_urlsafe(32)
        self.redis.set(keys.serve_browser(digest(fresh)), user, ex=TRUSTED_BROWSER_S)
        return fresh

    def browser(self, cookie: str | None, user: str) -> str | None:
        """The digest of `cookie` if it is the cookie of a browser that logged in as `user`."""
        if cookie is None or not COOKIE_VALUE.fullmatch(cookie):
            return None
        found = digest(cookie)
        return found if self.redis.get(keys.serve_browser(found)) == user else None


def digest(cookie: str) -> str:
    """The name a cookie's record goes by in Redis (the cookie is ASCII: `COOKIE_VALUE`)."""
    return hashlib.sha256(cookie.encode()).hexdigest()
