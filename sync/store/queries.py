"""Loads the named queries of ``sql/queries.sql``: ``QUERIES.claim_run`` and so on (and those of
the other named-query files of ``sql/``, by ``NamedQueries(filename)``); a store that picks the
statement by a name it holds asks ``queries[name]``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import LiteralString, cast

from psycopg import sql

from sync.store.sqlfiles import sql_dir

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class NamedQuery:
    name: str
    doc: str
    text: str

    @property
    def sql(self) -> sql.SQL:
        return sql.SQL(cast(LiteralString, self.text))


def parse(source: str) -> dict[str, NamedQuery]:
    """Split a file of ``-- name:`` blocks; the comment lines after a name are its doc."""
    queries: dict[str, NamedQuery] = {}
    marks = list(_NAME.finditer(source))
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        body = source[mark.end() : following.start() if following else len(source)]
        lines = body.strip("\n").splitlines()
        doc = [line[3:] for line in lines if line.startswith("-- ")]
        text = "\n".join(line for line in lines if not line.startswith("--")).strip()
        if mark.group(1) in queries:
            raise ValueError(f"query {mark.group(1)!r} is defined twice")
        queries[mark.group(1)] = NamedQuery(mark.group(1), " ".join(doc), text.rstrip(";"))
    return queries


class NamedQueries:
    def __init__(self, filename: str = "queries.sql") -> None:
        self._filename = filename
        self._by_name = parse((sql_dir() / filename).read_text())
        # One object per query for the life of the process, so psycopg's cache of converted
        # queries hits instead of converting the text again on every call.
        self._compiled = {name: query.sql for name, query in self._by_name.items()}

    def __getattr__(self, name: str) -> sql.SQL:
        try:
            return self._compiled[name]
        except KeyError:
            raise AttributeError(f"no query named {name!r} in {self._filename}") from None

    def __getitem__(self, name: str) -> sql.SQL:
        try:
            return self._compiled[name]
        except KeyError:
            raise KeyError(f"no query named {name!r} in {self._filename}") from None

    def names(self) -> list[str]:
        return sorted(self._by_name)


QUERIES = NamedQueries()
