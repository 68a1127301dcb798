"""The shared vocabulary: its values are the strings Postgres stores, every kind a connector's
error carries is one of the engine's, and a run's error reads back as it was written."""

from __future__ import annotations

import inspect
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

import connectors.errors
from connectors.errors import ConnectorError, PermanentError, RateLimited, RetryableError
from sync.vocabulary import (
    RETRYABLE_KINDS,
    ConnectionStatus,
    ErrorKind,
    JobError,
    RunKind,
    RunStatus,
)


def test_members_compare_equal_to_the_strings_postgres_stores() -> None:
    assert RunStatus.QUEUED == "queued" and RunKind.PURGE == "purge"
    assert f"{RunStatus.PARTIAL}" == "partial" and str(ConnectionStatus.DELETING) == "deleting"


@pytest.mark.parametrize(
    "klass",
    [
        c
        for _, c in inspect.getmembers(connectors.errors, inspect.isclass)
        if issubclass(c, ConnectorError)
    ],
)
def test_every_connector_error_kind_is_an_engine_error_kind(klass: type[ConnectorError]) -> None:
    assert klass.kind in set(ErrorKind)
    assert ErrorKind.of(klass.__new__(klass)) == klass.kind


def test_a_third_partys_own_kind_reads_as_the_nearest_known_one() -> None:
    class Throttled(RetryableError):
        kind = "throttled"

    class Odd(PermanentError):
        kind = "odd"

    assert JobError.of(Throttled("slow down")) == JobError(ErrorKind.RETRYABLE, "slow down")
    assert JobError.of(Odd("no")).kind is ErrorKind.PERMANENT
    assert JobError.of(RateLimited("429", 30)) == JobError(ErrorKind.RATE_LIMITED, "429", 30)


def test_an_unknown_stored_kind_reads_as_an_error_not_a_crash() -> None:
    error = JobError.from_json({"kind": "from_a_newer_version", "message": "m"})
    assert error == JobError(ErrorKind.ERROR, "m")
    assert not error.is_retryable
    assert JobError(ErrorKind.DATABASE, "x").is_retryable and ErrorKind.DATABASE in RETRYABLE_KINDS


@given(
    st.builds(
        JobError,
        kind=st.sampled_from(list(ErrorKind)),
        message=st.text(max_size=30),
        retry_after=st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)),
        table=st.one_of(st.none(), st.text(max_size=8)),
        partition=st.one_of(st.none(), st.text(max_size=8)),
    )
)
def test_a_run_error_reads_back_as_it_was_stored(error: JobError) -> None:
    assert JobError.from_json(error.to_json()) == error


def test_postgres_gets_the_value_of_a_member(admin: psycopg.Connection[Any]) -> None:
    row = admin.execute(
        "SELECT %s::text AS status, %s::text[] AS statuses",
        (RunStatus.WAITING, [ConnectionStatus.PAUSED]),
    ).fetchone()
    assert row == {"status": "waiting", "statuses": ["paused"]}
