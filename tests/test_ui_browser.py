"""The operator page in a real browser: Debian's Chromium, headless, driven by Playwright, against
the page served by uvicorn on the real test database while a real worker loop runs the syncs.
Every wait is on a condition of the page; screenshots go to test-artifacts/ui/."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, expect

from connectors.simulated.server import Simulation, start_server
from sync import Engine
from sync.queues import Job, JobStatus, queue_spec
from sync.vocabulary import JobError
from tests.conftest import make_settings
from tests.ingestion_support import chunk_count, write_text
from tests.ui_support import GATES, Browser, chromium, new_gate, serving, worker_loop

# Every test here starts a process of its own (see tests/conftest.py).
pytestmark = pytest.mark.slow

# Every page the browser visits in a test is checked for console errors at its end.


@pytest.fixture
def fast_engine(schema: str) -> Iterator[Engine]:
    """Small batches (progress shows early), quick control reads (a cancel lands fast)."""
    settings = make_settings(schema, batch_size=25, control_interval=0.05, poll_interval=0.2)
    with Engine(settings, pool_size=10) as engine:
        engine.migrate()
        yield engine


@pytest.fixture
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b
        assert b.errors == [], b.errors


def gated_connection(engine: Engine, gate: str, name: str = "tracker") -> int:
    ws = engine.workspaces()[0] if engine.workspaces() else engine.create_workspace("acme")
    return engine.create_connection(
        ws.id, name, "ui_gated", config={"gate": gate}, credentials={"token": "never-shown-1"}
    ).id


def test_the_runs_page_shows_a_run_progress_and_then_succeed(
    fast_engine: Engine, browser: Browser
) -> None:
    gate = new_gate(rows=300, pause_at=150)
    connection = gated_connection(fast_engine, gate)
    page = browser.page
    with serving(fast_engine) as url, worker_loop(fast_engine):
        page.goto(f"{url}/connections")
        row = page.locator(f"#connection-{connection}")
        expect(row).to_contain_text("active")
        row.get_by_role("button", name="Sync now").click()
        # Sync now lands on the run's page.
        expect(page).to_have_url(re.compile(r"/runs/\d+$"))
        run_id = int(page.url.rsplit("/", 1)[1])

        page.goto(f"{url}/runs")
        run_row = page.locator(f"#run-{run_id}")
        assert GATES[gate].reached.wait(60)
        expect(run_row).to_have_attribute("data-status", "running")
        # Progress: at least the batches before the pause are written and shown.
        expect(run_row.locator(".processed")).to_have_text(re.compile(r"^(1[0-9]{2}|[5-9][0-9])$"))
        expect(run_row).to_contain_text("tables 0/1")
        browser.screenshot("runs-running")

        GATES[gate].release.set()
        expect(run_row).to_have_attribute("data-status", "succeeded")
        expect(run_row.locator(".processed")).to_have_text("300")
        expect(run_row).to_contain_text("tables 1/1")
        browser.screenshot("runs-succeeded")

        # The run's own page stops reloading once the run is over, and shows the results.
        page.goto(f"{url}/runs/{run_id}")
        expect(page.locator("#run")).to_have_attribute("data-status", "succeeded")
        expect(page.locator("#run")).not_to_have_attribute("hx-get", re.compile("."))
        expect(page.locator("#table-items")).to_contain_text("300")
        expect(page.locator("#attempt-1")).to_contain_text("succeeded")
        browser.screenshot("run-succeeded")
        browser.leave()
    assert fast_engine.run(run_id).status == "succeeded"


def test_a_cancel_from_the_page_stops_a_running_sync(fast_engine: Engine, browser: Browser) -> None:
    gate = new_gate(rows=300, pause_at=100)  # never released: only the cancel ends the read
    connection = gated_connection(fast_engine, gate)
    run_id = fast_engine.sync(connection).id
    page = browser.page
    with serving(fast_engine) as url, worker_loop(fast_engine):
        page.goto(f"{url}/runs/{run_id}")
        section = page.locator("#run")
        expect(section).to_have_attribute("data-status", "running")
        assert GATES[gate].reached.wait(60)
        page.get_by_role("button", name="Cancel").click()
        expect(section).to_have_attribute("data-status", "cancelled")
        expect(page.locator("#run-error")).to_contain_text("cancel")
        expect(page.locator("#table-items")).to_contain_text("cancelled")
        expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
        browser.screenshot("run-cancelled")
        browser.leave()
    final = fast_engine.run(run_id)
    assert final.status == "cancelled" and final.cancel_requested_at is not None
    assert not GATES[gate].release.is_set()


def test_a_failed_runs_page_shows_its_whole_error(fast_engine: Engine, browser: Browser) -> None:
    lines = [f"line {n}: the provider explained at length why this cannot work" for n in range(40)]
    message = "the provider refused the export\n" + "\n".join(lines)
    gate = new_gate(rows=10, pause_at=10, fail_with=message)
    GATES[gate].release.set()
    connection = gated_connection(fast_engine, gate)
    run_id = fast_engine.sync(connection).id
    page = browser.page
    with serving(fast_engine) as url, worker_loop(fast_engine):
        page.goto(f"{url}/runs/{run_id}")
        expect(page.locator("#run")).to_have_attribute("data-status", "failed")
        run = fast_engine.run(run_id)
        errors = [run.error, JobError.parse(run.results["items"]["error"])]
        errors += [a.error for a in fast_engine.attempts(run_id)]
        assert all(errors)
        for error in errors:
            assert error is not None
            shown = page.locator(".error-message", has_text=error.message.splitlines()[0])
            expect(shown.first).to_be_visible()
        # The table's error and every attempt's error are there in full, not cut.
        expect(page.locator("#table-items .error-message")).to_have_text(message)
        expect(page.locator("#attempt-1 .error-message")).to_have_text(message)
        expect(page.get_by_role("button", name="Retry")).to_be_visible()
        browser.screenshot("run-failed")

        # The runs list shows its first line, the connections page its last outcome.
        page.goto(f"{url}/runs?status=failed")
        expect(page.locator(f"#run-{run_id}")).to_contain_text("the provider refused the export")
        page.goto(f"{url}/connections")
        expect(page.locator(f"#connection-{connection} .last-run")).to_contain_text("failed")
        browser.leave()


def test_every_page_renders_without_console_errors(fast_engine: Engine, browser: Browser) -> None:
    gate = new_gate(rows=5, pause_at=5)
    GATES[gate].release.set()
    connection = gated_connection(fast_engine, gate)
    page = browser.page
    with serving(fast_engine) as url, worker_loop(fast_engine) as worker:
        run_id = fast_engine.sync(connection).id
        for path, ready in (
            ("/connections", f"#connection-{connection}"),
            ("/runs", f"#run-{run_id}"),
            ("/workers", "#workers tr[data-state=alive]"),
            ("/queues", "#queues"),
            ("/jobs", "#jobs"),
            ("/ingestions", "#ingestions"),
        ):
            page.goto(url + path)
            expect(page.locator(ready)).to_be_visible()
            # The live part reloads, and its requests are checked for errors too.
            with page.expect_response(re.compile(r"/live(\?|$)")) as reloaded:
                pass
            assert reloaded.value.status == 200
        page.goto(f"{url}/runs/{run_id}")
        expect(page.locator("#run")).to_have_attribute("data-status", "succeeded")
        page.goto(f"{url}/runs/999")
        browser.expect_error_page()
        expect(page.locator("#problem")).to_contain_text("no run 999")
        page.goto(f"{url}/workers")
        expect(page.locator("#workers")).to_contain_text(worker.id)
        browser.screenshot("workers")
        page.goto(f"{url}/connections")
        # Pause and resume from the page.
        page.locator(f"#connection-{connection}").get_by_role("button", name="Pause").click()
        expect(page.locator(f"#connection-{connection}")).to_contain_text("paused")
        page.locator(f"#connection-{connection}").get_by_role("button", name="Resume").click()
        expect(page.locator(f"#connection-{connection}")).to_contain_text("active")
        browser.screenshot("connections")
        assert "never-shown-1" not in page.content()
        browser.leave()


def fact(facts: Locator, name: str) -> Locator:
    """The value of the <dt>name</dt><dd>value</dd> pair of a list of facts."""
    term = facts.locator("dt", has_text=re.compile(rf"^{re.escape(name)}$"))
    return term.locator("xpath=following-sibling::dd[1]")


def test_an_ingestions_page_follows_it_to_its_results(
    fast_engine: Engine, browser: Browser, tmp_path: Path
) -> None:
    path = write_text(tmp_path / "site-notes.txt", paragraphs=12)
    total = chunk_count(path)
    assert total > 1
    ws = fast_engine.create_workspace("acme")
    ingestion = fast_engine.ingest(path, ws.id)
    page = browser.page
    with serving(fast_engine) as url:
        page.goto(f"{url}/ingestions/{ingestion.id}")
        section = page.locator("#ingestion")
        expect(section).to_have_attribute("data-status", "queued")
        expect(page.locator("#processed")).to_have_text("0")
        expect(page.locator("#results")).to_have_count(0)
        expect(section).to_contain_text(str(path))
        browser.screenshot("ingestion-queued")

        # One worker poll indexes the whole file; the open page follows it live.
        worker = fast_engine.worker(listen=False)
        try:
            assert worker.poll()
        finally:
            worker.close()
        done = fast_engine.ingestion(ingestion.id)
        assert (done.status, done.processed_units, done.total_units) == ("ready", total, total)
        expect(section).to_have_attribute("data-status", "ready")
        expect(page.locator("#processed")).to_have_text(str(total))
        expect(page.locator("#total")).to_have_text(str(total))
        expect(page.locator("#progress progress")).to_have_attribute("value", str(total))
        expect(page.locator("#progress progress")).to_have_attribute("max", str(total))
        assert done.results
        for name, value in done.results.items():
            expect(fact(page.locator("#results"), name)).to_have_text(str(value))
        expect(fact(section, "attempts")).to_have_text(f"1 of {done.max_attempts}")
        # It is over: the page stops reloading.
        expect(section).not_to_have_attribute("hx-get", re.compile("."))
        expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
        browser.screenshot("ingestion-ready")

        page.goto(f"{url}/ingestions")
        row = page.locator(f"#ingestion-{ingestion.id}")
        expect(row).to_have_attribute("data-status", "ready")
        expect(row).to_contain_text(f"{total} / {total}")
        browser.leave()


def test_a_redrive_from_the_page_requeues_a_dead_letter(
    fast_engine: Engine, browser: Browser
) -> None:
    queues = fast_engine.queues
    queues.declare_queue(queue_spec("mail.dead"))
    queues.declare_queue(queue_spec("mail", retry_limit=0, dead_letter="mail.dead"))
    refusing = threading.Event()
    refusing.set()

    def deliver(job: Job, abort: Any) -> None:
        if refusing.is_set():
            raise RuntimeError("the mail server refused the message: mailbox full")

    queues.register("mail", deliver)
    job_id = queues.send("mail", {"to": "ops@example.com"})
    queues.run_due()
    assert queues.get_job(job_id).status is JobStatus.DEAD
    page = browser.page
    with serving(fast_engine) as url:
        page.goto(f"{url}/queues")
        dead_letters = page.locator('[id="queue-mail.dead"]')
        expect(dead_letters).to_have_attribute("data-dead", "1")
        expect(dead_letters.locator(".dead")).to_have_text("1")
        browser.screenshot("queues-dead-letter")
        page.goto(f"{url}/jobs/{job_id}")
        expect(page.locator("#job")).to_have_attribute("data-status", "dead")
        expect(page.locator("#attempt-1 .error-message")).to_have_text(
            "RuntimeError: the mail server refused the message: mailbox full"
        )
        browser.screenshot("job-dead")

        page.goto(f"{url}/queues")
        dead_letters.get_by_role("button", name="Redrive").click()
        expect(page.locator("#redrive-result")).to_contain_text("Redrove 1 dead job of mail.dead")
        expect(dead_letters).to_have_attribute("data-dead", "0")
        expect(page.locator('[id="queue-mail"] .queued')).to_have_text("1")
        job = queues.get_job(job_id)
        assert (job.status, job.queue, job.attempts) == (JobStatus.QUEUED, "mail", 0)

        # The job's page follows it live: run now, it completes.
        page.goto(f"{url}/jobs/{job_id}")
        expect(page.locator("#job")).to_have_attribute("data-status", "queued")
        refusing.clear()
        assert queues.run_due() == 1
        expect(page.locator("#job")).to_have_attribute("data-status", "completed")
        browser.screenshot("job-redriven")
        browser.leave()


def test_a_click_that_spans_a_reload_of_the_live_part_still_lands(
    fast_engine: Engine, browser: Browser
) -> None:
    """The live parts reload every refresh; a button pressed before a reload and released after
    it must still act (a press and a release on two copies of the button are no click)."""
    gate = new_gate(rows=5, pause_at=5)
    GATES[gate].release.set()
    connection = gated_connection(fast_engine, gate)
    page = browser.page
    with serving(fast_engine) as url:
        page.goto(f"{url}/connections")
        button = page.locator(f"#connection-{connection}").get_by_role("button", name="Pause")
        button.hover()  # the pointer on the button, as a person's before pressing it
        page.mouse.down()
        with page.expect_response(re.compile(r"/connections/live")) as reloaded:
            pass
        assert reloaded.value.status == 200
        # The reload's answer has arrived; give htmx its turn to apply it.
        page.evaluate("() => new Promise(done => requestAnimationFrame(() => done(null)))")
        page.mouse.up()
        expect(page.locator(f"#connection-{connection}")).to_contain_text("paused")
        browser.leave()
    assert fast_engine.connection(connection).status == "paused"


# -- connections from the page, at a desk and on a phone -----------------------------------------

WIDTHS = {"desktop": 1280, "phone": 390}


@pytest.fixture(params=list(WIDTHS))
def width(request: pytest.FixtureRequest, browser: Browser) -> str:
    """The test runs at a desk (1280 px) and on a phone (390 px): the page's viewport."""
    browser.page.set_viewport_size({"width": WIDTHS[request.param], "height": 844})
    return str(request.param)


