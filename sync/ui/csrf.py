"""Cross-site request forgery protection for the page's actions (every POST).

A browser gets a random value in a cookie; each page carries ``HMAC(server secret, that
value)`` in its forms (field ``csrf_token``) and for scripts in a meta tag (header
``X-CSRF-Token``). A POST must carry the token that matches its cookie. Another site can make a
browser send the cookie along with a forged POST, but it cannot read the page, so it cannot
know the token. The secret lives only in this process: after a restart an open page's token no
longer matches and its next action asks for a reload; the cookie stays valid, so reloading is
all it takes.

This is small enough to keep here: the middleware libraries for it either let a POST without
cookies through (a forged form aimed at an open page on 127.0.0.1 has none) or keep refusing a
signed cookie that a restarted server can no longer verify.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from http.cookies import SimpleCookie

from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COOKIE = "connector_sync_csrf"
FIELD = "csrf_token"
HEADER = "x-csrf-token"
_COOKIE_BYTES = 32


class CsrfMiddleware:
    """Makes sure the browser has a CSRF cookie and puts this request's token in
    ``request.state.csrf_token``. Checking a POST is :func:`verify`'s job."""

    def __init__(self, app: ASGIApp, secret: bytes | None = None) -> None:
        self.app = app
        self.secret = secret or secrets.token_bytes(32)

    def token_for(self, cookie: str) -> str:
        return hmac.new(self.secret, cookie.encode(), hashlib.sha256).hexdigest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cookie = Request(scope).cookies.get(COOKIE, "")
        fresh = len(cookie) < _COOKIE_BYTES  # missing, or not one we made
        if fresh:
            cookie = secrets.token_urlsafe(_COOKIE_BYTES)
        state = scope.setdefault("state", {})
        state["csrf_cookie"] = cookie
        state["csrf_token"] = self.token_for(cookie)
        state["csrf_guard"] = self

        async def send_with_cookie(message: Message) -> None:
            if fresh and message["type"] == "http.response.start":
                jar: SimpleCookie = SimpleCookie()
                jar[COOKIE] = cookie
                jar[COOKIE]["path"] = "/"
                jar[COOKIE]["httponly"] = True
                jar[COOKIE]["samesite"] = "Lax"
                if scope.get("scheme") == "https":
                    jar[COOKIE]["secure"] = True
                MutableHeaders(scope=message).append("set-cookie", jar.output(header="").strip())
            await send(message)

        await self.app(scope, receive, send_with_cookie)


async def verify(request: Request) -> None:
    """Refuse (403) a POST whose token is missing or does not match its cookie."""
    guard: CsrfMiddleware = request.state.csrf_guard
    submitted = request.headers.get(HEADER)
    if submitted is None:
        form = await request.form()
        value = form.get(FIELD)
        submitted = value if isinstance(value, str) else None
    cookie = request.cookies.get(COOKIE)
    if not submitted or not cookie:
        raise HTTPException(403, "this action needs the page's CSRF token; reload the page")
    if not hmac.compare_digest(submitted, guard.token_for(cookie)):
        raise HTTPException(
            403,
            "this page is out of date (the server restarted, or it came from elsewhere); "
            "reload it and try again",
        )
