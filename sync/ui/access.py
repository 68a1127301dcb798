"""Who may use the operator page.

Bound to a loopback address, it may run open: only this machine reaches it. On any other
address it refuses to start unless requests are authenticated, by a token the operator sets
(``CONNECTOR_SYNC_UI_TOKEN``) or by a header that a reverse proxy in front of it sets after its
own login (``--auth-header``). With a token, a request must carry it (``Authorization: Bearer``,
for scripts and Prometheus) or the session cookie that signing in with it sets; anything else
gets 401. The token itself never appears in a page, a cookie or a log line.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sync.errors import InvalidInput

SESSION_COOKIE = "connector_sync_session"
MIN_TOKEN_LENGTH = 16
OPEN_PATHS = ("/static/", "/login")  # the sign-in page and the files it needs


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` exposes the page to this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name may resolve to any interface


@dataclass(frozen=True)
class AccessRule:
    token: str | None = None
    auth_header: str | None = None

    @property
    def open(self) -> bool:
        return self.token is None and self.auth_header is None

    def check(self, host: str) -> None:
        """Refuse to start on a non-loopback address without authentication, or with a token
        short enough to guess."""
        if self.token is not None and len(self.token) < MIN_TOKEN_LENGTH:
            raise InvalidInput(
                f"CONNECTOR_SYNC_UI_TOKEN is too short: use at least {MIN_TOKEN_LENGTH} random "
                "characters (python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        if self.open and not is_loopback(host):
            raise InvalidInput(
                f"refusing to serve the operator page on {host} without authentication: set "
                "CONNECTOR_SYNC_UI_TOKEN, or pass --auth-header NAME behind a reverse proxy "
                "that sets it (or bind 127.0.0.1)"
            )

    def session_value(self) -> str:
        """The session cookie's value: derived from the token, so it never reveals it and
        changing the token signs everybody out."""
        assert self.token is not None
        return hmac.new(self.token.encode(), b"connector-sync ui session", "sha256").hexdigest()

    def token_matches(self, candidate: str) -> bool:
        assert self.token is not None
        # Digests of equal length, so the comparison says nothing about the token's length.
        digest = hashlib.sha256
        return hmac.compare_digest(
            digest(candidate.encode()).digest(), digest(self.token.encode()).digest()
        )

    def user(self, conn: HTTPConnection) -> str | None:
        """Who the request is from ("operator" for a token), or None if unauthenticated."""
        if self.auth_header is not None:
            name = conn.headers.get(self.auth_header, "").strip()
            return name or None
        if self.token is None:
            return "local"
        scheme, _, credential = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and credential and self.token_matches(credential.strip()):
            return "operator"
        cookie = conn.cookies.get(SESSION_COOKIE, "")
        if cookie and hmac.compare_digest(cookie, self.session_value()):
            return "operator"
        return None


class AccessMiddleware:
    """Answers 401 to an unauthenticated request (a browser gets the sign-in form with it) and
    puts the user in ``request.state.user``."""

    def __init__(
        self, app: ASGIApp, rule: AccessRule, sign_in: Callable[[Request], Response]
    ) -> None:
        self.app = app
        self.rule = rule
        self.sign_in = sign_in

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        user = self.rule.user(request)
        scope.setdefault("state", {})["user"] = user
        if user is None and not scope["path"].startswith(OPEN_PATHS):
            await self._unauthorized(request)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _unauthorized(self, request: Request) -> Response:
        if self.rule.auth_header is not None:
            return PlainTextResponse(
                "401: sign in through the proxy in front of this page (the request has no "
                f"{self.rule.auth_header} header)\n",
                status_code=401,
            )
        if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
            return self.sign_in(request)
        return PlainTextResponse(
            "401: send the token as `Authorization: Bearer TOKEN` (CONNECTOR_SYNC_UI_TOKEN)\n",
            status_code=401,
            headers={"www-authenticate": 'Bearer realm="connector-sync"'},
        )