@pytest.fixture
def simulated_provider() -> Iterator[str]:
    simulation = Simulation()
    simulation.add_tenant("acme", size=40, seed=3, token="sim-acme")
    url, stop = start_server(simulation)
    yield url
    stop()


MEASURE = """selector => {
    const shown = [...document.querySelectorAll(selector)].filter(e => e.offsetParent !== null);
    if (shown.length === 0) return null;
    const box = shown[0].getBoundingClientRect();
    return [box.left, box.right, innerWidth];
}"""


def in_view(browser: Browser, selector: str) -> None:
    """The first element of ``selector`` that is shown lies whole inside the viewport's width,
    without scrolling sideways. Found and measured in one go inside the page: the live parts
    are swapped every fraction of a second, and an element found in one step and measured in
    the next may be gone."""
    measured = browser.page.evaluate(MEASURE, selector)
    assert measured is not None, f"nothing shown for {selector}"
    left, right, width = measured
    assert right > left and left >= 0 and right <= width, (selector, left, right, width)


def fits(browser: Browser) -> None:
    """The page is no wider than the viewport: only tables scroll, inside their box."""
    size = browser.page.viewport_size
    assert size is not None
    wide = browser.page.evaluate("document.documentElement.scrollWidth")
    assert wide <= size["width"], (wide, size)


