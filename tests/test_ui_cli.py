"""``connector-sync ui`` as an operator starts it: the installed script in a subprocess."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sync import Engine
from tests.conftest import DATABASE_URL, make_settings
from tests.ui_support import CSRF_META, csrf_token

# Every test here starts a process of its own (see tests/conftest.py).
pytestmark = pytest.mark.slow

SCRIPT = Path(sys.executable).parent / "connector-sync"
HTML = {"accept": "text/html"}


def environment(schema: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_SYNC_UI_")}
    return {**env, "DATABASE_URL": DATABASE_URL, "CONNECTOR_SYNC_SCHEMA": schema, **extra}


@dataclass
class RunningUi:
    address: str  # as the script reports it
    base: str  # where this test reaches it
    ready: str  # the line saying it serves
    lines: list[str] = field(default_factory=list)  # its log lines, all of them once it ended
    output: str = ""  # stdout and stderr, once it ended


@contextlib.contextmanager
def running_ui(args: list[str], env: dict[str, str]) -> Iterator[RunningUi]:
    """`connector-sync ui ARGS --port 0` until the block ends, then SIGTERM (what a supervisor
    sends); it must exit 0 without a traceback. Waits for the line saying where it serves."""
    process = subprocess.Popen(
        [str(SCRIPT), "ui", *args, "--port", "0"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()  # None: its stderr closed

    def read() -> None:
        for line in process.stderr or ():
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        while True:
            line = lines.get(timeout=60)
            assert line is not None, "it ended before serving:\n" + "".join(seen)
            seen.append(line)
            found = re.search(r"serving the operator page on http://(\S+):(\d+)/", line)
            if found:
                break
        ui = RunningUi(found.group(1), f"http://127.0.0.1:{found.group(2)}", line, seen)
        yield ui
    finally:
        process.send_signal(signal.SIGTERM)
        # Not communicate(): it would read stderr too, taking lines from the reader.
        process.wait(timeout=60)
        reader.join(60)
        stdout = process.stdout.read() if process.stdout else ""  # it prints nothing there
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    seen.extend(line for line in iter(lines.get_nowait, None))
    ui.output = stdout + "".join(seen)
    assert process.returncode == 0, ui.output
    assert "Traceback" not in ui.output


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "ops.example.internal"])
def test_a_non_local_bind_refuses_to_start_without_authentication(host: str) -> None:
    # The database is unreachable on purpose: the address is refused before it is looked at.
    env = environment("sync", DATABASE_URL="postgresql://u@127.0.0.1:1/none")
    result = subprocess.run(
        [str(SCRIPT), "ui", "--host", host], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: refusing to serve the operator page on {host}")
    assert "CONNECTOR_SYNC_UI_TOKEN" in lines[0] and "--auth-header" in lines[0]


def test_a_token_short_enough_to_guess_is_refused() -> None:
    env = environment("sync", CONNECTOR_SYNC_UI_TOKEN="x7Qz-short")
    result = subprocess.run(
        [str(SCRIPT), "ui", "--host", "0.0.0.0"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: CONNECTOR_SYNC_UI_TOKEN is too short")
    assert "x7Qz-short" not in result.stderr


def test_with_a_token_it_serves_any_address_and_asks_every_request_for_it(schema: str) -> None:
    subprocess.run(
        [str(SCRIPT), "migrate"], env=environment(schema), check=True, capture_output=True
    )
    password = "canary-" + uuid.uuid4().hex  # the test server trusts local connections
    token = "token-" + uuid.uuid4().hex
    env = environment(
        schema,
        DATABASE_URL=psycopg.conninfo.make_conninfo(DATABASE_URL, password=password),
        CONNECTOR_SYNC_UI_TOKEN=token,
    )
    with running_ui(["--host", "0.0.0.0"], env) as ui:
        assert ui.address == "0.0.0.0"
        assert httpx.get(f"{ui.base}/runs").status_code == 401
        page = httpx.get(f"{ui.base}/connections", headers={"authorization": f"Bearer {token}"})
        assert page.status_code == 200
        assert f"schema {schema}" in page.text  # which database, without its password
        assert password not in page.text and token not in page.text
    assert password not in ui.output and token not in ui.output
    assert any("GET /runs" in line and "401" in line for line in ui.lines)  # the access log


def a_connection(schema: str) -> int:
    """A migrated schema with one active connection (nothing runs it)."""
    with Engine(make_settings(schema)) as engine:
        engine.migrate()
        ws = engine.create_workspace("acme")
        config = {"base_url": "http://127.0.0.1:1", "tenant": "acme"}
        return engine.create_connection(
            ws.id, "tracker", "simulated", config=config, credentials={"token": "sim-acme"}
        ).id


def connection_status(schema: str, connection_id: int) -> str:
    with Engine(make_settings(schema)) as engine:
        return engine.connection(connection_id).status


def test_read_only_refuses_an_action(schema: str) -> None:
    connection = a_connection(schema)
    with running_ui(["--read-only"], environment(schema)) as ui:
        assert ui.ready.rstrip().endswith("(read-only)")
        with httpx.Client(base_url=ui.base) as client:
            page = client.get("/connections", headers=HTML)
            assert page.status_code == 200 and "read-only" in page.text
            assert 'method="post"' not in page.text  # no action offered
            token = csrf_token(client, "/connections")
            for action in ("pause", "sync"):
                refused = client.post(
                    f"/connections/{connection}/{action}", data={"csrf_token": token}
                )
                assert refused.status_code == 403, action
                assert refused.text.strip() == (
                    "403: this page is read-only (started with --read-only); act from the "
                    "command line"
                )
    assert connection_status(schema, connection) == "active"
    with Engine(make_settings(schema)) as engine:
        assert engine.runs() == []


def test_behind_a_proxy_the_auth_header_lets_in_only_requests_that_carry_it(
    schema: str,
) -> None:
    connection = a_connection(schema)
    header = "X-Forwarded-User"
    with running_ui(["--host", "0.0.0.0", "--auth-header", header], environment(schema)) as ui:
        assert ui.address == "0.0.0.0"  # a non-local bind, allowed by the header alone
        with httpx.Client(base_url=ui.base) as client:
            for path in ("/connections", "/runs", "/metrics"):
                refused = client.get(path)
                assert refused.status_code == 401, path
                assert header in refused.text
                assert client.get(path, headers={header: ""}).status_code == 401, path
            signed_in = {header: "alice@example.com"}
            page = client.get("/connections", headers={**HTML, **signed_in})
            assert page.status_code == 200 and "alice@example.com" in page.text
            assert client.get("/metrics", headers=signed_in).status_code == 200
            # An action needs the header too, besides the CSRF token (the page set its cookie).
            token = CSRF_META.search(page.text)
            assert token is not None
            pause = f"/connections/{connection}/pause"
            form = {"csrf_token": token.group(1)}
            assert client.post(pause, data=form).status_code == 401
            assert connection_status(schema, connection) == "active"
            assert client.post(pause, data=form, headers=signed_in).status_code == 303
    assert connection_status(schema, connection) == "paused"


def test_it_refuses_to_serve_a_database_whose_schema_is_behind(schema: str) -> None:
    result = subprocess.run(
        [str(SCRIPT), "ui", "--port", "0"],
        env=environment(schema),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "run `connector-sync migrate`" in lines[-1]
    assert "serving" not in result.stderr


def test_a_worker_serves_its_own_metrics_on_the_metrics_port(schema: str) -> None:
    env = environment(schema)
    subprocess.run([str(SCRIPT), "migrate"], env=env, check=True, capture_output=True)
    process = subprocess.Popen(
        [str(SCRIPT), "worker", "--id", "scraped", "--metrics-port", "0"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(
        target=lambda: [lines.put(line) for line in process.stderr or ()], daemon=True
    )
    reader.start()
    seen: list[str] = []
    try:
        while True:
            line = lines.get(timeout=60)
            seen.append(line)
            found = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", line)
            if found:
                break
        port = int(found.group(1))
        scrape = httpx.get(f"http://127.0.0.1:{port}/metrics")
        assert scrape.status_code == 200
        names = {f.name for f in text_string_to_metric_families(scrape.text)}
        assert {
            "connector_sync_worker_claim_seconds",
            "connector_sync_worker_attempt_seconds",
            "connector_sync_worker_records",
            "connector_sync_worker_rate_limit_waits",
            "connector_sync_worker_lease_losses",
        } <= names
        # A second worker asking for the same port gets one clear line.
        taken = subprocess.run(
            [str(SCRIPT), "worker", "--id", "second", "--metrics-port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert taken.returncode == 2, taken.stderr
        last = taken.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: --metrics-port: cannot listen on 127.0.0.1:{port}")
        assert "Traceback" not in taken.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
        reader.join(10)
    assert process.returncode == 0, "".join(seen)
