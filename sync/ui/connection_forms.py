"""The forms of a connection: create one (a workspace, a provider, then a form made from the
provider's config and credentials models), change its name, config and schedule, and replace
its credentials. Credentials are write-only: no page shows them, the form never fills them in
again, and they reach only the Python API, which encrypts them and keeps them out of logs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

import connectors
from connectors.base import Connector
from sync.api import Engine
from sync.base import redact
from sync.base.durations import format_every, parse_duration
from sync.base.names import check_name
from sync.catalog import check_credentials, connector_class, valid_config
from sync.errors import Conflict, InvalidFields, InvalidInput
from sync.ui.actions import FormInvalid, back_to, form_action, refuse_if_read_only
from sync.ui.forms import FormField, form_fields, parse_form, shown
from sync.ui.render import engine_of, int_param, render
from sync.vocabulary import ConnectionStatus

NAV = None


def _fields(cls: type[Connector]) -> tuple[list[FormField], list[FormField]]:
    return (
        form_fields(cls.config_model, "config"),
        form_fields(cls.credentials_model, "credentials", secret=True),
    )


def _entered(form: FormData | None, names: list[str]) -> dict[str, str]:
    """What was typed into the fields that may be shown again: never a credential."""
    if form is None:
        return {}
    return {n: v for n in names if isinstance(v := form.get(n), str)}


# -- a new connection ------------------------------------------------------------------------


def new_page(
    request: Request, form: FormData | None = None, errors: dict[str, str] | None = None
) -> Response:
    """Step one, a workspace and a provider (or a new workspace); step two, with both chosen,
    the connection's own form."""
    engine = engine_of(request)
    source = form if form is not None else request.query_params
    workspace_id = _number(source.get("workspace"))
    provider = str(source.get("provider") or "") or None
    workspaces = [w for w in engine.workspaces() if w.deleted_at is None]
    engine.load_providers()  # the declared ones too, as they are now in the database
    context: dict[str, Any] = {
        "workspaces": workspaces,
        "providers": sorted(connectors.providers()),
        "workspace_id": workspace_id,
        "provider": provider,
        "errors": errors or {},
        "values": _entered(form, ["workspace_name"]),
    }
    chosen = next((w for w in workspaces if w.id == workspace_id), None)
    if (
        chosen is not None
        and provider in connectors.providers()
        and "workspace_name" not in (errors or {})
    ):
        config_fields, credential_fields = _fields(connectors.get(provider))
        names = ["name", "every", *(f.input_name for f in config_fields)]
        values = _entered(form, names)
        if form is None:  # a new form shows the defaults
            values.update({f.input_name: f.default or "" for f in config_fields})
        context.update(
            workspace=chosen,
            config_fields=config_fields,
            credential_fields=credential_fields,
            values=values,
        )
    return render(request, "connection_new.html", context, status=400 if errors else 200)


def _create(engine: Engine, params: dict[str, Any], form: FormData) -> str:
    workspace = engine.workspace(_number(form.get("workspace")) or 0)
    provider = str(form.get("provider") or "")
    cls = connector_class(provider)
    config_fields, credential_fields = _fields(cls)
    errors: dict[str, str] = {}
    name = _name(form, errors)
    every = _every(form, errors)
    config, config_errors = parse_form(config_fields, form)
    credentials, credential_errors = parse_form(credential_fields, form)
    errors.update({f"config.{k}": v for k, v in config_errors.items()})
    errors.update({f"credentials.{k}": v for k, v in credential_errors.items()})
    _check(cls, errors, config=config, credentials=credentials)
    if errors:
        raise FormInvalid(errors)
    with _field_errors():
        created = engine.create_connection(
            workspace.id,
            name,
            provider,
            config=config,
            credentials=credentials,
            schedule_every=every,
        )
    return f"/connections?done=created&connection={created.id}"


def _create_workspace(engine: Engine, params: dict[str, Any], form: FormData) -> str:
    name = str(form.get("workspace_name") or "").strip()
    try:
        ws = engine.create_workspace(name)
    except (InvalidInput, Conflict) as exc:
        raise FormInvalid({"workspace_name": str(exc)}) from None
    return f"/connections/new?workspace={ws.id}"


# -- a connection's name, config and schedule -------------------------------------------------


def edit_page(
    request: Request, form: FormData | None = None, errors: dict[str, str] | None = None
) -> Response:
    engine = engine_of(request)
    c = engine.connection(request.path_params["connection_id"])
    config_fields, _ = _fields(connector_class(c.provider))
    if form is None:
        values = {f.input_name: shown(f.kind, c.config.get(f.name)) for f in config_fields}
        values["name"] = c.name
        values["every"] = format_every(c.schedule_every.total_seconds()) if c.schedule_every else ""
    else:
        values = _entered(form, ["name", "every", *(f.input_name for f in config_fields)])
    context = {"c": c, "config_fields": config_fields, "values": values, "errors": errors or {}}
    return render(request, "connection_edit.html", context, status=400 if errors else 200)


