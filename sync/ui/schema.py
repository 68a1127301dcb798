"""A connection's typed views, for the people who query them: the schema, each table's view
and companion, their columns and types, and every change its syncs made."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sync.ui.render import engine_of, render, workspace_name

NAV = None


def page(request: Request) -> Response:
    engine = engine_of(request)
    connection = engine.connection(request.path_params["connection_id"])
    return render(
        request,
        "schema.html",
        {
            "connection": connection,
            "shown": engine.reader_schema(connection.id),
            "workspace_name": workspace_name(engine, connection.workspace_id),
        },
    )


routes: list[BaseRoute] = [Route("/connections/{connection_id:int}/schema", page)]
