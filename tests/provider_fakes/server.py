"""A provider fake served over HTTP on 127.0.0.1, for worker processes: every request is
answered by a handler of the respx kind (``httpx.Request`` in, ``httpx.Response`` out) and
logged with when it arrived.

A provider announces a window as a real one does: ``throttle`` answers the next matching request
429 with ``Retry-After``, and from that answer until the window ends every request that arrives
is answered 429 too, without saying again how long to wait (a provider being hammered does not
repeat itself), and counted in ``early``, whoever sends it. A request that was already on its
way when the 429 left (it arrives within ``IN_FLIGHT`` of it) is not the client's fault and is
not counted; anything later is."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from sync.base.signals import TestSignal

Handler = Callable[[httpx.Request], httpx.Response]
IN_FLIGHT = 0.2  # seconds after the 429 in which a request may have been sent before it


@dataclass(frozen=True)
class Logged:
    method: str
    path: str  # with the query
    status: int
    arrived: float  # time.monotonic()


@dataclass
class Window:
    matches: Callable[[httpx.Request], bool]
    seconds: float
    opened: float | None = None  # when the 429 that announced it was answered

    def holds(self, now: float) -> bool:
        return self.opened is not None and now < self.opened + self.seconds


class ProviderServer:
    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._lock = threading.Lock()
        self.log: list[Logged] = []
        self.early: list[Logged] = []
        self.windows: list[Window] = []
        self.answered = TestSignal()  # emitted after each answer is logged
        server = self

        class _Request(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return None

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                request = httpx.Request(
                    self.command,
                    f"{server.url}{self.path}",
                    headers=list(self.headers.items()),
                    content=body,
                )
                response = server.answer(request, time.monotonic())
                content = response.content
                self.send_response(response.status_code)
                for name, value in response.headers.multi_items():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(content)

            do_GET = do_POST = do_PATCH = do_DELETE = do_HEAD = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Request)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ProviderServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def throttle(
        self, seconds: float, matches: Callable[[httpx.Request], bool] = lambda _: True
    ) -> Window:
        """The next request that ``matches`` is answered 429 with ``Retry-After: seconds``,
        opening a window in which every request is early."""
        window = Window(matches, seconds)
        with self._lock:
            self.windows.append(window)
        return window

    def answer(self, request: httpx.Request, arrived: float) -> httpx.Response:
        with self._lock:
            open_window = next((w for w in self.windows if w.holds(arrived)), None)
            armed = next((w for w in self.windows if w.opened is None and w.matches(request)), None)
            if open_window is not None:
                if arrived > open_window.opened + IN_FLIGHT:  # type: ignore[operator]
                    self.early.append(self._logged(request, 429, arrived))
                response = _too_many(None)
            elif armed is not None:
                armed.opened = time.monotonic()
                response = _too_many(armed.seconds)
            else:
                response = None
        if response is None:
            response = self._handler(request)
        with self._lock:
            self.log.append(self._logged(request, response.status_code, arrived))
        self.answered.emit()
        return response

    def requests(self, contains: str = "", status: int | None = None) -> list[Logged]:
        with self._lock:
            return [
                r for r in self.log if contains in r.path and (status is None or r.status == status)
            ]

    @staticmethod
    def _logged(request: httpx.Request, status: int, arrived: float) -> Logged:
        return Logged(request.method, request.url.raw_path.decode(), status, arrived)


def _too_many(seconds: float | None) -> httpx.Response:
    headers = {} if seconds is None else {"retry-after": str(int(seconds))}
    return httpx.Response(429, headers=headers, json={"message": "Too Many Requests"})
