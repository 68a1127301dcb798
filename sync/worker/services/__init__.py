"""The worker's services: small periodic tasks, each with ``run_once()`` (what ``Worker.poll()``
and tests call), ``start()``/``stop()`` (a timer thread of its own, so a long run never starves
it) and test signals. The heartbeat and the schedule enqueuer run on every worker; the sweeper
and the cleaner run on one worker of the fleet per interval (a durable marker in the database)."""

from sync.base.signals import TestSignal
from sync.jobs.service import Service, ServiceSignals
from sync.worker.services.cleaner import Cleaner, PruneReport, Retained, RetentionRules, prune
from sync.worker.services.fleet_task import FleetTask
from sync.worker.services.heartbeat import Heartbeat
from sync.worker.services.providers import ProviderLoader
from sync.worker.services.schedules import ScheduleEnqueuer
from sync.worker.services.sweeper import SeenKeySweeper

__all__ = [
    "Cleaner",
    "FleetTask",
    "Heartbeat",
    "ProviderLoader",
    "PruneReport",
    "Retained",
    "RetentionRules",
    "ScheduleEnqueuer",
    "SeenKeySweeper",
    "Service",
    "ServiceSignals",
    "TestSignal",
    "prune",
]
