"""Forms made from a connector's pydantic models: a field per model field, with its type, default
and help, and the values a submitted form gives them (pure functions).

A value left empty is left out, so the model's default applies (or the model says the field is
required, beside it); what the form cannot read (JSON that does not parse) is said beside its
field too. Credential fields are write-only: the page never renders a value back into them.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sync.catalog import type_name

Kind = Literal["text", "integer", "number", "checkbox", "choice", "lines", "json"]
_SCALARS: dict[type, Kind] = {bool: "checkbox", int: "integer", float: "number", str: "text"}
_LISTS = (list, tuple, set, frozenset)


@dataclass(frozen=True)
class FormField:
    name: str  # the model's field name
    section: str  # "config" or "credentials": the inputs are named "section.name"
    kind: Kind
    type_name: str
    required: bool
    default: str | None = None  # as the form writes it, when the model has one
    help: str | None = None
    choices: tuple[str, ...] = ()
    secret: bool = False  # write-only: never rendered back
    whole: bool = False  # the value is the section's whole object (a model-less JSON field)

    @property
    def input_name(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def input_id(self) -> str:
        return f"{self.section}-{self.name}"


def form_fields(
    model: type[BaseModel] | None, section: str, *, secret: bool = False
) -> list[FormField]:
    """The fields of ``model``, in its order; without a model, one JSON field for the whole
    section (a connector that declares no credentials model accepts any object)."""
    if model is None:
        return [
            FormField(
                section,
                section,
                "json",
                "JSON object",
                required=False,
                help="This provider declares no fields: give a JSON object.",
                secret=secret,
                whole=True,
            )
        ]
    return [_field(name, info, section, secret) for name, info in model.model_fields.items()]


def _field(name: str, info: FieldInfo, section: str, secret: bool) -> FormField:
    kind, choices = _kind(info.annotation)
    default: str | None = None
    if not info.is_required():
        value = info.get_default(call_default_factory=True)
        if value is not PydanticUndefined and value is not None and value != []:
            default = shown(kind, value)
    return FormField(
        name,
        section,
        kind,
        type_name(info.annotation),
        info.is_required(),
        default,
        info.description,
        choices,
        secret,
    )


def _kind(annotation: Any) -> tuple[Kind, tuple[str, ...]]:
    """How a value of this type is typed into a form."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _kind(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _kind(options[0]) if len(options) == 1 else ("json", ())
    if origin is typing.Literal:
        return "choice", tuple(str(a) for a in typing.get_args(annotation))
    if origin in _LISTS:
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        plain = all(_kind(a)[0] in ("text", "integer", "number", "choice") for a in args)
        return ("lines", ()) if plain else ("json", ())
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "choice", tuple(str(m.value) for m in annotation)
    if isinstance(annotation, type):
        for base, kind in _SCALARS.items():
            if issubclass(annotation, base):
                return kind, ()
        if not issubclass(annotation, BaseModel | Mapping):
            return "text", ()  # URLs, paths, secrets: pydantic reads them from text
    return "json", ()


def shown(kind: Kind, value: Any) -> str:
    """A stored value as its form field shows it."""
    if value is None:
        return ""
    if kind == "checkbox":
        return "on" if value else ""
    if kind == "lines" and isinstance(value, _LISTS):
        return "\n".join(str(v) for v in value)
    if kind == "json":
        return json.dumps(value, indent=2)
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


def parse_form(
    fields: list[FormField], form: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The values a submitted form gives ``fields`` (an empty one is left out), and what could
    not be read, by field name. Numbers and the like stay text: the model reads them."""
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for field in fields:
        raw = form.get(field.input_name)
        if field.kind == "checkbox":
            values[field.name] = raw is not None
            continue
        text = raw.strip() if isinstance(raw, str) else ""
        if not text:
            continue
        if field.kind == "lines":
            values[field.name] = [line.strip() for line in text.splitlines() if line.strip()]
        elif field.kind == "json":
            try:
                parsed = json.loads(text)
            except ValueError as exc:
                problem = getattr(exc, "msg", "not JSON")
                errors[field.name] = f"is not JSON: {problem} (line {getattr(exc, 'lineno', 1)})"
                continue
            if field.whole:
                if isinstance(parsed, dict):
                    values.update(parsed)
                else:
                    errors[field.name] = "must be a JSON object: {...}"
            else:
                values[field.name] = parsed
        else:
            values[field.name] = text
    return values, errors
