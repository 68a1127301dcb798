"""The one way the page changes anything: a POST route made by :func:`action`, which refuses in
read-only mode, checks the CSRF token, calls the Python API off the event loop and redirects to
the page that shows the result (so reloading it does not repeat the action)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from sync.api import Engine
from sync.ui import csrf
from sync.ui.render import engine_of

# Takes the engine and the path parameters (ids as ints, a queue's name as text), does the
# thing, returns where to go next.
Perform = Callable[[Engine, dict[str, Any]], str]


def action(path: str, perform: Perform) -> Route:
    async def endpoint(request: Request) -> Response:
        if request.app.state.options.read_only:
            raise HTTPException(403, "this page is read-only (started with --read-only)")
        await csrf.verify(request)
        params = dict(request.path_params)
        location = await run_in_threadpool(perform, engine_of(request), params)
        return RedirectResponse(location, status_code=303)

    return Route(path, endpoint, methods=["POST"])
