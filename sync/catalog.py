"""What each provider (installed plugin, or declared provider loaded from the database) needs and
syncs, read from its connector class: its tables (with
how their deletions are found, and how late), and the fields of its config and credentials
models (name, type, required or optional, default). ``connector-sync providers`` prints it; it
is also what to write in ``--config`` and ``--credentials``, and what the operator page's
connection forms are made of. A connection's config and credentials are checked against those
models here, for every way in."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

import connectors
from connectors.base import Connector, Deletions, Table
from connectors.registry import declared
from sync.base import redact
from sync.base.durations import format_every
from sync.errors import InvalidFields, InvalidInput, describe_validation_error, field_problems


def describe_providers(
    complete_every: Mapping[str, timedelta] | None = None,
) -> list[dict[str, Any]]:
    """Every installed provider, by name. ``complete_every``: the operator's setting of that
    name (``provider.table`` to its interval), which delays some tables' deletions."""
    return [
        describe_provider(name, cls, complete_every) for name, cls in connectors.providers().items()
    ]


def describe_provider(
    name: str, cls: type[Connector], complete_every: Mapping[str, timedelta] | None = None
) -> dict[str, Any]:
    version = getattr(cls, "version", None) if name in declared() else None
    return {
        "provider": name,
        # A declared provider (a file stored with `providers add`) has no class of its own.
        "class": f"{cls.__module__}.{cls.__qualname__}" if version is None else None,
        "declared_version": version,
        "tables": [
            {
                "name": t.name,
                "mode": t.mode.value,
                "primary_key": t.primary_key,
                "deletions": deletions_found(t, (complete_every or {}).get(f"{name}.{t.name}")),
            }
            for t in cls.tables
        ],
        "config": describe_fields(cls.config_model),
        # None: the connector declares no credentials model, so any are accepted.
        "credentials": (
            describe_fields(cls.credentials_model) if cls.credentials_model is not None else None
        ),
    }


def deletions_found(table: Table, complete_every: timedelta | None) -> str:
    """How late a deletion upstream can be found in ``table`` (pure): "next sync" (a complete
    listing at every sync), "delta feed" (the provider reports deletions), or "within 12h"
    when an operator spaced out the complete listings with ``complete_every``."""
    if table.deletions is Deletions.FEED:
        return "delta feed"
    if table.listed_whole_for_deletions and complete_every is not None:
        return f"within {format_every(complete_every.total_seconds())}"
    return "next sync"


def describe_fields(model: type[BaseModel]) -> list[dict[str, Any]]:
    return [_field(name, info) for name, info in model.model_fields.items()]


def _field(name: str, info: FieldInfo) -> dict[str, Any]:
    described: dict[str, Any] = {
        "name": name,
        "type": type_name(info.annotation),
        "required": info.is_required(),
    }
    if not info.is_required():
        default = info.get_default(call_default_factory=True)
        if default is not PydanticUndefined:
            described["default"] = default if _plain(default) else str(default)
    if info.description:
        described["description"] = info.description
    return described


def type_name(annotation: Any) -> str:
    """A type as a person reads it: ``str``, ``int``, ``list[str]``, ``str | None``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


def connector_class(provider: str) -> type[Connector]:
    """The installed connector of ``provider``, or :class:`InvalidInput` naming those there are."""
    try:
        return connectors.get(provider)
    except connectors.UnknownProvider as exc:
        raise InvalidInput(str(exc)) from None


def valid_config(cls: type[Connector], config: Mapping[str, Any]) -> Any:
    """``config`` validated by the connector's config model, or :class:`InvalidFields`."""
    try:
        return cls.config_model.model_validate(dict(config))
    except ValidationError as exc:
        message = describe_validation_error(exc)
        raise InvalidFields(message, "config", field_problems(exc)) from None


def check_credentials(cls: type[Connector], credentials: Mapping[str, Any]) -> None:
    """Refuse (:class:`InvalidFields`) credentials the connector's credentials model refuses;
    the problems are redacted (``credentials`` must be registered with ``sync.base.redact``)."""
    model = cls.credentials_model
    if model is None:
        return
    try:
        model.model_validate(dict(credentials))
    except ValidationError as exc:
        problem = redact.redact(describe_validation_error(exc, "credentials"))
        problems = {k: redact.redact(v) for k, v in field_problems(exc).items()}
        raise InvalidFields(
            f"{problem}; `connector-sync providers` lists each provider's credential fields",
            "credentials",
            problems,
        ) from None
