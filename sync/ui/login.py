"""Signing in with the page's token (``CONNECTOR_SYNC_UI_TOKEN``): a form that sets a session
cookie derived from the token, so a browser need not send the token itself again."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from sync.ui import csrf
from sync.ui.access import SESSION_COOKIE, AccessRule
from sync.ui.render import render

NAV = None


def _next(value: str | None) -> str:
    """Where to go after signing in: a path on this server, never another site."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def sign_in_page(request: Request, *, target: str | None = None, failed: bool = False) -> Response:
    """The sign-in form, answered with 401 to a browser that asked for a page unsigned."""
    if target is None:
        query = request.url.query
        target = request.url.path + (f"?{query}" if query else "")
    return render(request, "login.html", {"next": _next(target), "failed": failed}, status=401)


def form(request: Request) -> Response:
    rule: AccessRule = request.app.state.options.access
    if rule.token is None or request.state.user is not None:
        return RedirectResponse(_next(request.query_params.get("next")), status_code=303)
    return sign_in_page(request, target=request.query_params.get("next"))


async def submit(request: Request) -> Response:
    await csrf.verify(request)
    rule: AccessRule = request.app.state.options.access
    fields = await request.form()
    token, target = fields.get("token"), fields.get("next")
    if rule.token is None:
        return RedirectResponse("/", status_code=303)
    target = target if isinstance(target, str) else None
    if not isinstance(token, str) or not rule.token_matches(token):
        return sign_in_page(request, target=target, failed=True)
    response = RedirectResponse(_next(target), 303)
    response.set_cookie(
        SESSION_COOKIE,
        rule.session_value(),
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )
    return response


async def sign_out(request: Request) -> Response:
    await csrf.verify(request)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE)
    return response


routes: list[BaseRoute] = [
    Route("/login", form, methods=["GET"]),
    Route("/login", submit, methods=["POST"]),
    Route("/logout", sign_out, methods=["POST"]),
]
