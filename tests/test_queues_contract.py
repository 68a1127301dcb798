"""The in-memory implementation of the application queues runs the contract suite."""

from __future__ import annotations

import pytest

from sync.queues import InMemoryQueues, ManualClock
from tests.queues_contract import Harness, QueuesContract


class TestInMemoryQueues(QueuesContract):
    @pytest.fixture
    def harness(self) -> Harness:
        clock = ManualClock()
        queues = InMemoryQueues(clock=clock)
        return Harness(queues=queues, runner=queues, clock=clock)
