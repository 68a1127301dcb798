"""Runs, live: the list (filtered by status, connection or workspace) and one run's page with
its progress, every attempt in order with its whole error, and the per-table results. Actions:
cancel and retry."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sync.api import Engine
from sync.ui.actions import action
from sync.ui.render import engine_of, int_param, render
from sync.vocabulary import RunStatus

NAV = ("Runs", "/runs")
STATUSES = tuple(RunStatus)
LIMIT = 100


def _list_context(request: Request) -> dict[str, object]:
    engine = engine_of(request)
    status = request.query_params.get("status") or None
    if status is not None and status not in STATUSES:
        raise HTTPException(400, f"status must be one of {', '.join(STATUSES)}")
    connection_id = int_param(request, "connection")
    workspace_id = int_param(request, "workspace")
    found = engine.runs(
        connection_id=connection_id,
        status=RunStatus(status) if status else None,
        workspace_id=workspace_id,
        limit=LIMIT,
    )
    query = request.url.query
    return {
        "runs": found,
        "statuses": STATUSES,
        "status": status or "",
        "connection": connection_id,
        "workspace": workspace_id,
        "query": ("?" + query) if query else "",
        "limit": LIMIT,
    }


def list_page(request: Request) -> Response:
    return render(request, "runs.html", _list_context(request))


def list_live(request: Request) -> Response:
    return render(request, "_runs.html", _list_context(request))


def _run_context(request: Request) -> dict[str, object]:
    engine = engine_of(request)
    run_id = request.path_params["run_id"]
    return {"run": engine.run(run_id), "attempts": engine.attempts(run_id)}


def run_page(request: Request) -> Response:
    return render(request, "run.html", _run_context(request))


def run_live(request: Request) -> Response:
    return render(request, "_run.html", _run_context(request))


def _cancel(engine: Engine, params: dict[str, Any]) -> str:
    return f"/runs/{engine.cancel_run(params['run_id']).id}"


def _retry(engine: Engine, params: dict[str, Any]) -> str:
    return f"/runs/{engine.retry_run(params['run_id']).id}"


routes: list[BaseRoute] = [
    Route("/runs", list_page),
    Route("/runs/live", list_live),
    Route("/runs/{run_id:int}", run_page),
    Route("/runs/{run_id:int}/live", run_live),
    action("/runs/{run_id:int}/cancel", _cancel),
    action("/runs/{run_id:int}/retry", _retry),
]
