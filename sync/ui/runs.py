"""Runs, live: the list (filtered by status, connection or workspace) and one run's page with
its progress, every attempt in order with its whole error, and the per-table results. Actions:
cancel and retry; a run whose connection was disconnected by refused credentials links to the
form that replaces them instead of a retry that cannot work."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sync.api import Engine
from sync.errors import NotFound
from sync.models import Connection, Run
from sync.ui.actions import action, back_to
from sync.ui.connections import check_active
from sync.ui.render import engine_of, int_param, render, workspace_name
from sync.vocabulary import RunKind, RunStatus

NAV = ("Runs", "/runs")
STATUSES = tuple(RunStatus)
LIMIT = 100
RETRYABLE = (RunStatus.FAILED, RunStatus.CANCELLED)


def names(engine: Engine) -> dict[str, dict[int, str]]:
    """Connections' and workspaces' names by id: a page says ``tracker``, not ``3``."""
    return {
        "connection_names": {c.id: c.name for c in engine.connections()},
        "workspace_names": {w.id: w.name for w in engine.workspaces()},
    }


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
        **names(engine),
    }


def list_page(request: Request) -> Response:
    return render(request, "runs.html", _list_context(request))


def list_live(request: Request) -> Response:
    return render(request, "_runs.html", _list_context(request))


def _connection_of(engine: Engine, run: Run) -> Connection | None:
    if run.connection_id is None:
        return None
    try:
        return engine.connection(run.connection_id)
    except NotFound:  # purged since the run was read
        return None


def _run_context(request: Request) -> dict[str, object]:
    engine = engine_of(request)
    run_id = request.path_params["run_id"]
    run = engine.run(run_id)
    connection = _connection_of(engine, run)
    retryable = run.status in RETRYABLE and (
        run.kind == RunKind.PURGE or (connection is not None and connection.status == "active")
    )
    return {
        "run": run,
        "attempts": engine.attempts(run_id),
        "connection": connection,
        "retryable": retryable,
        "workspace_name": workspace_name(engine, run.workspace_id),
    }


def run_page(request: Request) -> Response:
    replaced = request.query_params.get("credentials") == "replaced"
    return render(request, "run.html", {**_run_context(request), "replaced": replaced})


def run_live(request: Request) -> Response:
    return render(request, "_run.html", _run_context(request))


def _cancel(engine: Engine, params: dict[str, Any]) -> str:
    return f"/runs/{engine.cancel_run(params['run_id']).id}"


def _retry(engine: Engine, params: dict[str, Any]) -> str:
    run = engine.run(params["run_id"])
    if run.connection_id is not None and run.status in RETRYABLE:
        check_active(engine, run.connection_id, f"retry run #{run.id}", run.id)
    return f"/runs/{engine.retry_run(run.id).id}"


BACK = back_to("run #{run_id}", "/runs/{run_id}", ("the runs", "/runs"))


routes: list[BaseRoute] = [
    Route("/runs", list_page),
    Route("/runs/live", list_live),
    Route("/runs/{run_id:int}", run_page),
    Route("/runs/{run_id:int}/live", run_live),
    action("/runs/{run_id:int}/cancel", _cancel, BACK),
    action("/runs/{run_id:int}/retry", _retry, BACK),
]
