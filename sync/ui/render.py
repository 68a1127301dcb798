"""Renders a page: the template plus what every page shows (the menu, who is signed in,
read-only mode, the CSRF token its forms carry, how often live parts reload)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from sync.api import Engine
from sync.errors import Conflict, DatabaseUnavailable, InvalidInput, NotFound
from sync.overview import describe_progress
from sync.ui import display

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
templates.env.filters.update(
    timestamp=display.timestamp,
    duration=display.duration,
    error_headline=display.error_headline,
    error_details=display.error_details,
)
templates.env.globals.update(
    relative=display.relative, progress=display.progress, position=describe_progress
)


def render(
    request: Request, template: str, context: dict[str, Any] | None = None, *, status: int = 200
) -> Response:
    options = request.app.state.options
    common = {
        "nav": request.app.state.nav,
        "read_only": options.read_only,
        "refresh_seconds": options.refresh_seconds,
        "database": options.database,
        "user": getattr(request.state, "user", None),
        "csrf_token": getattr(request.state, "csrf_token", ""),
        "now": datetime.now(UTC),
    }
    return templates.TemplateResponse(
        request, template, {**common, **(context or {})}, status_code=status
    )


def engine_of(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def workspace_name(engine: Engine, workspace_id: int) -> str:
    """A workspace's name, for a page that would otherwise show its id."""
    try:
        return engine.workspace(workspace_id).name
    except NotFound:
        return f"#{workspace_id}"


def int_param(request: Request, name: str) -> int | None:
    """A query parameter that must be a number, or None when it is absent or empty."""
    value = request.query_params.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise HTTPException(400, f"{name} must be a number, not {value[:40]!r}")
    return int(value)


def choice_param(request: Request, name: str, allowed: tuple[str, ...]) -> str | None:
    """A query parameter that must be one of ``allowed``, or None when absent or empty."""
    value = request.query_params.get(name) or None
    if value is not None and value not in allowed:
        raise HTTPException(400, f"{name} must be one of {', '.join(allowed)}")
    return value


_STATUS = {NotFound: 404, Conflict: 409, InvalidInput: 400, DatabaseUnavailable: 503}


def status_of(exc: Exception) -> int:
    """The HTTP status of an engine's refusal."""
    return next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 400)


def error_page(
    request: Request, status: int, message: str, links: list[tuple[str, str]] | None = None
) -> Response:
    """A refusal: a page with the message and where to go to do what it says (``links``), or
    one line of text for a client that asked for no page."""
    if "text/html" not in request.headers.get("accept", ""):
        return Response(f"{status}: {message}\n", status_code=status, media_type="text/plain")
    context = {"status": status, "message": message, "links": links or []}
    return render(request, "error.html", context, status=status)
