"""Renders the screenshots of the operator page in docs/images/ (and prints a /metrics scrape).

    python scripts/render_ui_screenshots.py [OUTPUT_DIR]

Needs the test extras (`pip install -e '.[test]'`), Debian's chromium, and a Postgres in
DATABASE_URL (default: the local test database). It works in a schema of its own, dropped at the
end: the simulated provider serves two tenants, a worker loop syncs their connections (one with
a refused token, one paused, one held part-way so a run is shown running), serves application
queues (a bounced mail in its dead-letter queue, a report held running) and indexes two local
files (one gone before it is read), and headless Chromium photographs each page, the connection
forms, and three pages as a 390 px phone shows them.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from cryptography.fernet import Fernet
from playwright.sync_api import expect
from pydantic import SecretStr

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from connectors.simulated.server import Simulation, start_server  # noqa: E402
from sync import Engine, Settings  # noqa: E402
from sync.queues import Abort, Job, JobStatus, queue_spec  # noqa: E402
from sync.store.db import describe  # noqa: E402
from sync.ui.app import UiOptions  # noqa: E402
from tests.ui_support import GATES, chromium, new_gate, serving, worker_loop  # noqa: E402

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


def wait_until_terminal(engine: Engine, run_ids: list[int]) -> None:
    pause = threading.Event()  # never set: a wait between looks at the runs
    while not all(engine.run(r).is_terminal for r in run_ids):
        pause.wait(0.2)


def wait_until(condition: Callable[[], bool]) -> None:
    pause = threading.Event()  # never set: a wait between looks
    for _ in range(600):
        if condition():
            return
        pause.wait(0.1)
    raise RuntimeError("the scene did not settle in a minute")


RELEASE_REPORT = threading.Event()


def application_queues(engine: Engine) -> tuple[int, threading.Event]:
    """Queues the worker loops serve: mail (one retry, then its dead-letter queue; a bounce
    fails every attempt), reports (one held running, reporting progress, until released) and
    a nightly cron. Returns the bounced job and the event set once the report runs."""
    queues = engine.queues
    queues.declare_queue(queue_spec("mail.dead", retention=30 * 86400))
    queues.declare_queue(
        queue_spec("mail", retry_limit=1, retry_delay=0.5, dead_letter="mail.dead")
    )
    queues.declare_queue(queue_spec("reports", policy="exclusive", expire=3600))
    queues.declare_queue(queue_spec("digest"))
    held = threading.Event()

    def deliver(job: Job, abort: Abort) -> None:
        if job.payload.get("to", "").endswith("@bounce.example"):
            raise ConnectionRefusedError(
                "smtp.example.net:587 refused the message: 550 5.1.1 mailbox unavailable"
            )

    def report(job: Job, abort: Abort) -> None:
        abort.report_progress(120, 400)
        held.set()
        while not RELEASE_REPORT.wait(0.1) and not abort.is_set:
            pass

    queues.register("mail", deliver)
    queues.register("reports", report)
    queues.register("digest", lambda job, abort: None)
    queues.schedule("digest", "0 6 * * *", payload={"kind": "daily"})
    for n in range(4):
        queues.send("mail", {"to": f"user{n}@example.com", "template": "welcome"})
    bounced = queues.send("mail", {"to": "old-customer@bounce.example", "template": "invoice"})
    queues.send("reports", {"quarter": "2026-Q4"}, key="2026-Q4")
    queues.send("digest", {"kind": "weekly"}, start_after=timedelta(hours=6))
    return bounced, held


def forms(page: Any, base: str, output: Path, workspace: int, refused: int, run: int) -> None:
    """The connection forms: a new one made of its provider's models (then sent without its
    tenant, which is said beside the field), and new credentials for the connection whose
    token the provider refused, reached from its failed run."""
    page.goto(f"{base}/connections/new?workspace={workspace}&provider=simulated")
    page.locator("#name").fill("tracker-eu")
    page.locator("#every").fill("1h")
    page.locator("#config-base_url").fill("https://tracker.example.eu")
    page.locator("#credentials-token").fill("never-shown")
    page.screenshot(path=str(output / "ui-connection-new.png"), full_page=True)
    print(f"wrote {output / 'ui-connection-new'}.png")
    page.get_by_role("button", name="Create connection").click()
    expect(page.locator("#config-tenant-error")).to_be_visible()
    page.screenshot(path=str(output / "ui-connection-new-errors.png"), full_page=True)
    print(f"wrote {output / 'ui-connection-new-errors'}.png")
    page.goto(f"{base}/connections/{refused}/credentials?run={run}")
    expect(page.locator("#why-disconnected")).to_be_visible()
    page.screenshot(path=str(output / "ui-connection-credentials.png"), full_page=True)
    print(f"wrote {output / 'ui-connection-credentials'}.png")


def main(output: Path) -> None:
    schema = f"ui_screens_{uuid.uuid4().hex[:8]}"
    settings = Settings(
        database_url=DATABASE_URL,
        schema_name=schema,
        batch_size=50,
        lanes="mail=2,reports=1,digest=1",
        secret_keys=SecretStr(Fernet.generate_key().decode()),  # throwaway credentials
    )
    simulation = Simulation()
    simulation.add_tenant("acme", size=240, seed=7)
    simulation.add_tenant("globex", size=90, seed=3)
    url, stop_provider = start_server(simulation)
    output.mkdir(parents=True, exist_ok=True)
    try:
        with Engine(settings) as engine:
            engine.migrate()
            acme = engine.create_workspace("acme-inc")
            globex = engine.create_workspace("globex")

            def simulated(ws: int, name: str, provider: str, tenant: str, token: str) -> int:
                return engine.create_connection(
                    ws,
                    name,
                    provider,
                    config={"base_url": url, "tenant": tenant, "page_size": 40},
                    credentials={"token": token},
                    schedule_every=timedelta(minutes=15),
                ).id

            tracker = simulated(acme.id, "tracker", "simulated", "acme", "sim-acme")
            crm = simulated(acme.id, "crm", "simulated_crm", "acme", "sim-acme")
            legacy = simulated(acme.id, "legacy-tracker", "simulated", "acme", "revoked-token")
            globex_tracker = simulated(globex.id, "tracker", "simulated", "globex", "sim-globex")
            gate = new_gate(rows=400, pause_at=260)
            backfill = engine.create_connection(
                globex.id, "backfill", "ui_gated", config={"gate": gate}
            ).id
            bounced, report_held = application_queues(engine)
            files = Path(tempfile.mkdtemp(prefix="ui-screens-"))
            handbook = files / "handbook.md"
            handbook.write_text("# How we work\n\n" + "We write things down.\n" * 200)
            vanished = files / "minutes.txt"
            vanished.write_text("Minutes of the last meeting.\n")
            ready = engine.ingest(handbook, acme.id).id
            lost = engine.ingest(vanished, acme.id).id
            vanished.unlink()  # gone before a worker reads it: the ingestion fails

            with worker_loop(engine), worker_loop(engine):
                first = [engine.sync(c).id for c in (tracker, crm, legacy, globex_tracker)]
                wait_until_terminal(engine, first)
                again = engine.sync(tracker).id  # a second sync: everything unchanged
                wait_until_terminal(engine, [again])
                engine.pause(globex_tracker)
                held = engine.sync(backfill).id
                assert GATES[gate].reached.wait(60)
                failed = next(r.id for r in engine.runs(connection_id=legacy))
                wait_until(lambda: engine.queues.get_job(bounced).status is JobStatus.DEAD)
                wait_until(lambda: report_held.is_set())
                wait_until(lambda: engine.ingestion(ready).is_terminal)
                wait_until(lambda: engine.ingestion(lost).is_terminal)

                options = UiOptions(
                    refresh_seconds=2.0, database=f"{describe(DATABASE_URL)}, schema {schema}"
                )
                with serving(engine, options) as base, chromium() as browser:
                    page = browser.page
                    shots = {
                        "ui-connections": ("/connections", f"#connection-{tracker}"),
                        "ui-runs": ("/runs", f"#run-{held}[data-status=running]"),
                        "ui-run": (f"/runs/{again}", "#run[data-status=succeeded]"),
                        "ui-run-failed": (f"/runs/{failed}", "#run[data-status=failed]"),
                        "ui-queues": ("/queues", '[id="queue-mail.dead"][data-dead="1"]'),
                        "ui-jobs": ("/jobs", f"#job-{bounced}"),
                        "ui-job": (f"/jobs/{bounced}", "#job[data-status=dead]"),
                        "ui-ingestions": ("/ingestions", f"#ingestion-{lost}[data-status=failed]"),
                        "ui-ingestion": (f"/ingestions/{ready}", "#ingestion[data-status=ready]"),
                        "ui-workers": ("/workers", "#workers tr[data-state=alive] .lanes a"),
                    }
                    for name, (path, ready) in shots.items():
                        page.goto(base + path)
                        expect(page.locator(ready).first).to_be_visible()
                        page.screenshot(path=str(output / f"{name}.png"), full_page=True)
                        print(f"wrote {output / name}.png")
                    forms(page, base, output, acme.id, legacy, failed)
                    page.set_viewport_size({"width": 390, "height": 844})  # a phone
                    phone = {
                        "ui-connections-phone": ("/connections", f"#connection-{tracker}"),
                        "ui-runs-phone": ("/runs", f"#run-{held}[data-status=running]"),
                        "ui-run-failed-phone": (f"/runs/{failed}", "#new-credentials"),
                    }
                    for name, (path, ready) in phone.items():
                        page.goto(base + path)
                        expect(page.locator(ready).first).to_be_visible()
                        page.screenshot(path=str(output / f"{name}.png"), full_page=True)
                        print(f"wrote {output / name}.png")
                    browser.leave()
                    print(httpx.get(f"{base}/metrics").text)
                GATES[gate].release.set()
                RELEASE_REPORT.set()
                wait_until_terminal(engine, [held])
    finally:
        stop_provider()
        with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    psycopg.sql.Identifier(schema)
                )
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images")
