"""Every test gets its own schema in the test database (DATABASE_URL, else the local test
database), migrated fresh and dropped afterwards, so tests run in parallel and leave nothing."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from cryptography.fernet import Fernet

import tests.fakes  # noqa: F401 - registers the test connectors
from sync import Engine, Settings

pytest_plugins = ["sync.testing", "tests.cli_backends"]

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
# One key for the session, inherited by worker subprocesses through the environment.
os.environ.setdefault("CONNECTOR_SYNC_SECRET_KEYS", Fernet.generate_key().decode())


def make_settings(schema: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": DATABASE_URL,
        "schema_name": schema,
        "backoff_seconds": (5.0, 30.0, 120.0),
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture
def settings(schema: str) -> Settings:
    return make_settings(schema)


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    with Engine(settings, pool_size=10) as eng:
        eng.migrate()
        yield eng


@pytest.fixture
def admin(schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection with search_path on the test schema, for inspecting state."""
    with psycopg.connect(
        DATABASE_URL,
        autocommit=True,
        options=f"-c search_path={schema}",
        row_factory=psycopg.rows.dict_row,
    ) as conn:
        yield conn
