"""Jobs of the application queues: the newest first, filtered by queue and status, and one job's
page with its payload, progress, latest error and every attempt in order with its error.
Actions: cancel (queued, retrying or active) and retry (dead, cancelled, or retrying now)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sync.api import Engine
from sync.base import redact
from sync.queues import JobStatus
from sync.ui.actions import action, back_to
from sync.ui.render import choice_param, engine_of, render

NAV = ("Jobs", "/jobs")
STATUSES = tuple(s.value for s in JobStatus)
LIMIT = 100
CANCELLABLE = ("queued", "retrying", "active")
RETRYABLE = ("dead", "cancelled", "retrying")


def _list_context(request: Request) -> dict[str, object]:
    engine = engine_of(request)
    status = choice_param(request, "status", STATUSES)
    queue = request.query_params.get("queue") or None
    if queue is not None:
        engine.queues.get_queue(queue)  # a clear 404 for a queue that does not exist
    found = engine.queues.list_jobs(
        queue=queue, status=JobStatus(status) if status else None, limit=LIMIT
    )
    query = request.url.query
    return {
        "jobs": found,
        "statuses": STATUSES,
        "status": status or "",
        "queue": queue or "",
        "queues": [q.name for q in engine.queues.list_queues()],
        "query": ("?" + query) if query else "",
        "limit": LIMIT,
    }


def list_page(request: Request) -> Response:
    return render(request, "jobs.html", _list_context(request))


def list_live(request: Request) -> Response:
    return render(request, "_jobs.html", _list_context(request))


def payload_text(payload: Any) -> str:
    """A job's payload as indented JSON, with any registered secret scrubbed."""
    return redact.redact(json.dumps(payload, indent=2, sort_keys=True, default=str))


def _job_context(request: Request) -> dict[str, object]:
    engine = engine_of(request)
    job_id = request.path_params["job_id"]
    job = engine.queues.get_job(job_id)
    return {
        "job": job,
        "attempts": engine.queues.attempts(job_id),
        "payload": payload_text(job.payload),
        "done": job.status.value not in CANCELLABLE,
        "cancellable": CANCELLABLE,
        "retryable": RETRYABLE,
    }


def job_page(request: Request) -> Response:
    return render(request, "job.html", _job_context(request))


def job_live(request: Request) -> Response:
    return render(request, "_job.html", _job_context(request))


def _cancel(engine: Engine, params: dict[str, Any]) -> str:
    return f"/jobs/{engine.queues.cancel_job(params['job_id']).id}"


def _retry(engine: Engine, params: dict[str, Any]) -> str:
    return f"/jobs/{engine.queues.retry_job(params['job_id']).id}"


BACK = back_to("job #{job_id}", "/jobs/{job_id}", ("the jobs", "/jobs"))

routes: list[BaseRoute] = [
    Route("/jobs", list_page),
    Route("/jobs/live", list_live),
    Route("/jobs/{job_id:int}", job_page),
    Route("/jobs/{job_id:int}/live", job_live),
    action("/jobs/{job_id:int}/cancel", _cancel, BACK),
    action("/jobs/{job_id:int}/retry", _retry, BACK),
]
