"""The named queries parse, and every one is valid SQL against the migrated schema."""

from __future__ import annotations

import re
from typing import Any

import pytest

from sync.store.maintenance import MAINTENANCE
from sync.store.queries import QUERIES, NamedQueries, parse

_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")


def test_parse_splits_names_docs_and_text() -> None:
    parsed = parse("-- name: one\n-- does one thing\nSELECT 1;\n\n-- name: two\nSELECT 2\n")
    assert parsed["one"].doc == "does one thing"
    assert parsed["one"].text == "SELECT 1"
    assert parsed["two"].text == "SELECT 2"
    with pytest.raises(ValueError, match="defined twice"):
        parse("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


@pytest.mark.parametrize("queries", [QUERIES, MAINTENANCE], ids=["queries", "maintenance"])
def test_every_named_query_prepares(engine: Any, admin: Any, queries: NamedQueries) -> None:
    """PREPARE checks every name and type in a statement without running it; a COPY, which
    cannot be prepared, is run with no rows and rolled back."""
    for name in queries.names():
        text = queries._by_name[name].text
        if text.startswith("COPY"):
            with (
                admin.transaction(force_rollback=True),
                admin.cursor() as cur,
                cur.copy(text),
            ):
                pass
            continue
        params = sorted(set(_PLACEHOLDER.findall(text)))
        numbered = _PLACEHOLDER.sub(lambda m, p=params: f"${p.index(m.group(1)) + 1}", text)
        admin.execute(f"PREPARE check_{name} AS {numbered}")
        admin.execute(f"DEALLOCATE check_{name}")
