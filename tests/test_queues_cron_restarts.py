"""A worker that serves application queues runs its applications' ``setup`` at every start,
which declares their queues and schedules again. A schedule survives that: a tick that came
while no worker ran fires once when workers start again, as the cron rule says (once per tick
across all workers, never a backlog), and declaring the schedule again does not move its next
tick. Time is a manual clock the workers' queues read."""

from __future__ import annotations

from datetime import UTC, datetime

from sync import Engine, Settings
from sync.queues import ManualClock
from sync.queues.postgres import PostgresQueues
from tests.conftest import make_settings
from tests.queue_apps import SWEEP

APP = "tests.queue_apps:sweep"  # declares SWEEP with the schedule "*/5 * * * *"


def minute(n: int) -> datetime:
    return datetime(2030, 1, 1, 0, n, tzinfo=UTC)


class ClockedEngine(Engine):
    """The engine of one worker process, whose application queues read ``clock``."""

    def __init__(self, settings: Settings, clock: ManualClock) -> None:
        super().__init__(settings, pool_size=4)
        self._clocked = PostgresQueues(self.pool, lease=settings.lease_seconds, clock=clock)

    @property
    def queues(self) -> PostgresQueues:
        return self._clocked


def a_worker_runs(settings: Settings, clock: ManualClock, worker_id: str) -> None:
    """A worker process starts (its application is set up), polls once and stops."""
    with ClockedEngine(settings, clock) as engine:
        worker = engine.worker(worker_id=worker_id, listen=False, apps=[APP])
        try:
            worker.poll()
            assert worker.stage_failures == {}
        finally:
            worker.close()


def test_a_tick_that_came_while_no_worker_ran_fires_once_when_workers_start_again(
    engine: Engine, schema: str
) -> None:
    settings = make_settings(schema, lanes=f"{SWEEP}=1")
    clock = ManualClock(minute(1))
    a_worker_runs(settings, clock, "worker-a")
    assert engine.queues.list_jobs(queue=SWEEP) == []

    clock.advance_to(minute(32))  # the ticks of 00:05 ... 00:30 came while no worker ran
    a_worker_runs(settings, clock, "worker-b")
    a_worker_runs(settings, clock, "worker-c")

    jobs = engine.queues.list_jobs(queue=SWEEP)
    assert [job.tick for job in jobs] == [minute(30)]
    (schedule,) = engine.queues.list_schedules()
    assert (schedule.last_tick, schedule.next_tick) == (minute(30), minute(35))