def test_a_connection_is_created_and_changed_from_the_page(
    fast_engine: Engine, browser: Browser, width: str, simulated_provider: str
) -> None:
    page = browser.page
    with serving(fast_engine) as url, worker_loop(fast_engine):
        page.goto(f"{url}/connections")
        page.get_by_role("link", name="New connection").click()
        # No workspace yet: the first one is made here.
        page.get_by_label("workspace name").fill("acme-inc")
        page.get_by_role("button", name="Create workspace").click()
        page.get_by_label("provider").select_option("simulated")
        page.get_by_role("button", name="Next").click()
        fits(browser)
        form = page.locator("#connection-form")
        expect(form.locator("#config-page_size")).to_have_value("25")
        form.locator("#name").fill("tracker")
        form.locator("#every").fill("15m")
        form.locator("#config-base_url").fill(simulated_provider)
        form.locator("#credentials-token").fill("sim-acme")
        browser.screenshot(f"connection-new-{width}")
        with browser.sent_back():
            form.get_by_role("button", name="Create connection").click()
        # The tenant was left out: said beside it; the token must be typed again.
        expect(page.locator("#config-tenant-error")).to_have_text("Field required")
        expect(page.locator("#credentials-token")).to_have_value("")
        expect(page.locator("#config-base_url")).to_have_value(simulated_provider)
        fits(browser)
        browser.screenshot(f"connection-new-errors-{width}")
        page.locator("#config-tenant").fill("acme")
        page.locator("#credentials-token").fill("sim-acme")
        page.get_by_role("button", name="Create connection").click()
        expect(page.locator("#notice")).to_have_text("Connection tracker created.")
        (connection,) = fast_engine.connections()
        row = page.locator(f"#connection-{connection.id}")
        in_view(browser, f"#connection-{connection.id} .status")
        row.get_by_role("button", name="Sync now").click()
        expect(page.locator("#run")).to_have_attribute("data-status", "succeeded")

        page.goto(f"{url}/connections")
        row.get_by_role("link", name="Edit").click()
        expect(page.locator("#config-tenant")).to_have_value("acme")
        page.locator("#config-page_size").fill("10")
        page.locator("#every").fill("1h")
        browser.screenshot(f"connection-edit-{width}")
        page.get_by_role("button", name="Save").click()
        expect(page.locator("#notice")).to_have_text("Connection tracker updated.")
        assert "sim-acme" not in page.content()
        browser.leave()
    changed = fast_engine.connection(connection.id)
    assert changed.config["page_size"] == 10 and changed.config["tenant"] == "acme"
    assert changed.schedule_every is not None and changed.schedule_every.total_seconds() == 3600


