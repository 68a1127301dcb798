"""The Postgres implementation of the application queues runs the very contract suite the
in-memory one runs, on the real Postgres, with time from the same manual clock: through the
sync port (PostgresQueues) and through the async one (AsyncPostgresQueues on an
AsyncConnectionPool)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sync import Engine
from tests.queues_contract import Harness, QueuesContract
from tests.queues_contract_sending import SendingContract
from tests.queues_harnesses import KINDS, postgres_harness


class TestPostgresQueues(QueuesContract, SendingContract):
    @pytest.fixture(params=KINDS)
    def harness(self, request: pytest.FixtureRequest, engine: Engine) -> Iterator[Harness]:
        yield from postgres_harness(request.param, engine.pool, engine.settings.schema_name)
