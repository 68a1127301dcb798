"""Workspaces and their connections: status, schedule, next run, the run in flight and how the
last one ended. Actions: sync now, pause, resume."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sync.api import Engine
from sync.ui.actions import action
from sync.ui.render import engine_of, render

NAV = ("Connections", "/connections")


def _context(request: Request) -> dict[str, object]:
    engine = engine_of(request)
    workspace = request.query_params.get("workspace")
    workspace_id = engine.workspace(workspace).id if workspace else None
    found = engine.connections_overview(workspace_id)
    groups: dict[tuple[int, str], list[object]] = {}
    for c in found:
        groups.setdefault((c.workspace_id, c.workspace_name), []).append(c)
    return {"groups": groups, "workspace": workspace or "", "count": len(found)}


def page(request: Request) -> Response:
    return render(request, "connections.html", _context(request))


def live(request: Request) -> Response:
    return render(request, "_connections.html", _context(request))


def _sync_now(engine: Engine, params: dict[str, Any]) -> str:
    return f"/runs/{engine.sync(params['connection_id']).id}"


def _pause(engine: Engine, params: dict[str, Any]) -> str:
    engine.pause(params["connection_id"])
    return "/connections"


def _resume(engine: Engine, params: dict[str, Any]) -> str:
    engine.resume(params["connection_id"])
    return "/connections"


routes: list[BaseRoute] = [
    Route("/connections", page),
    Route("/connections/live", live),
    action("/connections/{connection_id:int}/sync", _sync_now),
    action("/connections/{connection_id:int}/pause", _pause),
    action("/connections/{connection_id:int}/resume", _resume),
]
