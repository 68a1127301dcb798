"""How a table's typed schema follows its data (pure): what a sync observed of its records
(:class:`Shape`), and the schema that comes of it (:func:`evolve`). A new field adds a column
at the end; a column whose values no longer fit its type is widened (``bigint`` to
``numeric``, a scalar to ``text``, anything to ``jsonb``) with a warning; a field that is no
longer seen keeps its column, whose values are then null. A column never narrows and never
changes its name, so readers' queries keep working."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sync.typed.naming import column_name
from sync.typed.types import PgType, joined, type_of

Path = tuple[str, ...]


class Origin(StrEnum):
    MODEL = "model"  # declared by the connector's model of the table
    DATA = "data"  # inferred from the records


@dataclass(frozen=True)
class Column:
    """A column of a typed view: the field it shows (a path: one name, or two for a flattened
    object's field), its name and its type."""

    path: Path
    column: str
    type: PgType
    origin: Origin = Origin.DATA

    def to_json(self) -> dict[str, Any]:
        return {
            "path": list(self.path),
            "column": self.column,
            "type": self.type.value,
            "from": self.origin.value,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Column:
        return cls(tuple(data["path"]), data["column"], PgType(data["type"]), Origin(data["from"]))


class ChangeKind(StrEnum):
    ADDED = "added"
    WIDENED = "widened"


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    column: str
    type: PgType
    was: PgType | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"change": self.kind.value, "column": self.column, "type": self.type}
        if self.was is not None:
            out["was"] = self.was.value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Change:
        was = data.get("was")
        return cls(
            ChangeKind(data["change"]),
            data["column"],
            PgType(data["type"]),
            PgType(was) if was else None,
        )

    def describe(self) -> str:
        if self.kind is ChangeKind.ADDED:
            return f"added {self.column} {self.type}"
        return f"widened {self.column} from {self.was} to {self.type}"


@dataclass(frozen=True)
class Evolution:
    """The schema after a sync: its columns in order, what changed, whether the views must be
    dropped and created again (a type changed: ``CREATE OR REPLACE VIEW`` only adds columns at
    the end), and the warnings for the run (values that no longer fit a column's type)."""

    columns: tuple[Column, ...]
    changes: tuple[Change, ...]
    recreate: bool
    warnings: tuple[str, ...]


_MISSING: Any = object()
_CONTAINERS = (dict, list, tuple)
_JSONB, _TEXT, _BIGINT = PgType.JSONB, PgType.TEXT, PgType.BIGINT
_NUMERIC, _BOOLEAN = PgType.NUMERIC, PgType.BOOLEAN
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_WIDEST = (PgType.TEXT, PgType.JSONB)


class Shape:
    """What a sync saw of a table's records: each field's path and the narrowest type all its
    values fit (None while only nulls were seen). Fields named in ``flatten`` whose value is an
    object are seen one level down (``user`` → ``user``/``login``)."""

    def __init__(self, flatten: Iterable[str] = ()) -> None:
        self._flatten = frozenset(flatten)
        self.types: dict[Path, PgType | None] = {}

    def observe(self, record: Mapping[str, Any]) -> None:
        types = self.types
        for key, value in record.items():
            if self._flatten and key in self._flatten and type(value) is dict:
                for inner, nested in value.items():
                    self._see((str(key), str(inner)), nested)
                continue
            path = (key,) if type(key) is str else (str(key),)
            known = types.get(path, _MISSING)
            if known is not _MISSING and _fits(known, value):
                continue
            found = type_of(value)
            types[path] = found if known is _MISSING else joined(known, found)

    def _see(self, path: Path, value: Any) -> None:
        known = self.types.get(path, _MISSING)
        found = type_of(value)
        self.types[path] = found if known is _MISSING else joined(known, found)


def _fits(known: PgType | None, value: Any) -> bool:
    """A quick yes for the values most records hold (most fit the type their field has);
    False sends the value to :func:`type_of`."""
    cls = type(value)
    if value is None or known is _JSONB:
        return True
    if known is _TEXT:  # nothing widens text but an object or a list
        return cls not in _CONTAINERS
    if known is _BIGINT:
        return cls is int and _INT64_MIN <= value <= _INT64_MAX
    if known is _NUMERIC:
        return cls is float or (cls is int and _INT64_MIN <= value <= _INT64_MAX)
    return known is _BOOLEAN and cls is bool


def evolve(
    current: Sequence[Column],
    observed: Mapping[Path, PgType | None],
    declared: Mapping[Path, PgType] | None = None,
) -> Evolution:
    """The schema ``current`` becomes once it shows the values ``observed`` and the fields
    ``declared`` by the connector's model (in the model's order, before the fields found only
    in the data, which come in path order)."""
    declared = declared or {}
    columns: list[Column] = []
    changes: list[Change] = []
    warnings: list[str] = []
    for column in current:
        wider = joined(column.type, observed.get(column.path))
        assert wider is not None
        if wider != column.type:
            changes.append(Change(ChangeKind.WIDENED, column.column, wider, column.type))
            warnings.append(_no_longer_fit(column, wider))
            column = Column(column.path, column.column, wider, column.origin)
        columns.append(column)
    known = {c.path for c in columns}
    names = {c.column for c in columns}
    fresh = [p for p in declared if p not in known]
    skip = known | set(declared)
    fresh += sorted(p for p, t in observed.items() if t is not None and p not in skip)
    for path in fresh:
        origin = Origin.MODEL if path in declared else Origin.DATA
        kind = declared.get(path) or observed.get(path)
        seen = joined(kind, observed.get(path))
        assert kind is not None and seen is not None
        name = column_name(path, names)
        names.add(name)
        if seen != kind:
            warnings.append(
                f"column {name}: values do not fit the model's {kind}; it is {seen} instead"
            )
        columns.append(Column(path, name, seen, origin))
        changes.append(Change(ChangeKind.ADDED, name, seen))
    recreate = any(c.kind is ChangeKind.WIDENED for c in changes)
    return Evolution(tuple(columns), tuple(changes), recreate, tuple(warnings))


def _no_longer_fit(column: Column, wider: PgType) -> str:
    return f"column {column.column}: values no longer fit {column.type}; widened to {wider}"
