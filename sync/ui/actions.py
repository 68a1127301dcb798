"""The one way the page changes anything: a POST route made by :func:`action` (a button) or
:func:`form_action` (a form), which refuses in read-only mode, checks the CSRF token, calls the
Python API off the event loop and redirects to the page that shows the result (so reloading it
does not repeat the action).

Whatever an action refuses is a page that says what to do: the engine's refusal (or a
:class:`Refused` an action raises first, in the page's own words) with links to where it can be
done, and a form's mistakes are that form again with each problem beside its field
(:class:`FormInvalid`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from sync.api import Engine
from sync.errors import SyncError
from sync.ui import csrf
from sync.ui.render import engine_of, error_page, status_of

Link = tuple[str, str]  # a label and where it goes
# Takes the engine and the path parameters (ids as ints, a queue's name as text), does the
# thing, returns where to go next.
Perform = Callable[[Engine, dict[str, Any]], str]
# Where to go back to after a refusal, from the path parameters and the refusal's status.
Back = Callable[[dict[str, Any], int], Link]
# A form's submission: the engine, the path parameters and the fields; returns where to go next.
Submit = Callable[[Engine, dict[str, Any], FormData], str]
# The form's page again, as submitted, with what is wrong by field ("" for the form as a whole).
Show = Callable[[Request, FormData, dict[str, str]], Response]


class Refused(Exception):
    """An action the page refuses before asking the engine, with links to what to do instead."""

    def __init__(self, status: int, message: str, links: Sequence[Link] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.links = list(links)


class FormInvalid(Exception):
    """A form's input is wrong: the form again, with each problem beside its field."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" if k else v for k, v in errors.items()))
        self.errors = errors


def refuse_if_read_only(request: Request) -> None:
    if request.app.state.options.read_only:
        raise HTTPException(
            403, "this page is read-only (started with --read-only); act from the command line"
        )


async def _guard(request: Request) -> None:
    refuse_if_read_only(request)
    await csrf.verify(request)


def back_to(label: str, path: str, listing: Link) -> Back:
    """Back to the object an action was about (``label`` and ``path`` are templates of the
    action's path parameters: ``run #{run_id}``, ``/runs/{run_id}``), or to ``listing`` when
    that object is not there (404)."""

    def back(params: dict[str, Any], status: int) -> Link:
        if status == 404:
            return (f"Back to {listing[0]}", listing[1])
        return (f"Back to {label.format(**params)}", path.format(**params))

    return back


def _refusal(
    request: Request, exc: Exception, params: dict[str, Any], back: Back | None
) -> Response:
    links = list(exc.links) if isinstance(exc, Refused) else []
    status = exc.status if isinstance(exc, Refused) else status_of(exc)
    if back is not None:
        links.append(back(params, status))
    return error_page(request, status, str(exc), links)


def action(path: str, perform: Perform, back: Back | None = None) -> Route:
    async def endpoint(request: Request) -> Response:
        await _guard(request)
        params = dict(request.path_params)
        try:
            location = await run_in_threadpool(perform, engine_of(request), params)
        except (SyncError, Refused) as exc:
            return _refusal(request, exc, params, back)
        return RedirectResponse(location, status_code=303)

    return Route(path, endpoint, methods=["POST"])


def form_action(path: str, submit: Submit, show: Show, back: Back | None = None) -> Route:
    async def endpoint(request: Request) -> Response:
        await _guard(request)
        params = dict(request.path_params)
        form = await request.form()
        try:
            location = await run_in_threadpool(submit, engine_of(request), params, form)
        except FormInvalid as exc:
            return await run_in_threadpool(show, request, form, exc.errors)
        except (SyncError, Refused) as exc:
            return _refusal(request, exc, params, back)
        return RedirectResponse(location, status_code=303)

    return Route(path, endpoint, methods=["POST"])
