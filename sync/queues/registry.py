"""The handlers a process registered: one per queue, each with its optional ``on_dead`` hook and,
for a batch handler, the most jobs it takes at a time."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sync.errors import Conflict, InvalidInput
from sync.queues.port import MAX_BATCH, BatchHandler, DeadHook, Handler


@dataclass(frozen=True)
class Registration:
    queue: str
    handler: Handler | BatchHandler
    on_dead: DeadHook | None
    batch: int | None = None  # a batch handler's size; None: one job per call


class HandlerRegistry:
    def __init__(self) -> None:
        self._by_queue: dict[str, Registration] = {}
        self._lock = threading.Lock()

    def register(
        self,
        queue: str,
        handler: Handler | BatchHandler,
        *,
        on_dead: DeadHook | None = None,
        batch: int | None = None,
    ) -> None:
        if not callable(handler) or (on_dead is not None and not callable(on_dead)):
            raise InvalidInput(f"the handler and on_dead hook of queue {queue!r} must be callable")
        if batch is not None and (
            isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH
        ):
            raise InvalidInput(
                f"the batch size of queue {queue!r} must be from 1 to {MAX_BATCH}, not {batch!r}"
            )
        with self._lock:
            if queue in self._by_queue:
                raise Conflict(
                    f"queue {queue!r} already has a handler ({_name(self._by_queue[queue])}); "
                    "a queue has one handler per process"
                )
            self._by_queue[queue] = Registration(queue, handler, on_dead, batch)

    def get(self, queue: str) -> Registration | None:
        with self._lock:
            return self._by_queue.get(queue)

    def queues(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._by_queue)


def _name(registration: Registration) -> str:
    handler = registration.handler
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', handler)}"
