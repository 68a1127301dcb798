"""The worker process: the loop (:class:`Worker`), its LISTEN connection (:class:`Listener`) and
its services (heartbeat, due schedules, seen-key sweep, retention)."""

from sync.worker.loop import Listener, Worker

__all__ = ["Listener", "Worker"]