def test_a_refused_credential_s_run_leads_to_new_credentials_and_a_retry(
    fast_engine: Engine, browser: Browser, width: str, simulated_provider: str
) -> None:
    ws = fast_engine.create_workspace("acme-inc")
    config = {"base_url": simulated_provider, "tenant": "acme"}
    connection = fast_engine.create_connection(
        ws.id, "tracker", "simulated", config=config, credentials={"token": "revoked-token"}
    )
    page = browser.page
    with serving(fast_engine) as url, worker_loop(fast_engine):
        run_id = fast_engine.sync(connection.id).id
        page.goto(f"{url}/runs/{run_id}")
        expect(page.locator("#run")).to_have_attribute("data-status", "failed")
        # No Retry that cannot work: the way to new credentials instead.
        expect(page.get_by_role("button", name="Retry")).to_have_count(0)
        link = page.locator("#new-credentials")
        in_view(browser, "#new-credentials")
        fits(browser)
        browser.screenshot(f"run-refused-credentials-{width}")
        link.click()
        expect(page.locator("#why-disconnected")).to_contain_text("then retry run")
        with browser.sent_back():
            page.get_by_role("button", name="Replace credentials").click()
        expect(page.locator("#credentials-token-error")).to_have_text("Field required")
        page.locator("#credentials-token").fill("sim-acme")
        browser.screenshot(f"connection-credentials-{width}")
        page.get_by_role("button", name="Replace credentials").click()
        expect(page.locator("#notice")).to_contain_text("tracker is active; retry the run")
        page.get_by_role("button", name="Retry").click()
        expect(page.locator("#run")).to_have_attribute("data-status", "succeeded")
        assert "sim-acme" not in page.content()
        browser.leave()
    assert fast_engine.connection(connection.id).status == "active"