def _update(engine: Engine, params: dict[str, Any], form: FormData) -> str:
    c = engine.connection(params["connection_id"])
    cls = connector_class(c.provider)
    config_fields, _ = _fields(cls)
    errors: dict[str, str] = {}
    name = _name(form, errors)
    every = _every(form, errors)
    config, config_errors = parse_form(config_fields, form)
    errors.update({f"config.{k}": v for k, v in config_errors.items()})
    _check(cls, errors, config=config)
    if errors:
        raise FormInvalid(errors)
    # The whole config is in the form: a field left empty goes back to its default.
    patch = {f.name: config.get(f.name) for f in config_fields}
    unchanged = every == c.schedule_every
    with _field_errors():
        engine.update_connection(
            c.id,
            name=None if name == c.name else name,
            config=patch,
            schedule_every=None if unchanged else every,
            no_schedule=every is None and not unchanged,
        )
    return f"/connections?done=updated&connection={c.id}"


# -- new credentials ---------------------------------------------------------------------------


def credentials_page(
    request: Request, form: FormData | None = None, errors: dict[str, str] | None = None
) -> Response:
    engine = engine_of(request)
    c = engine.connection(request.path_params["connection_id"])
    _, credential_fields = _fields(connector_class(c.provider))
    run = _number(form.get("run")) if form is not None else int_param(request, "run")
    context = {
        "c": c,
        "credential_fields": credential_fields,
        "run": run,
        "errors": errors or {},
        "disconnected": c.status == ConnectionStatus.DISCONNECTED,
    }
    return render(request, "connection_credentials.html", context, status=400 if errors else 200)


def _replace_credentials(engine: Engine, params: dict[str, Any], form: FormData) -> str:
    c = engine.connection(params["connection_id"])
    _, credential_fields = _fields(connector_class(c.provider))
    credentials, problems = parse_form(credential_fields, form)
    if problems:
        raise FormInvalid({f"credentials.{k}": v for k, v in problems.items()})
    with _field_errors():
        engine.update_credentials(c.id, credentials)
    run = _number(form.get("run"))
    if run is not None:
        return f"/runs/{run}?credentials=replaced"
    return f"/connections?done=credentials&connection={c.id}"


# -- what the forms share ------------------------------------------------------------------------


def _number(value: object) -> int | None:
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _name(form: FormData, errors: dict[str, str]) -> str:
    name = str(form.get("name") or "").strip()
    try:
        check_name(name, "connection")
    except InvalidInput as exc:
        errors["name"] = str(exc)
    return name


def _every(form: FormData, errors: dict[str, str]) -> timedelta | None:
    """The schedule typed (15m, 1h, 1d); empty: none, the connection syncs when asked."""
    text = str(form.get("every") or "").strip()
    if not text:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        errors["every"] = str(exc)
        return None


def _check(
    cls: type[Connector],
    errors: dict[str, str],
    *,
    config: dict[str, Any],
    credentials: dict[str, Any] | None = None,
) -> None:
    """Every problem of the config and the credentials at once, beside its field (the engine
    checks them again): one the form could not read stays as it is."""
    checks: list[Callable[[], object]] = [lambda: valid_config(cls, config)]
    if credentials is not None:
        redact.register(credentials)
        checks.append(lambda: check_credentials(cls, credentials))
    for check in checks:
        try:
            with _field_errors():
                check()
        except FormInvalid as exc:
            for key, problem in exc.errors.items():
                errors.setdefault(key, problem)


@contextlib.contextmanager
def _field_errors() -> Iterator[None]:
    """The engine's refusal of a field, beside that field: a model's problems by field, and
    (the one conflict these calls can meet) a name the workspace already has, beside the name."""
    try:
        yield
    except InvalidFields as exc:
        raise FormInvalid(
            {f"{exc.section}.{k}" if k else exc.section: v for k, v in exc.problems.items()}
        ) from None
    except Conflict as exc:
        raise FormInvalid({"name": str(exc)}) from None


TO_CONNECTION = back_to(
    "the connections",
    "/connections#connection-{connection_id}",
    ("the connections", "/connections"),
)
TO_NEW = back_to("the new connection", "/connections/new", ("the connections", "/connections"))


Page = Callable[[Request, FormData | None, dict[str, str] | None], Response]


def _form(page: Page) -> Callable[[Request], Response]:
    """A form's page, which a read-only page does not offer."""

    def endpoint(request: Request) -> Response:
        refuse_if_read_only(request)
        return page(request, None, None)

    return endpoint


routes: list[BaseRoute] = [
    Route("/connections/new", _form(new_page)),
    form_action("/connections/new", _create, new_page, TO_NEW),
    form_action("/workspaces", _create_workspace, new_page, TO_NEW),
    Route("/connections/{connection_id:int}/edit", _form(edit_page)),
    form_action("/connections/{connection_id:int}/edit", _update, edit_page, TO_CONNECTION),
    Route("/connections/{connection_id:int}/credentials", _form(credentials_page)),
    form_action(
        "/connections/{connection_id:int}/credentials",
        _replace_credentials,
        credentials_page,
        TO_CONNECTION,
    ),
]
