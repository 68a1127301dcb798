"""Ingestions: files being indexed for search, the newest first, filtered by status or
workspace, and one ingestion's page with its progress, results and whole error. Action:
cancel a queued or running ingestion."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sync.api import Engine
from sync.ingestions.models import IngestionStatus
from sync.ui.actions import action, back_to
from sync.ui.render import choice_param, engine_of, int_param, render, workspace_name

NAV = ("Ingestions", "/ingestions")
STATUSES = tuple(s.value for s in IngestionStatus)
LIMIT = 100


def _list_context(request: Request) -> dict[str, object]:
    engine = engine_of(request)
    status = choice_param(request, "status", STATUSES)
    workspace_id = int_param(request, "workspace")
    found = engine.ingestions(workspace_id=workspace_id, status=status, limit=LIMIT)
    query = request.url.query
    return {
        "ingestions": found,
        "statuses": STATUSES,
        "status": status or "",
        "workspace": workspace_id,
        "query": ("?" + query) if query else "",
        "limit": LIMIT,
    }


def list_page(request: Request) -> Response:
    return render(request, "ingestions.html", _list_context(request))


def list_live(request: Request) -> Response:
    return render(request, "_ingestions.html", _list_context(request))


def _one_context(request: Request) -> dict[str, object]:
    engine = engine_of(request)
    ingestion = engine.ingestion(request.path_params["ingestion_id"])
    return {
        "ingestion": ingestion,
        "workspace_name": workspace_name(engine, ingestion.workspace_id),
    }


def one_page(request: Request) -> Response:
    return render(request, "ingestion.html", _one_context(request))


def one_live(request: Request) -> Response:
    return render(request, "_ingestion.html", _one_context(request))


def _cancel(engine: Engine, params: dict[str, Any]) -> str:
    return f"/ingestions/{engine.cancel_ingestion(params['ingestion_id']).id}"


BACK = back_to(
    "ingestion #{ingestion_id}", "/ingestions/{ingestion_id}", ("the ingestions", "/ingestions")
)

routes: list[BaseRoute] = [
    Route("/ingestions", list_page),
    Route("/ingestions/live", list_live),
    Route("/ingestions/{ingestion_id:int}", one_page),
    Route("/ingestions/{ingestion_id:int}/live", one_live),
    action("/ingestions/{ingestion_id:int}/cancel", _cancel, BACK),
]
