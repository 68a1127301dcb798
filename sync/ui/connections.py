"""Workspaces and their connections: status, schedule, next run, the run in flight and how the
last one ended. Actions: sync now, pause, resume; the forms that create a connection, change it
and replace its credentials are in ``sync.ui.connection_forms``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sync.api import Engine
from sync.errors import NotFound
from sync.models import Connection
from sync.ui.actions import Link, Refused, action, back_to
from sync.ui.render import engine_of, int_param, render
from sync.vocabulary import ConnectionStatus

NAV = ("Connections", "/connections")
BACK = back_to(
    "the connections",
    "/connections#connection-{connection_id}",
    ("the connections", "/connections"),
)

# What the page says after a change it made, by the code in its address (never text taken from
# the address itself, which anyone could write).
DONE = {
    "created": "Connection {name} created.",
    "updated": "Connection {name} updated.",
    "credentials": "New credentials stored for {name}; it is active.",
    "resumed": "Connection {name} resumed.",
}


def _context(request: Request) -> dict[str, object]:
    engine = engine_of(request)
    workspace = request.query_params.get("workspace")
    workspace_id = engine.workspace(workspace).id if workspace else None
    found = engine.connections_overview(workspace_id)
    groups: dict[tuple[int, str], list[object]] = {}
    for c in found:
        groups.setdefault((c.workspace_id, c.workspace_name), []).append(c)
    return {"groups": groups, "workspace": workspace or "", "count": len(found)}


def _notice(request: Request) -> dict[str, object]:
    """The sentence about what the last action did, and after a resume what it sets off."""
    done = request.query_params.get("done", "")
    connection_id = int_param(request, "connection")
    if done not in DONE or connection_id is None:
        return {}
    try:
        c = engine_of(request).connection(connection_id)
    except NotFound:  # deleted since: nothing to say about it
        return {}
    notice = DONE[done].format(name=c.name)
    if done == "resumed":
        notice += " " + resumed_note(c)
    return {"notice": notice}


def resumed_note(c: Connection) -> str:
    if c.schedule_every is None:
        return "It has no schedule: it syncs when you press Sync now."
    return "Its schedule makes it due now: a worker starts a sync, then it runs on schedule."


def page(request: Request) -> Response:
    return render(request, "connections.html", {**_context(request), **_notice(request)})


def live(request: Request) -> Response:
    return render(request, "_connections.html", _context(request))


def credentials_link(c: Connection, run_id: int | None = None) -> Link:
    path = f"/connections/{c.id}/credentials" + (f"?run={run_id}" if run_id else "")
    return (f"Give {c.name} new credentials", path)


def check_active(engine: Engine, connection_id: int, doing: str, run_id: int | None = None) -> None:
    """Refuse ``doing`` for a connection that cannot sync, saying what to do first."""
    c = engine.connection(connection_id)
    if c.status == ConnectionStatus.DISCONNECTED:
        raise Refused(
            409,
            f"cannot {doing}: connection {c.name} is disconnected, because the provider "
            "refused its credentials; give it new ones first (that makes it active again)",
            [credentials_link(c, run_id)],
        )
    if c.status == ConnectionStatus.PAUSED:
        raise Refused(
            409,
            f"cannot {doing}: connection {c.name} is paused; resume it first",
            [(f"Resume {c.name} on the connections page", f"/connections#connection-{c.id}")],
        )


def _sync_now(engine: Engine, params: dict[str, Any]) -> str:
    check_active(engine, params["connection_id"], "sync now")
    return f"/runs/{engine.sync(params['connection_id']).id}"


def _pause(engine: Engine, params: dict[str, Any]) -> str:
    engine.pause(params["connection_id"])
    return "/connections"


def _resume(engine: Engine, params: dict[str, Any]) -> str:
    c = engine.connection(params["connection_id"])
    if c.status == ConnectionStatus.DISCONNECTED:
        raise Refused(
            409,
            f"connection {c.name} is disconnected: the provider refused its credentials; give "
            "it new ones, which resumes it",
            [credentials_link(c)],
        )
    engine.resume(c.id)
    return f"/connections?done=resumed&connection={c.id}"


routes: list[BaseRoute] = [
    Route("/connections", page),
    Route("/connections/live", live),
    action("/connections/{connection_id:int}/sync", _sync_now, BACK),
    action("/connections/{connection_id:int}/pause", _pause, BACK),
    action("/connections/{connection_id:int}/resume", _resume, BACK),
]
