"""A signal landing while the worker's main thread holds a lock its stop needs: SIGTERM while
the worker is waking itself (it stops itself when another process took its id over) must not
deadlock the process."""

from __future__ import annotations

import signal
import threading

from sync import Engine

WAIT = 60.0


def test_sigterm_while_the_worker_wakes_itself_does_not_deadlock(engine: Engine) -> None:
    """The signal lands while the main thread is inside the wake event's set() (a worker
    stopping itself, taken over): the handler must not need that lock in the same thread."""
    worker = engine.worker(worker_id="signalled", listen=False)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        worker._install_signal_handlers()
        handle = signal.getsignal(signal.SIGTERM)
        assert callable(handle)
        returned = threading.Event()

        def main_thread_inside_set() -> None:
            with worker._wake._cond:  # type: ignore[attr-defined]
                handle(signal.SIGTERM, None)
                returned.set()

        threading.Thread(target=main_thread_inside_set, daemon=True).start()
        assert returned.wait(WAIT), "the signal handler deadlocked on the wake event's lock"
        assert worker._wake.wait(WAIT)  # the stop went through once the lock was free
        assert worker._stop_requested
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
        worker.close()
