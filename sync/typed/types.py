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
import re
import types
import typing
from collections.abc import Mapping
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
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIMESTAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}(:?\d{2})?)", re.ASCII
)


def type_of(value: Any) -> PgType | None:
    """The narrowest type of ``value`` as the record stores it; None for a null (which fits
    every type)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return PgType.BOOLEAN
    if isinstance(value, int):
        return PgType.BIGINT if _INT64[0] <= value <= _INT64[1] else PgType.NUMERIC
    if isinstance(value, float):
        return PgType.NUMERIC if math.isfinite(value) else None  # stored as null
    if isinstance(value, str):
        return _type_of_text(value)
    if isinstance(value, Mapping | list | tuple):
        return PgType.JSONB
    if isinstance(value, dt.datetime):
        return PgType.TIMESTAMPTZ if value.tzinfo is not None else PgType.TEXT
    if isinstance(value, dt.date):
        return PgType.DATE
    if isinstance(value, Decimal):  # stored as its text, which numeric reads
        return PgType.NUMERIC
    return PgType.TEXT


def _type_of_text(value: str) -> PgType:
    if len(value) == 10 and _DATE.fullmatch(value):
        try:
            dt.date.fromisoformat(value)
        except ValueError:
            return PgType.TEXT
        return PgType.DATE
    if len(value) >= 17 and _TIMESTAMP.fullmatch(value):
        try:
            dt.datetime.fromisoformat(value)
        except ValueError:
            return PgType.TEXT
        return PgType.TIMESTAMPTZ
    return PgType.TEXT


def joined(a: PgType | None, b: PgType | None) -> PgType | None:
    """The narrowest type that values of type ``a`` and of type ``b`` both fit."""
    if a is None or a == b:
        return b
    if b is None:
        return a
    if {a, b} == {PgType.BIGINT, PgType.NUMERIC}:
        return PgType.NUMERIC
    if PgType.JSONB in (a, b):
        return PgType.JSONB
    return PgType.TEXT


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
