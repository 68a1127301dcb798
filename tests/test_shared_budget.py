"""One budget for every job that talks to a provider: a window one job heard of (a Retry-After it
sleeps out inside its own attempt, however short) holds the next request of every other job on
the same budget, which waits for it or hands its attempt back, sending nothing. Two jobs in one
process here, on the real database; across worker processes and against a provider that counts
early requests, in tests/test_provider_contracts.py."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import respx

from connectors import HttpClient, NoConfig, RateLimited
from sync import Engine
from sync.base.abort import AbortSignal
from sync.ingestions.context import IngestionContext
from tests.fakes import MemoryConnector

BASE = "https://api.example.test"
KEY = "github:0123456789abcdef01234567"


class Job(IngestionContext):
    """A download's context whose sleeps are recorded, not slept."""

    slept: list[float]

    def sleep(self, seconds: float) -> None:
        self.check_abort()
        self.slept.append(seconds)


def job(
    engine: Engine, connection_id: int, *, max_inline_wait: float, budget_key: str | None = KEY
) -> Job:
    context = Job(
        lease=None,
        connection_id=connection_id,
        provider="memory",
        budget_key=budget_key,
        connector_class=MemoryConnector,
        config=NoConfig(),
        credentials={},
        stopper=AbortSignal(),
        pool=engine.pool,
        secrets=None,
        max_inline_wait=max_inline_wait,
        logger=logging.LoggerAdapter(logging.getLogger("test"), {}),
    )
    context.slept = []
    return context


def test_a_short_window_one_job_sleeps_out_holds_every_other_job_on_the_budget(
    engine: Engine, respx_mock: respx.MockRouter
) -> None:
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": "none"})
    first = respx_mock.get(f"{BASE}/first").mock(
        side_effect=[
            httpx.Response(429, headers={"Retry-After": "20"}),
            httpx.Response(200, json={"ok": 1}),
        ]
    )
    second = respx_mock.get(f"{BASE}/second").mock(return_value=httpx.Response(200, json={}))

    # One job hears of a 20 s window and sleeps it out inside its attempt (20 s is short).
    sync_job = job(engine, conn.id, max_inline_wait=30)
    before = datetime.now(UTC)
    with HttpClient(sync_job, base_url=BASE) as client:
        assert client.get_json("/first") == {"ok": 1}
    assert first.call_count == 2 and sum(sync_job.slept) >= 19

    # Another job on the same budget, which may sleep nothing inside its attempt, sends nothing
    # before the window ends: it hands its attempt back until then.
    download = job(engine, conn.id, max_inline_wait=0)
    with HttpClient(download, base_url=BASE) as client, pytest.raises(RateLimited) as limited:
        client.get("/second")
    assert second.call_count == 0
    assert limited.value.retry_after is not None
    ends = datetime.now(UTC) + timedelta(seconds=limited.value.retry_after)
    assert before + timedelta(seconds=19) <= ends <= datetime.now(UTC) + timedelta(seconds=20)


def test_a_connection_whose_connector_names_no_budget_has_one_of_its_own(
    engine: Engine, respx_mock: respx.MockRouter
) -> None:
    ws = engine.create_workspace("acme")
    one = engine.create_connection(ws.id, "one", "memory", config={"dataset": "none"})
    other = engine.create_connection(ws.id, "other", "memory", config={"dataset": "none"})
    respx_mock.get(f"{BASE}/items").mock(return_value=httpx.Response(200, json={}))

    def unkeyed(connection_id: int) -> Job:
        return job(engine, connection_id, max_inline_wait=0, budget_key=None)

    first = unkeyed(one.id)
    first.report_rate_limit(datetime.now(UTC) + timedelta(seconds=60), "429 from GET /items")
    with HttpClient(unkeyed(one.id), base_url=BASE) as client, pytest.raises(RateLimited):
        client.get("/items")  # the same connection: held
    with HttpClient(unkeyed(other.id), base_url=BASE) as client:
        assert client.get("/items").status_code == 200  # another connection: free
