"""The in-memory implementation of the application queues runs the contract suite, through its
sync port and through its async twin."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.queues_contract import Harness, QueuesContract
from tests.queues_contract_sending import SendingContract
from tests.queues_harnesses import KINDS, memory_harness


class TestInMemoryQueues(QueuesContract, SendingContract):
    @pytest.fixture(params=KINDS)
    def harness(self, request: pytest.FixtureRequest) -> Iterator[Harness]:
        yield from memory_harness(request.param)
