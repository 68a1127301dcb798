"""Templates: ``"/users/{users.id}/orders"``, ``"Bearer {credentials.token}"``. A reference names
a namespace (``config``, ``credentials``, or a table whose row fills it) and a field, dotted for a
field inside an object. Filling a template looks values up and puts them in as text; nothing is
ever evaluated. Which namespaces each place may use is checked when the file is read."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

_REFERENCE = re.compile(r"\{([^{}]*)\}")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_FIELD = re.compile(r"^[A-Za-z0-9_@$-]+(\.[A-Za-z0-9_@$-]+)*$")


class TemplateError(ValueError):
    """A template that is not made of text and ``{namespace.field}`` references."""


class MissingValue(LookupError):
    """A reference whose value is not there (a parent row without the field)."""


@dataclass(frozen=True)
class Reference:
    namespace: str
    field: str

    def __str__(self) -> str:
        return f"{{{self.namespace}.{self.field}}}"


def references(template: str) -> list[Reference]:
    """The references of ``template``, in order; :class:`TemplateError` for a malformed one or a
    stray brace."""
    found = []
    for match in _REFERENCE.finditer(template):
        namespace, dot, field = match.group(1).partition(".")
        if not dot or not _NAME.match(namespace) or not _FIELD.match(field):
            raise TemplateError(
                f"{match.group(0)!r} is not a reference: write {{config.FIELD}}, "
                "{credentials.FIELD} or {TABLE.FIELD}"
            )
        found.append(Reference(namespace, field))
    if "{" in _REFERENCE.sub("", template) or "}" in _REFERENCE.sub("", template):
        raise TemplateError("a brace without its pair; a reference is {namespace.field}")
    return found


def dig(value: Any, path: str) -> Any:
    """The value at a dotted ``path`` of a JSON value (a key that holds a dot itself, such as
    ``@odata.nextLink``, is found whole first); None when a step is missing."""
    if not isinstance(value, Mapping):
        return None
    if path in value:
        return value[path]
    head, dot, rest = path.partition(".")
    if not dot:
        return None
    return dig(value.get(head), rest)


def fill(template: str, values: Mapping[str, Mapping[str, Any]], *, in_path: bool = False) -> str:
    """``template`` with each reference replaced by its value as text. ``in_path``: each value
    is percent-encoded whole (a ``/`` or ``?`` in a value cannot add a path segment or a
    query). :class:`MissingValue` when a value is absent."""

    def value(match: re.Match[str]) -> str:
        namespace, _, field = match.group(1).partition(".")
        found = dig(values.get(namespace), field)
        if found is None or found == "":
            raise MissingValue(f"{match.group(0)} has no value")
        text = as_text(found)
        return quote(text, safe="") if in_path else text

    return _REFERENCE.sub(value, template)


def as_text(value: Any) -> str:
    """A value as a template puts it: text as it is, a boolean as ``true``/``false``, anything
    else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))
