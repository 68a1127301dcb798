"""The application queues: per queue its policy, jobs queued, active, retrying and dead (the dead
letters waiting in it), how long the oldest due job has waited, the lanes live workers give it,
and its cron schedule. Action: redrive a queue's dead letters back to the queues they were sent
to."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sync.api import Engine
from sync.ui.actions import action, back_to
from sync.ui.render import engine_of, int_param, render

NAV = ("Queues", "/queues")


def _context(request: Request) -> dict[str, object]:
    engine = engine_of(request)
    specs = {spec.name: spec for spec in engine.queues.list_queues()}
    schedules = {s.queue: s for s in engine.queues.list_schedules()}
    return {
        "stats": engine.queues.queue_stats(),
        "specs": specs,
        "schedules": schedules,
        "lanes": engine.lanes_online(),
        "redriven": int_param(request, "redriven"),
        "skipped": int_param(request, "skipped"),
        "redriven_queue": request.query_params.get("queue", ""),
    }


def page(request: Request) -> Response:
    return render(request, "queues.html", _context(request))


def live(request: Request) -> Response:
    return render(request, "_queues.html", _context(request))


def _redrive(engine: Engine, params: dict[str, Any]) -> str:
    queue = params["queue"]
    done = engine.queues.redrive(queue)
    query = urlencode(
        {"queue": queue, "redriven": len(done.redriven), "skipped": len(done.skipped)}
    )
    return f"/queues?{query}"


BACK = back_to("the queues", "/queues", ("the queues", "/queues"))

routes: list[BaseRoute] = [
    Route("/queues", page),
    Route("/queues/live", live),
    action("/queues/{queue}/redrive", _redrive, BACK),
]