def test_every_page_fits_a_phone_with_each_status_and_action_in_view(
    fast_engine: Engine, browser: Browser
) -> None:
    browser.page.set_viewport_size({"width": 390, "height": 844})
    gate = new_gate(rows=5, pause_at=5)
    GATES[gate].release.set()
    ids = [
        gated_connection(fast_engine, gate, name=f"a-rather-long-connection-name-{n}")
        for n in range(3)
    ]
    page = browser.page
    with serving(fast_engine) as url, worker_loop(fast_engine):
        run_id = fast_engine.sync(ids[0]).id
        page.goto(f"{url}/runs/{run_id}")
        expect(page.locator("#run")).to_have_attribute("data-status", "succeeded")
        for path in (
            "/connections",
            "/runs",
            f"/runs/{run_id}",
            "/queues",
            "/jobs",
            "/ingestions",
            "/workers",
            "/connections/new",
            f"/connections/{ids[0]}/edit",
        ):
            page.goto(url + path)
            fits(browser)
        page.goto(f"{url}/connections")
        for connection in ids:
            row = f"#connection-{connection}"
            in_view(browser, f"{row} .status")
            for action in ("sync", "pause", "edit"):
                in_view(browser, f'{row} [action$="/{action}"] button, {row} a[href$="/{action}"]')
        browser.screenshot("connections-phone")
        page.goto(f"{url}/runs")
        in_view(browser, f"#run-{run_id} .status")
        # Whatever the width of its rows, the table scrolls inside its box, not the page.
        fits(browser)
        box = page.locator("#runs .table-box")
        assert box.evaluate("b => getComputedStyle(b).overflowX") in ("auto", "scroll")
        browser.screenshot("runs-phone")
        browser.leave()
