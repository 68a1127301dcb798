"""The Postgres type of a record's value, the type two values share, and the type of a pydantic
model's field (pure). A value gets the narrowest type whose cast from the value's JSON text
cannot fail: a Python ``int`` in 64 bits is ``bigint``, a string is ``date`` only when it is an
ISO date and ``timestamptz`` only when it is an ISO date and time with an offset, and anything
else a string is ``text``. Two types share the narrowest type both fit: ``bigint`` and
``numeric`` share ``numeric``, an object or a list with anything ``jsonb``, any other two
scalars ``text``."""

from __future__ import annotations

import datetime as dt
import math
import types
import typing
from decimal import Decimal
from enum import Enum, StrEnum
from typing import Any
from uuid import UUID

from pydantic import BaseModel


class PgType(StrEnum):
    BIGINT = "bigint"
    NUMERIC = "numeric"
    BOOLEAN = "boolean"
    TEXT = "text"
    TIMESTAMPTZ = "timestamptz"
    DATE = "date"
    JSONB = "jsonb"


_INT64 = (-(2**63), 2**63 - 1)


# The members as module constants: the hot paths compare them per value, and an enum's class
# attribute costs ten times a global's.
_BIGINT, _NUMERIC, _BOOLEAN, _TEXT = PgType.BIGINT, PgType.NUMERIC, PgType.BOOLEAN, PgType.TEXT
_TIMESTAMPTZ, _DATE, _JSONB = PgType.TIMESTAMPTZ, PgType.DATE, PgType.JSONB


def type_of(value: Any) -> PgType | None:
    """The narrowest type of ``value`` as the record stores it; None for a null (which fits
    every type)."""
    cls = type(value)
    if cls is str:
        return _type_of_text(value)
    if cls is int:
        return _BIGINT if _INT64[0] <= value <= _INT64[1] else _NUMERIC
    if value is None:
        return None
    if cls in _JSON_CONTAINERS:
        return _JSONB
    if isinstance(value, bool):
        return _BOOLEAN
    if isinstance(value, int):
        return _BIGINT if _INT64[0] <= value <= _INT64[1] else _NUMERIC
    if isinstance(value, float):
        return _NUMERIC if math.isfinite(value) else None  # stored as null
    if isinstance(value, str):
        return _type_of_text(value)
    if isinstance(value, dt.datetime):
        return _TIMESTAMPTZ if value.tzinfo is not None else _TEXT
    if isinstance(value, dt.date):
        return _DATE
    if isinstance(value, Decimal):  # stored as its text, which numeric reads
        return _NUMERIC
    return _TEXT  # stored as its text (str())


# What the record writer stores as a JSON object or array (anything else becomes its text).
_JSON_CONTAINERS = (dict, list, tuple)


def _type_of_text(value: str) -> PgType:
    """``date`` for an ISO date (YYYY-MM-DD), ``timestamptz`` for an ISO date and time (to the
    minute at least, ``T`` or a space between) with an offset or ``Z``, else ``text``: the
    forms Postgres reads the same whatever its DateStyle and TimeZone."""
    size = len(value)
    if size < 10 or value[4] != "-" or value[7] != "-":
        return _TEXT
    if size == 10:
        try:
            dt.date.fromisoformat(value)
        except ValueError:
            return _TEXT
        return _DATE
    if size < 17 or value[10] not in "T " or value[13] != ":" or "," in value:
        return _TEXT
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return _TEXT
    return _TIMESTAMPTZ if parsed.tzinfo is not None else _TEXT


def joined(a: PgType | None, b: PgType | None) -> PgType | None:
    """The narrowest type that values of type ``a`` and of type ``b`` both fit."""
    if a is None or a == b:
        return b
    if b is None:
        return a
    if {a, b} == {_BIGINT, _NUMERIC}:
        return _NUMERIC
    if _JSONB in (a, b):
        return _JSONB
    return _TEXT


def model_types(
    model: type[BaseModel], flatten: tuple[str, ...] = ()
) -> dict[tuple[str, ...], PgType]:
    """The type of each field of ``model`` by its path (the field's alias, where it has one);
    a field named in ``flatten`` whose annotation is a model gives one path per field of that
    model. A field annotated ``Any`` is left out: its type comes from the data."""
    found: dict[tuple[str, ...], PgType] = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        nested = _model_of(field.annotation)
        if key in flatten and nested is not None:
            for path, inner in model_types(nested).items():
                found[(key, *path)] = inner
            continue
        pg = annotation_type(field.annotation)
        if pg is not None:
            found[(key,)] = pg
    return found


def annotation_type(annotation: Any) -> PgType | None:
    """The type of a field annotated ``annotation``; None when it says nothing (``Any``)."""
    if annotation is None or annotation is Any:
        return None
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        found: PgType | None = None
        for arg in typing.get_args(annotation):
            if arg is type(None):
                continue
            one = annotation_type(arg)
            if one is None:
                return None
            found = joined(found, one)
        return found
    if origin is typing.Literal:
        return _joined_all(type_of(v) for v in typing.get_args(annotation))
    if origin is typing.Annotated:
        return annotation_type(typing.get_args(annotation)[0])
    if origin is not None:
        return PgType.JSONB  # list[...], dict[...], tuple[...], set[...]
    return _class_type(annotation)


def _class_type(cls: Any) -> PgType:
    if not isinstance(cls, type):
        return PgType.TEXT
    for base, pg in _CLASSES:
        if issubclass(cls, base):
            return pg
    return PgType.TEXT


# In order: bool before int, datetime before date.
_CLASSES: tuple[tuple[type, PgType], ...] = (
    (bool, PgType.BOOLEAN),
    (Enum, PgType.TEXT),
    (int, PgType.BIGINT),
    (float, PgType.NUMERIC),
    (Decimal, PgType.NUMERIC),
    (dt.datetime, PgType.TIMESTAMPTZ),
    (dt.date, PgType.DATE),
    (str, PgType.TEXT),
    (UUID, PgType.TEXT),
    (BaseModel, PgType.JSONB),
    (dict, PgType.JSONB),
    (list, PgType.JSONB),
    (tuple, PgType.JSONB),
)


def _joined_all(found: typing.Iterable[PgType | None]) -> PgType | None:
    out: PgType | None = None
    for one in found:
        out = joined(out, one)
    return out


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (also an optional one), if it holds one."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        models = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _model_of(models[0]) if len(models) == 1 else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None
