"""Serves the operator page with uvicorn on a socket bound here, so that the address is
checked before anything listens and port 0 (any free port) can be reported."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator

import uvicorn

from sync.api import Engine
from sync.errors import InvalidInput
from sync.ui.app import UiOptions, create_app

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; a clear error if the address is taken or invalid."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise InvalidInput(f"cannot serve on {host!r}: {exc.strerror}; give an address") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise InvalidInput(
            f"cannot serve on {host}:{port}: {exc.strerror}; choose another --port"
        ) from None
    sock.listen(128)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def server_for(engine: Engine, options: UiOptions) -> uvicorn.Server:
    config = uvicorn.Config(
        create_app(engine, options),
        log_config=None,  # our logging: one line per request through the `uvicorn` loggers
        access_log=True,
        server_header=False,
        lifespan="off",
    )
    return uvicorn.Server(config)


def serve(
    engine: Engine,
    options: UiOptions,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM. Refuses a non-loopback address without authentication."""
    options.access.check(host)
    sock = bind(host, port)
    try:
        server = server_for(engine, options)
        if on_ready is not None:
            on_ready(url_of(sock))
        with _stop_signals_end_quietly():
            server.run(sockets=[sock])
    finally:
        sock.close()


@contextlib.contextmanager
def _stop_signals_end_quietly() -> Iterator[None]:
    """uvicorn shuts down gracefully on SIGINT or SIGTERM, then raises the signal again for the
    handler it found. That handler does nothing here: a stop signal is how an operator or a
    supervisor ends the page, and it exits 0."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
