"""Worker processes: alive, stale (no heartbeat lately: crashed, frozen or cut off) or stopped,
the run each is on, the lanes it gives each application queue and the providers whose
syncs it can run."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sync.ui.render import engine_of, render

NAV = ("Workers", "/workers")


def _context(request: Request) -> dict[str, object]:
    engine = engine_of(request)
    return {
        "workers": engine.worker_states(),
        "stale_after": engine.settings.stale_after,
    }


def page(request: Request) -> Response:
    return render(request, "workers.html", _context(request))


def live(request: Request) -> Response:
    return render(request, "_workers.html", _context(request))


routes: list[BaseRoute] = [Route("/workers", page), Route("/workers/live", live)]
