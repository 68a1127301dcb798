"""The upgrade rule for the functions workers call (docs/operations.md, "Upgrading"): a version in
the name, and a migration after the one that created a version (the baseline, or a later one)
never replaces, alters or drops it, it adds a new one; ``notify_channel()``, unversioned, is
never changed at all. And the list of versions the docs say this release calls is the list its
statements call."""

from __future__ import annotations

import re
from pathlib import Path

from sync.store.queries import parse
from sync.store.sqlfiles import sql_dir

ROOT = Path(__file__).resolve().parent.parent

_MIGRATION = re.compile(r"^\d{4}_\w+\.sql$")
_CREATED = re.compile(r"\bCREATE\s+FUNCTION\s+(?:\w+\.)?(\w+)\s*\(", re.IGNORECASE)
_CHANGED = re.compile(
    r"\b(CREATE\s+OR\s+REPLACE|ALTER|DROP)\s+FUNCTION\s+(?:IF\s+EXISTS\s+)?(?:\w+\.)?(\w+)\b",
    re.IGNORECASE,
)
_VERSIONED = re.compile(r"^\w+_v\d+$")
_CALLED = re.compile(r"\b(\w+_v\d+)\s*\(")

# Unversioned, yet called by every release and never to change: the channel's name is a contract
# between the releases of a rolling upgrade (docs/operations.md, "Upgrading").
FROZEN = {"notify_channel"}

# Versions a migration may drop: each retired once no release that calls it can still run (the
# rule's third case). None so far.
RETIRED: set[str] = set()


def broken_rule(migrations: list[tuple[str, str]]) -> list[str]:
    """Each change a migration makes to a function an earlier migration created that the rule
    forbids, as ``migration: what it does``. ``migrations``: (file name, text), in order."""
    created: dict[str, str] = {}
    broken = []
    for name, text in migrations:
        code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
        for found in _CHANGED.finditer(code):
            verb, function = " ".join(found[1].upper().split()), found[2]
            guarded = _VERSIONED.match(function) or function in FROZEN
            if not guarded or created.get(function, name) == name:
                continue  # unversioned, or in the migration that created it
            if verb == "DROP" and function in RETIRED:
                continue
            broken.append(f"{name}: {verb} FUNCTION {function} (created by {created[function]})")
        for found in _CREATED.finditer(code):
            created.setdefault(found[1], name)
    return broken


def _migrations() -> list[tuple[str, str]]:
    return [
        (p.name, p.read_text()) for p in sorted(sql_dir().glob("*.sql")) if _MIGRATION.match(p.name)
    ]


def test_no_migration_changes_a_version_an_earlier_one_created() -> None:
    migrations = _migrations()
    assert migrations, "no numbered migration found in sql/"
    assert broken_rule(migrations) == []


def test_the_rule_catches_a_replacement_an_alteration_and_a_drop() -> None:
    earlier = [
        ("0001_baseline.sql", "CREATE FUNCTION notify_channel() RETURNS text AS $$ $$;"),
        ("0002_x.sql", "CREATE FUNCTION claim_run_v3(p text) RETURNS int AS $$ $$;\n"
                       "CREATE OR REPLACE FUNCTION claim_run_v3(p text) RETURNS int AS $$ $$;"),
    ]  # fmt: skip
    later = (
        "0003_x.sql",
        "CREATE OR REPLACE FUNCTION claim_run_v3(p text) RETURNS int AS $$ $$;\n"
        "ALTER FUNCTION claim_run_v3(text) SET jit = off;\n"
        "DROP FUNCTION IF EXISTS public.claim_run_v3(text);\n"
        "CREATE OR REPLACE FUNCTION notify_channel() RETURNS text AS $$ $$;\n"
        "-- DROP FUNCTION claim_run_v3(text): a comment changes nothing\n"
        "CREATE OR REPLACE FUNCTION claim_run(p text) RETURNS int AS $$ $$;\n"
        "CREATE FUNCTION claim_run_v4(p text) RETURNS int AS $$ $$;",
    )
    assert broken_rule(earlier) == []  # replaced in the migration that created it
    assert broken_rule([*earlier, later]) == [
        "0003_x.sql: CREATE OR REPLACE FUNCTION claim_run_v3 (created by 0002_x.sql)",
        "0003_x.sql: ALTER FUNCTION claim_run_v3 (created by 0002_x.sql)",
        "0003_x.sql: DROP FUNCTION claim_run_v3 (created by 0002_x.sql)",
        "0003_x.sql: CREATE OR REPLACE FUNCTION notify_channel (created by 0001_baseline.sql)",
    ]


def _called_by_this_release() -> set[str]:
    """The versioned functions the named statements call, and those the Python code calls
    (the worker's LISTEN connection names its own channel)."""
    called = set()
    for path in sql_dir().glob("*.sql"):
        if not _MIGRATION.match(path.name):
            for query in parse(path.read_text()).values():
                called |= set(_CALLED.findall(query.text))
    for path in (ROOT / "sync").rglob("*.py"):
        called |= set(_CALLED.findall(path.read_text()))
    return called


def test_the_docs_name_the_versions_this_release_calls() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("This release calls:")
    paragraph = text[start : text.index("\n\n", start)]
    named = set(re.findall(r"`(\w+_v\d+)`", paragraph))
    called = _called_by_this_release()
    assert {"claim_run_v3", "worker_channel_v3", "claim_jobs_v5"} <= called
    assert named == called
