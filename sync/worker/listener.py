"""The worker's LISTEN connection: wakes the worker's loop on a notification of a run, and the
lanes of an application queue on one of that queue's jobs (``job:<queue>``)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable

import psycopg

from sync.base.settings import Settings
from sync.base.signals import TestSignal
from sync.store.db import connect_listener, first_line

log = logging.getLogger("sync.worker")


class Listener:
    """Holds a LISTEN connection and sets ``wake`` on every notification of a run; one of an
    application job (``job:<queue>``) wakes only that queue's lanes (``on_job``). Reconnects
    with backoff when the connection drops, and wakes the worker and every lane after
    reconnecting, since notifications sent meanwhile are lost."""

    def __init__(
        self,
        settings: Settings,
        url: str,
        wake: threading.Event,
        on_job: Callable[[str | None], object] | None = None,
        worker_id: str | None = None,
    ) -> None:
        self._settings = settings
        self._worker_id = worker_id  # also listens on this worker's own channel
        self._url = url
        self._wake = wake
        self._on_job = on_job
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # A second handle on the LISTEN session's socket, for stop() to shut it down with.
        self._socket: socket.socket | None = None
        self.connected = threading.Event()
        self.failures = 0
        self.lost = TestSignal()  # emitted each time the connection is lost

    def start(self) -> None:
        if self.alive:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="listener", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        # The session waits for a notification with no statement running, so a cancel request
        # would not end the wait (only the next liveness check would, seconds later): shutting
        # its socket down ends it at once. The handle is a duplicate the loop owns, so its
        # number can never name another connection's socket meanwhile.
        handle = self._socket
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        delay = 0.5
        while not self._stopping.is_set():
            try:
                with connect_listener(self._settings, self._url) as conn:
                    self._socket = socket.socket(fileno=os.dup(conn.pgconn.socket))
                    if self._stopping.is_set():
                        return
                    # The listener's own statements stay here rather than in a store: they run
                    # on this dedicated session (not the pool's, and past any transaction
                    # pooler), which has no search_path of the engine's, so the names are
                    # schema-qualified with psycopg.sql, and LISTEN takes its channel as an
                    # identifier, never a parameter. Neither fits a named statement.
                    channel = conn.execute(
                        psycopg.sql.SQL("SELECT {}.notify_channel() AS c").format(
                            psycopg.sql.Identifier(self._settings.schema_name)
                        )
                    ).fetchone()
                    assert channel is not None
                    conn.execute(
                        psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel["c"]))
                    )
                    if self._worker_id is not None:
                        own = conn.execute(
                            psycopg.sql.SQL("SELECT {}.worker_channel_v3(%s) AS c").format(
                                psycopg.sql.Identifier(self._settings.schema_name)
                            ),
                            (self._worker_id,),
                        ).fetchone()
                        assert own is not None
                        conn.execute(
                            psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(own["c"]))
                        )
                    self.connected.set()
                    self._wake.set()
                    if self._on_job is not None:
                        self._on_job(None)
                    delay = 0.5
                    while not self._stopping.is_set():
                        # The timeout doubles as a liveness check of a half-open connection.
                        timeout = self._settings.listen_check_interval
                        for note in conn.notifies(timeout=timeout, stop_after=1):
                            if not note.payload.startswith("job:"):
                                self._wake.set()
                            elif self._on_job is not None:
                                self._on_job(note.payload[4:])
                        conn.execute("SELECT 1")
            except Exception as exc:
                self.connected.clear()
                if self._stopping.is_set():
                    return
                self.failures += 1
                self.lost.emit()
                log.warning(
                    "LISTEN connection lost (%s); reconnecting in %.1f s", first_line(exc), delay
                )
                self._stopping.wait(delay)
                delay = min(delay * 2, self._settings.max_backoff)
            finally:
                handle, self._socket = self._socket, None
                if handle is not None:
                    handle.close()
