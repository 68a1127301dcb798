"""The names readers meet (pure): a connection's schema, a table's two views, a field's column.

Postgres keeps the first 63 bytes of a name, so every name here fits in 63 bytes of UTF-8 (cut
at a character boundary). Views and columns are the table's or field's name in lower case,
quoted where needed (so any character may stay); a nested field flattened into columns is
``parent__child``. A name already taken gets ``_2``, ``_3``... (the name cut shorter to make
room), in the order the names were first given: an existing column keeps its name for good.
The companion view of a table's tombstones is its view's name with ``__all``, so a view's
name leaves room for it (58 bytes) and neither may be taken. Schemas follow Postgres' plain
identifiers: lower-case letters, digits and ``_``, not starting with a digit or ``pg_``."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from sync.errors import InvalidInput

MAX_BYTES = 63
ALL_SUFFIX = "__all"
META_COLUMNS = ("_key", "_synced_at", "_first_seen_at", "_deleted_at")
_PLAIN = re.compile(r"[^a-z0-9_]+")
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_RESERVED_SCHEMAS = frozenset({"public", "information_schema"})


def clip(name: str, limit: int = MAX_BYTES) -> str:
    """``name`` cut to at most ``limit`` bytes of UTF-8, at a character boundary."""
    encoded = name.encode()
    if len(encoded) <= limit:
        return name
    return encoded[:limit].decode(errors="ignore")


def unique_name(base: str, taken: Collection[str], limit: int = MAX_BYTES) -> str:
    """``base`` (lower case, within ``limit`` bytes), or with the first free ``_N`` suffix."""
    name = clip(base.lower() or "_", limit)
    n = 2
    while name in taken:
        suffix = f"_{n}"
        name = clip(base.lower() or "_", limit - len(suffix)) + suffix
        n += 1
    return name


def column_name(path: Sequence[str], taken: Collection[str]) -> str:
    """The column of the field at ``path``; ``taken``: the table's columns so far (the meta
    columns are always taken)."""
    return unique_name("__".join(path), {*META_COLUMNS, *taken})


def view_name(table: str, taken: Collection[str]) -> str:
    """The view of ``table``, such that neither it nor its ``__all`` companion is in ``taken``
    (the names of the connection's other views, companions included)."""
    limit = MAX_BYTES - len(ALL_SUFFIX)
    base = table.lower() or "_"
    name = clip(base, limit)
    n = 2
    while name in taken or name + ALL_SUFFIX in taken:
        suffix = f"_{n}"
        name = clip(base, limit - len(suffix)) + suffix
        n += 1
    return name


def default_schema(workspace: str, connection: str, prefix: str = "") -> str:
    """``<workspace>_<connection>`` (after ``prefix``) as a plain identifier: lower case, every
    run of other characters one ``_``."""
    name = _PLAIN.sub("_", f"{workspace}_{connection}".lower()).strip("_") or "connection"
    name = prefix + name
    if name[0].isdigit() or name.startswith("pg_"):
        name = "_" + name
    return clip(name)


def fallback_schema(default: str, connection_id: int) -> str:
    """The default schema with the connection's id, for when the default is taken."""
    suffix = f"_{connection_id}"
    return clip(default, MAX_BYTES - len(suffix)) + suffix


def check_schema_name(name: str, engine_schema: str) -> str:
    """``name`` if a connection may choose it for its views, else :class:`InvalidInput`."""
    if not _SCHEMA.fullmatch(name) or name.startswith("pg_"):
        raise InvalidInput(
            f"schema {name!r} is not a plain name: use 1 to 63 lower-case letters, digits and _, "
            "not starting with a digit or pg_"
        )
    if name in _RESERVED_SCHEMAS or name == engine_schema:
        raise InvalidInput(f"schema {name!r} is taken; choose a schema of the connection's own")
    return name
