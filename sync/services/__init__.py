"""The worker's services: small periodic tasks, each with ``run_once()`` (what ``Worker.poll()``
and tests call), ``start()``/``stop()`` (a timer thread of its own, so a long run never starves
it) and test signals. The heartbeat and the schedule enqueuer run on every worker; the sweeper
and the cleaner run on one worker of the fleet per interval (a durable marker in the database)."""

from sync.services.base import Service, ServiceSignals
from sync.services.cleaner import Cleaner, Kind, PruneReport, RetentionRules, prune
from sync.services.fleet_task import FleetTask
from sync.services.heartbeat import Heartbeat
from sync.services.schedules import ScheduleEnqueuer
from sync.services.sweeper import SeenKeySweeper
from sync.signals import TestSignal

__all__ = [
    "Cleaner",
    "FleetTask",
    "Heartbeat",
    "Kind",
    "PruneReport",
    "RetentionRules",
    "ScheduleEnqueuer",
    "SeenKeySweeper",
    "Service",
    "ServiceSignals",
    "TestSignal",
    "prune",
]
