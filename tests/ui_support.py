"""Helpers for the operator page's tests: the real server (uvicorn) in a thread, a worker loop in
a thread, a connector whose progress a test controls, and headless Chromium."""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

from connectors import Connector, Mode, PermanentError, Table, register
from sync import Engine, Worker
from sync.ui.app import UiOptions
from sync.ui.server import bind, server_for, url_of

ROOT = Path(__file__).parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "ui"
CHROMIUM = "/usr/bin/chromium"
# Without the networking flags Chromium keeps calling home, which this machine refuses.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def serving(engine: Engine, options: UiOptions | None = None) -> Iterator[str]:
    """The page served by uvicorn on a free port of 127.0.0.1, in a thread; yields its URL."""
    sock = bind("127.0.0.1", 0)
    server = server_for(engine, options or UiOptions(refresh_seconds=0.2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield url_of(sock).rstrip("/")
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@contextlib.contextmanager
def worker_loop(engine: Engine) -> Iterator[Worker]:
    """A real worker loop (LISTEN/NOTIFY, polls) in a thread, stopped afterwards."""
    worker = engine.worker()
    thread = threading.Thread(
        target=worker.run, kwargs={"install_signals": False}, name="ui-test-worker", daemon=True
    )
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(60)


class Browser:
    """A page, with every console error and uncaught exception it shows collected."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    def leave(self) -> None:
        """Stop the page's live parts (before its server stops, or they report errors)."""
        self.page.goto("about:blank")

    def expect_error_page(self) -> None:
        """An error page was loaded on purpose: the browser reports its status once; that
        report is not a fault of the page."""
        assert self.errors and "status of 404" in self.errors[-1], self.errors
        self.errors.pop()

    @contextlib.contextmanager
    def sent_back(self, status: int = 400) -> Iterator[None]:
        """A form sent inside this block comes back with its mistakes (``status``): the
        browser's report of that status is waited for, and is not a fault of the page."""
        said = f"status of {status}"
        with self.page.expect_console_message(lambda m: m.type == "error" and said in m.text):
            yield
        self.errors.remove(next(e for e in self.errors if said in e))

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's Chromium, headless, in a fresh profile (Playwright drives it; it downloads no
    browser of its own)."""
    from playwright.sync_api import sync_playwright

    if shutil.which(CHROMIUM) is None:
        raise RuntimeError(
            f"{CHROMIUM} is missing: install Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver), as .ci/run does"
        )
    profile = tempfile.mkdtemp(prefix="ui-test-chromium-")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                args=CHROMIUM_ARGS,
                headless=True,
                viewport={"width": 1280, "height": 800},
            )
            try:
                context.set_default_timeout(30_000)
                yield Browser(context.new_page())
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


# -- a connector whose progress the test controls ------------------------------------------------


@dataclass
class Gate:
    """Rows before ``pause_at`` flow; then the read waits for ``release`` (or an abort)."""

    rows: int
    pause_at: int
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    fail_with: str | None = None


GATES: dict[str, Gate] = {}


def new_gate(rows: int = 300, pause_at: int = 150, fail_with: str | None = None) -> str:
    key = uuid.uuid4().hex
    GATES[key] = Gate(rows, pause_at, fail_with=fail_with)
    return key


class GateConfig(BaseModel):
    gate: str


@register
class GatedConnector(Connector[GateConfig]):
    provider = "ui_gated"
    tables = (Table("items", "id", Mode.FULL),)
    config_model = GateConfig

    def read(self, table: Table) -> Iterator[Any]:
        config = self.context.config
        gate = GATES[config.gate]
        for index in range(gate.rows):
            if index == gate.pause_at:
                gate.reached.set()
                # Waits for the test, or ends at once if the run is cancelled.
                while not gate.release.wait(0.05):
                    self.context.check_abort()
                if gate.fail_with is not None:
                    raise PermanentError(gate.fail_with)
            yield {"id": index, "title": f"item {index}"}
        if gate.fail_with is not None and gate.pause_at >= gate.rows:
            raise PermanentError(gate.fail_with)


# -- reading the page over HTTP -------------------------------------------------------------------

CSRF_META = re.compile(r'<meta name="csrf-token" content="([0-9a-f]+)">')


def csrf_token(client: httpx.Client, url: str) -> str:
    """Loads a page (which sets the CSRF cookie in the client) and returns its token."""
    page = client.get(url, headers={"accept": "text/html"})
    found = CSRF_META.search(page.text)
    assert found, f"no CSRF token on {url} ({page.status_code})"
    return found.group(1)
