"""The login form's answers: a session for a right password, a 429 page after too many wrong
ones, and logout; where a login may send the browser next.

Cookies are HttpOnly, SameSite=Strict, for the whole site, and `Secure` when the request came
over HTTPS — to `baton serve` itself or to a proxy it is told to believe
(`forwarded_allow_ips`) — or when `secure_cookies` says so. On plain HTTP on loopback (the
demo, a port-forward) they are not, or the browser would not send them back.
"""

from __future__ import annotations

import logging
import math
from html import escape
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from orchestrator.control.server.auth import (
    BROWSER_COOKIE,
    SESSION_COOKIE,
    Authenticator,
    ServeSettings,
)
from orchestrator.control.server.limits import LoginLimiter
from orchestrator.control.server.sessions import TRUSTED_BROWSER_S, Sessions

logger = logging.getLogger(__name__)

NEXT_MAX_CHARS = 2000
"""A longer `next` is refused (the UI's own paths are well under 200 characters)."""
WAIT_SLOT = '<p id="login-wait" class="error" role="alert" hidden></p>'
NEXT_SLOT = '<input id="next" name="next" type="hidden" value="/">'
"""The elements of login.html that the 429 page fills in."""


def login_routes(
    page: Path,
    authenticator: Authenticator,
    sessions: Sessions,
    limiter: LoginLimiter,
    settings: ServeSettings,
) -> APIRouter:
    """GET and POST /login (the form is `page`), POST /logout."""
    app = APIRouter(include_in_schema=False)

    @app.get("/login")
    def login_page() -> Response:
        return FileResponse(page)

    @app.post("/login")
    async def log_in(request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        user, password = form.get("user", [""])[0], form.get("password", [""])[0]
        target = safe_next(form.get("next", ["/"])[0])
        address = request.client.host if request.client else "unknown"
        browser = sessions.browser(request.cookies.get(BROWSER_COOKIE), user)
        attempt = limiter.begin(limiter.counters(address, user, browser))
        if attempt.retry_after_s is not None:  # as often as a client asks: no warning each
            logger.info("login for %r from %s refused: too many failures", user[:100], address)
            return wait_page(page, attempt.retry_after_s, target)
        who = authenticator.log_in(user, password)
        if who is None:
            logger.warning("failed login for %r from %s", user[:100], address)
            return RedirectResponse(f"/login?failed=1&next={quote(target)}", status_code=303)
        limiter.succeeded(attempt)
        sessions.end(request.cookies.get(SESSION_COOKIE))  # a new login, a new session id
        secure = settings.secure_cookies or request.url.scheme == "https"
        reply = RedirectResponse(target, status_code=303)
        session = sessions.begin(who)
        _set_cookie(reply, SESSION_COOKIE, session, sessions.session_s, secure)
        trusted = sessions.trust_browser(who.name, request.cookies.get(BROWSER_COOKIE))
        _set_cookie(reply, BROWSER_COOKIE, trusted, TRUSTED_BROWSER_S, secure)
        return reply

    @app.post("/logout")
    def log_out(request: Request) -> Response:
        sessions.end(request.cookies.get(SESSION_COOKIE))
        reply = RedirectResponse("/login", status_code=303)
        reply.delete_cookie(SESSION_COOKIE, path="/")
        return reply

    return app


def safe_next(target: str) -> str:
    """`target` if a browser sent there stays on this site, else `/`.

    Kept: a path of printable ASCII that starts with exactly one `/` and holds no backslash
    (browsers read `/\\host` as `//host`, another site) — no scheme, no space, no control
    character (browsers drop a tab or newline, so `/\\t/host` is `//host` too), no `.` or `..`
    segment (`/..//host` is the path `//host`, which a script reading it could follow). The
    same holds of each percent-decoding of it in turn, so that a proxy or a page that decodes
    it once more cannot make `/%2F%2Fhost` or `/%5Chost` of it."""
    if len(target) > NEXT_MAX_CHARS or not all("!" <= c <= "~" for c in target):
        return "/"
    seen = target
    for _ in range(len(target)):  # each decoding that changes it makes it shorter
        if not seen.startswith("/") or seen.startswith("//") or "\\" in seen:
            return "/"
        if any(c <= " " or c == "\x7f" for c in seen) or _dot_segment(seen):
            return "/"
        decoded = unquote(seen)
        if decoded == seen:
            return target
        seen = decoded
    return "/"


def _dot_segment(target: str) -> bool:
    path = target.split("?", 1)[0].split("#", 1)[0]
    return any(segment in (".", "..") for segment in path.split("/"))


def wait_page(page: Path, retry_after_s: int, target: str) -> Response:
    """The login form with a 429: how long to wait before trying again."""
    minutes = math.ceil(retry_after_s / 60)
    wait = f"{minutes} minutes" if minutes > 1 else f"{retry_after_s} seconds"
    message = f"Too many failed logins. Wait {wait} before you try again."
    html = page.read_text()
    html = html.replace(WAIT_SLOT, f'<p id="login-wait" class="error" role="alert">{message}</p>')
    html = html.replace(NEXT_SLOT, NEXT_SLOT.replace('value="/"', f'value="{escape(target)}"'))
    return HTMLResponse(html, status_code=429, headers={"Retry-After": str(retry_after_s)})


def _set_cookie(reply: Response, name: str, value: str, max_age_s: float, secure: bool) -> None:
    reply.set_cookie(
        name, value, max_age=int(max_age_s), httponly=True, samesite="strict", secure=secure,
        path="/",
    )  # fmt: skip
