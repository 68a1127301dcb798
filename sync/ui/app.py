"""Assembles the operator page: the page modules' routes, the static files, access control,
CSRF protection, security headers, and one error page for every mistake.

Each page is a module with ``NAV`` (its name and path in the menu, or None) and ``routes``;
adding a page is a module and a line in ``PAGES``. Pages call only
the Python API (``sync.api.Engine``), never SQL.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import psycopg
from psycopg_pool import PoolTimeout
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sync.api import Engine
from sync.base import redact
from sync.errors import SyncError
from sync.ui import (
    connection_forms,
    connections,
    ingestions,
    jobs,
    login,
    metrics,
    queues,
    runs,
    schema,
    workers,
)
from sync.ui.access import AccessMiddleware, AccessRule
from sync.ui.csrf import CsrfMiddleware
from sync.ui.render import error_page, status_of

log = logging.getLogger("sync.ui")

STATIC = Path(__file__).parent / "static"
PAGES: tuple[ModuleType, ...] = (
    connections,
    connection_forms,
    schema,
    runs,
    queues,
    jobs,
    ingestions,
    workers,
    metrics,
    login,
)

# Everything the page loads comes from this server: no inline script, no third-party origin.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


@dataclass(frozen=True)
class UiOptions:
    read_only: bool = False
    token: str | None = None
    auth_header: str | None = None
    refresh_seconds: float = 2.0  # how often live parts of a page reload
    database: str = ""  # which database, as shown in the footer (never with a password)

    @property
    def access(self) -> AccessRule:
        return AccessRule(token=self.token, auth_header=self.auth_header)


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                if not scope["path"].startswith("/static/"):  # pages are live; files are not
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(engine: Engine, options: UiOptions | None = None) -> Starlette:
    options = options or UiOptions()
    routes: list[BaseRoute] = [Route("/", lambda request: RedirectResponse("/connections", 303))]
    for page in PAGES:
        routes.extend(page.routes)
    routes.append(Mount("/static", StaticFiles(directory=STATIC), name="static"))
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(CsrfMiddleware),
            Middleware(AccessMiddleware, rule=options.access, sign_in=login.sign_in_page),
        ],
        exception_handlers={
            SyncError: _sync_error,
            HTTPException: _http_error,
            psycopg.OperationalError: _database_down,
            PoolTimeout: _database_down,
        },
    )
    if options.token:
        redact.register([options.token])  # scrubbed from any log line, like credentials
    app.state.engine = engine
    app.state.options = options
    app.state.nav = [page.NAV for page in PAGES if page.NAV is not None]
    app.state.metrics_registry = metrics.registry_for(engine)
    return app


async def _sync_error(request: Request, exc: Exception) -> Response:
    return error_page(request, status_of(exc), str(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_page(request, exc.status_code, exc.detail)


async def _database_down(request: Request, exc: Exception) -> Response:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    log.warning("a page could not reach the database: %s", first)
    return error_page(
        request,
        503,
        f"the database did not answer ({first}); check that Postgres is running and "
        "reachable, then reload",
    )
