"""The pure decisions of typed tables: a value's type, the type two share, a model's types,
names within 63 bytes, and evolution that never narrows a column nor renames one."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from sync.errors import InvalidInput
from sync.typed.evolve import Column, Shape, evolve
from sync.typed.naming import (
    check_schema_name,
    column_name,
    default_schema,
    fallback_schema,
    unique_name,
    view_name,
)
from sync.typed.types import PgType, joined, model_types, type_of

T = PgType


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (True, T.BOOLEAN),
        (7, T.BIGINT),
        (2**63 - 1, T.BIGINT),
        (2**63, T.NUMERIC),
        (-(2**63) - 1, T.NUMERIC),
        (1.5, T.NUMERIC),
        (float("nan"), None),
        (Decimal("1.10"), T.NUMERIC),
        ("2024-02-29", T.DATE),
        ("2023-02-29", T.TEXT),
        ("2024-03-01T10:00:00Z", T.TIMESTAMPTZ),
        ("2024-03-01 10:00:00.123+02:00", T.TIMESTAMPTZ),
        ("2024-03-01T10:00:00", T.TEXT),  # no offset: which time zone is unknown
        ("2024-13-01T10:00:00Z", T.TEXT),
        ("12", T.TEXT),
        ({"a": 1}, T.JSONB),
        ([1], T.JSONB),
        (datetime(2024, 1, 1, tzinfo=UTC), T.TIMESTAMPTZ),
        (datetime(2024, 1, 1), T.TEXT),
        (date(2024, 1, 1), T.DATE),
    ],
)
def test_type_of(value: Any, expected: PgType | None) -> None:
    assert type_of(value) == expected


types = st.sampled_from(list(PgType)) | st.none()


@given(types, types, types)
def test_joined_is_a_lattice(a: PgType | None, b: PgType | None, c: PgType | None) -> None:
    assert joined(a, b) == joined(b, a)
    assert joined(joined(a, b), c) == joined(a, joined(b, c))
    assert joined(a, a) == a
    ab = joined(a, b)
    assert joined(ab, a) == ab  # never narrower than either


class Color(StrEnum):
    RED = "red"


class Inner(BaseModel):
    x: int
    y: str | None = None


class Model(BaseModel):
    n: int
    f: float | None
    d: Decimal
    flag: bool
    s: str
    when: datetime
    day: date | None
    color: Color
    kind: Literal["a", "b"]
    tags: list[str]
    meta: dict[str, Any]
    inner: Inner
    flat: Inner | None
    anything: Any
    either: int | str


def test_model_types() -> None:
    assert model_types(Model, ("flat",)) == {
        ("n",): T.BIGINT,
        ("f",): T.NUMERIC,
        ("d",): T.NUMERIC,
        ("flag",): T.BOOLEAN,
        ("s",): T.TEXT,
        ("when",): T.TIMESTAMPTZ,
        ("day",): T.DATE,
        ("color",): T.TEXT,
        ("kind",): T.TEXT,
        ("tags",): T.JSONB,
        ("meta",): T.JSONB,
        ("inner",): T.JSONB,
        ("flat", "x"): T.BIGINT,
        ("flat", "y"): T.TEXT,
        ("either",): T.TEXT,
    }


@given(st.text(min_size=0, max_size=120), st.sets(st.text(max_size=70), max_size=20))
def test_unique_names_fit_and_are_free(base: str, taken: set[str]) -> None:
    name = unique_name(base, taken)
    assert len(name.encode()) <= 63
    assert name not in taken
    assert name == name.lower()


@given(st.lists(st.text(min_size=1, max_size=90), min_size=1, max_size=30))
def test_view_names_leave_room_for_their_companion(tables: list[str]) -> None:
    taken: set[str] = set()
    for table in tables:
        name = view_name(table, taken)
        assert len((name + "__all").encode()) <= 63
        assert name not in taken and name + "__all" not in taken
        taken |= {name, name + "__all"}


def test_column_names() -> None:
    assert column_name(("_key",), set()) == "_key_2"
    assert column_name(("User", "Login"), set()) == "user__login"
    assert column_name(("x" * 70,), {"x" * 63}) == "x" * 61 + "_2"
    assert column_name(("é" * 40,), set()) == "é" * 31  # 62 bytes: no half character


def test_schema_names() -> None:
    assert default_schema("Acme Corp", "GitHub (prod)") == "acme_corp_github_prod"
    assert default_schema("1st", "x") == "_1st_x"
    assert default_schema("pg", "x") == "_pg_x"
    assert len(default_schema("w" * 60, "c" * 60).encode()) == 63
    assert fallback_schema("w" * 63, 12) == "w" * 60 + "_12"
    assert check_schema_name("analytics", "sync") == "analytics"
    for bad in ("Analytics", "pg_x", "1x", "a-b", "x" * 64):
        with pytest.raises(InvalidInput, match="plain name"):
            check_schema_name(bad, "sync")
    for taken in ("sync", "public", "information_schema"):
        with pytest.raises(InvalidInput, match="taken"):
            check_schema_name(taken, "sync")


records = st.lists(
    st.dictionaries(
        st.sampled_from(["a", "b", "C", "c"]),
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text(max_size=5)
        | st.lists(st.integers(), max_size=2),
        max_size=4,
    ),
    max_size=8,
)


@given(records, records)
def test_evolution_never_narrows_nor_renames(first: list[Any], second: list[Any]) -> None:
    shape = Shape()
    for record in first:
        shape.observe(record)
    before = evolve((), shape.types)
    for record in second:
        shape.observe(record)
    after = evolve(before.columns, shape.types)
    assert [c.column for c in after.columns[: len(before.columns)]] == [
        c.column for c in before.columns
    ]
    for old, new in zip(before.columns, after.columns, strict=False):
        assert joined(old.type, new.type) == new.type
    # Recreated exactly when a type changed; a widening always warns.
    changed = any(o.type != n.type for o, n in zip(before.columns, after.columns, strict=False))
    assert after.recreate == changed
    assert len(after.warnings) == sum(c.kind == "widened" for c in after.changes)
    # Every value seen fits its column.
    by_path = {c.path: c.type for c in after.columns}
    for record in first + second:
        for key, value in record.items():
            if type_of(value) is not None:
                assert joined(by_path[(key,)], type_of(value)) == by_path[(key,)]


def test_a_model_type_the_data_does_not_fit_is_widened_with_a_warning() -> None:
    shape = Shape()
    shape.observe({"n": "lots"})
    found = evolve((), shape.types, {("n",): T.BIGINT, ("m",): T.DATE})
    assert [(c.column, c.type, c.origin) for c in found.columns] == [
        ("n", T.TEXT, "model"),
        ("m", T.DATE, "model"),
    ]
    assert found.warnings == ("column n: values do not fit the model's bigint; it is text instead",)
    assert evolve(found.columns, shape.types).changes == ()
    assert Column.from_json(found.columns[0].to_json()) == found.columns[0]
