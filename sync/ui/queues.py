"""The application queues: per queue its policy, jobs queued, active, retrying and dead (the dead
letters waiting in it), how long the oldest due job has waited, the lanes live workers give it,
its default priority and fleet-wide limits, and its cron schedule. Actions: send a job (a JSON
payload, a key, a priority, a delay), and redrive a queue's dead letters back to the queues
they were sent to."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sync.api import Engine
from sync.base.durations import parse_duration
from sync.errors import InvalidInput
from sync.queues.declarations import MAX_PRIORITY, MIN_PRIORITY
from sync.ui.actions import FormInvalid, action, back_to, form_action
from sync.ui.render import engine_of, int_param, render

NAV = ("Queues", "/queues")


def _context(
    request: Request, values: dict[str, str] | None = None, errors: dict[str, str] | None = None
) -> dict[str, object]:
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
        "values": values or {"payload": "{}"},
        "errors": errors or {},
        "priorities": range(MIN_PRIORITY, MAX_PRIORITY + 1),
    }


def page(request: Request) -> Response:
    return render(request, "queues.html", _context(request))


def _send_form_again(request: Request, form: FormData, errors: dict[str, str]) -> Response:
    values = {k: str(v) for k, v in form.items() if k != "csrf_token"}
    return render(request, "queues.html", _context(request, values, errors), status=422)


def read_send_form(form: FormData) -> dict[str, Any]:
    """The send form's fields as :meth:`send` takes them; FormInvalid names each field that is
    wrong and what to write instead."""
    errors: dict[str, str] = {}
    fields = {k: str(form.get(k, "")).strip() for k in ("queue", "payload", "key", "priority")}
    sent: dict[str, Any] = {"queue": fields["queue"], "key": fields["key"] or None}
    if not fields["queue"]:
        errors["queue"] = "choose the queue to send to"
    try:
        sent["payload"] = json.loads(fields["payload"] or "null")
    except json.JSONDecodeError as exc:
        errors["payload"] = f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    sent["priority"] = None
    if fields["priority"]:
        if fields["priority"].isdigit() and int(fields["priority"]) <= MAX_PRIORITY:
            sent["priority"] = int(fields["priority"])
        else:
            errors["priority"] = f"a whole number from {MIN_PRIORITY} (first) to {MAX_PRIORITY}"
    delay = str(form.get("delay", "")).strip()
    sent["start_after"] = None
    if delay:
        try:
            sent["start_after"] = parse_duration(delay)
        except ValueError as exc:
            errors["delay"] = str(exc)
    if errors:
        raise FormInvalid(errors)
    return sent


def _send(engine: Engine, params: dict[str, Any], form: FormData) -> str:
    sent = read_send_form(form)
    start_after: timedelta | None = sent["start_after"]
    try:
        job_id = engine.queues.send(
            sent["queue"],
            sent["payload"],
            key=sent["key"],
            start_after=start_after,
            priority=sent["priority"],
        )
    except InvalidInput as exc:  # a key on a standard queue, a payload that is not JSON
        raise FormInvalid({"": str(exc)}) from None
    return f"/jobs/{job_id}"


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
    form_action("/queues/send", _send, _send_form_again, BACK),
    action("/queues/{queue}/redrive", _redrive, BACK),
]
