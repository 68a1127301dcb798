"""``connector-sync ui`` as an operator starts it: the installed script in a subprocess."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DATABASE_URL

# Every test here starts a process of its own (see tests/conftest.py).
pytestmark = pytest.mark.slow

SCRIPT = Path(sys.executable).parent / "connector-sync"


def environment(schema: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_SYNC_UI_")}
    return {**env, "DATABASE_URL": DATABASE_URL, "CONNECTOR_SYNC_SCHEMA": schema, **extra}


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
    process = subprocess.Popen(
        [str(SCRIPT), "ui", "--host", "0.0.0.0", "--port", "0"],
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
            found = re.search(r"serving the operator page on http://0\.0\.0\.0:(\d+)/", line)
            if found:
                break
        base = f"http://127.0.0.1:{found.group(1)}"
        assert httpx.get(f"{base}/runs").status_code == 401
        page = httpx.get(f"{base}/connections", headers={"authorization": f"Bearer {token}"})
        assert page.status_code == 200
        assert f"schema {schema}" in page.text  # which database, without its password
        assert password not in page.text and token not in page.text
    finally:
        process.send_signal(signal.SIGTERM)  # what a supervisor sends
        stdout, _ = process.communicate(timeout=60)
        reader.join(10)
    while not lines.empty():
        seen.append(lines.get())
    output = stdout + "".join(seen)
    assert process.returncode == 0, output
    assert "Traceback" not in output
    assert password not in output and token not in output
    assert any("GET /runs" in line and "401" in line for line in seen)  # the access log


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
            "connector_sync_worker_run_seconds",
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
