"""The lane slots a worker runs for the application queues, for tests that drive them without a
worker: built by the queues' own kind factory, run through an executor on a lease keeper."""

from __future__ import annotations

import uuid

from sync.base.settings import Settings
from sync.base.signals import TestSignal
from sync.jobs.executor import Executor
from sync.jobs.lease import LeaseKeeper
from sync.jobs.metrics import WorkerMetrics
from sync.jobs.registry import WorkerParts
from sync.queues.kind import Completions, QueueJobs, slots
from sync.queues.postgres import PostgresQueues
from sync.worker.slots import Slot


class Lanes:
    def __init__(
        self,
        queues: PostgresQueues,
        lanes: dict[str, int],
        keeper: LeaseKeeper,
        settings: Settings,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        text = ",".join(f"{queue}={count}" for queue, count in lanes.items())
        settings = settings.model_copy(update={"lanes": text})
        metrics = metrics or WorkerMetrics()
        parts = WorkerParts(
            pool=queues.store.pool,
            settings=settings,
            secrets=None,
            worker_id=f"lanes-{uuid.uuid4().hex[:6]}",
            incarnation=uuid.uuid4(),
            providers=lambda: (),
            metrics=metrics,
            queues=queues,
        )
        self.executor = Executor(keeper, parts.worker_id, metrics)
        self.slots = [
            Slot(spec, self.executor, poll_interval=settings.poll_interval, metrics=metrics)
            for spec in slots(parts)
        ]
        self.services = [s for slot in self.slots for s in slot.spec.services]

    @property
    def served(self) -> dict[str, int]:
        return {slot.spec.wakes_on or "": slot.spec.lanes for slot in self.slots}

    @property
    def completions(self) -> Completions:
        kind = self.slots[0].kind
        assert isinstance(kind, QueueJobs)
        return kind.completions

    @property
    def claims(self) -> int:
        return sum(slot.claims for slot in self.slots)

    @property
    def units_run(self) -> int:
        return sum(slot.units_run for slot in self.slots)

    @property
    def claimed(self) -> TestSignal:
        (slot,) = self.slots
        return slot.claimed

    def wait_for_claims(self, count: int, timeout: float = 30.0) -> bool:
        """Until the lanes (of the one queue) have made ``count`` claims in all."""
        (slot,) = self.slots
        return slot.claimed.wait_for(count, timeout)

    def start(self) -> None:
        for slot in self.slots:
            slot.start()

    def wake(self, queue: str | None = None) -> None:
        for slot in self.slots:
            if queue is None or slot.spec.wakes_on == queue:
                slot.wake()

    def stop(self) -> None:
        for slot in self.slots:
            slot.stop()
