"""The Postgres implementation of the application queues runs the very contract suite the
in-memory one runs, on the real Postgres, with time from the same manual clock."""

from __future__ import annotations

import pytest

from sync import Engine
from sync.queues import ManualClock
from sync.queues.postgres import PostgresQueues
from tests.queues_contract import Harness, QueuesContract


class TestPostgresQueues(QueuesContract):
    @pytest.fixture
    def harness(self, engine: Engine) -> Harness:
        clock = ManualClock()
        queues = PostgresQueues(engine.pool, clock=clock)
        return Harness(queues=queues, runner=queues, clock=clock)
