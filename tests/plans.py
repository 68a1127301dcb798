"""The plans of statements as they really run, nested ones included (auto_explain), for plan
regression tests.

The tests give the planner statistics with ``ANALYZE`` of their own schema's tables, named: a
bare ``ANALYZE`` sent in one multi-statement string runs in one transaction and locks every
table of every test's schema in turn, which deadlocks with another test dropping its schema.
"""

from __future__ import annotations

import json
from typing import Any

AUTO_EXPLAIN = [
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_format = json",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_buffers = on",
    "SET auto_explain.log_level = notice",
]


def explained(admin: Any, statement: str, params: Any = None) -> tuple[Any, list[dict[str, Any]]]:
    """Run ``statement`` in a transaction that is rolled back; return its first row and the
    plans of every statement it ran."""
    notices: list[str] = []
    admin.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    for setting in AUTO_EXPLAIN:
        admin.execute(setting)
    with admin.transaction(force_rollback=True):
        row = admin.execute(statement, params).fetchone()
    plans = [json.loads(m[m.index("{") :]) for m in notices if "{" in m]
    return row, plans


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """A plan node and every node below it."""
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(nodes(child))
    return found
