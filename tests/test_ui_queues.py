"""The operator page's application queues, jobs, ingestions and worker lanes over HTTP, served
by uvicorn on the real test database: what each page shows, and its actions (redrive, cancel
and retry a job, cancel an ingestion) through the Python API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from sync import Engine
from sync.queues import Job, JobStatus, queue_spec
from sync.ui.app import UiOptions
from tests.ui_support import csrf_token, serving

HTML = {"accept": "text/html"}
# An error longer than a list shows: the job's page shows it whole.
LONG_ERROR = "the archive service refused the export: " + "it explained at length " * 12


def fail(job: Job, abort: Any) -> None:
    raise RuntimeError(f"{LONG_ERROR}(attempt {job.attempts})")


@pytest.fixture
def dead_job(engine: Engine) -> int:
    """Queue ``mail`` (one retry) dead-letters to ``mail.dead``; job 1 failed twice and is
    dead there. Queue ``mail.dead`` has no handler, so nothing runs it."""
    queues = engine.queues
    queues.declare_queue(queue_spec("mail.dead"))
    queues.declare_queue(queue_spec("mail", retry_limit=1, retry_delay=60, dead_letter="mail.dead"))
    queues.register("mail", fail)
    job_id = queues.send("mail", {"to": "ops@example.com"})
    queues.run_due()
    # The retry waits a minute, so the first run_due() ran one attempt only; retry_job makes
    # it due now. (A delay shorter than run_due() itself let that one call run both attempts.)
    queues.retry_job(job_id)
    queues.run_due()
    job = queues.get_job(job_id)
    assert (job.status, job.queue, job.attempts) == (JobStatus.DEAD, "mail.dead", 2)
    return job_id


def test_the_queues_page_shows_each_queues_figures_and_lanes(engine: Engine, dead_job: int) -> None:
    engine.queues.declare_queue(queue_spec("reports"))
    for n in range(3):
        engine.queues.send("reports", {"n": n})
    with serving(engine) as url, httpx.Client(base_url=url) as client:
        page = client.get("/queues", headers=HTML)
        assert page.status_code == 200
        text = page.text
        for name in ("mail", "mail.dead", "reports"):
            assert f'id="queue-{name}"' in text
        reports = row_of(text, "queue-reports")
        assert '<td class="queued">3</td>' in reports
        assert '<td class="lanes">0</td>' in reports
        assert "Redrive" not in reports
        dead = row_of(text, "queue-mail.dead")
        assert 'data-dead="1"' in dead and "Redrive" in dead
        assert client.get("/queues/live").status_code == 200


def test_a_redrive_from_the_page_sends_the_dead_letters_back(engine: Engine, dead_job: int) -> None:
    with serving(engine) as url, httpx.Client(base_url=url) as client:
        token = csrf_token(client, "/queues")
        # The queue the job was sent to holds none of its dead letters: the page says where
        # they are, with the button that redrives them.
        nothing = client.post("/queues/mail/redrive", data={"csrf_token": token})
        said = client.get(nothing.headers["location"], headers=HTML).text
        assert "Its dead jobs move to its dead-letter queue mail.dead" in said
        notice = said[said.index('id="redrive-result"') :]
        assert 'action="/queues/mail.dead/redrive"' in notice[: notice.index("</p>")]
        done = client.post("/queues/mail.dead/redrive", data={"csrf_token": token})
        assert done.status_code == 303
        assert done.headers["location"] == "/queues?queue=mail.dead&redriven=1&skipped=0"
        shown = client.get(done.headers["location"], headers=HTML)
        assert "Redrove 1 dead job of mail.dead" in shown.text
        missing = client.post("/queues/nope/redrive", data={"csrf_token": token})
        assert missing.status_code == 404 and "no queue named 'nope'" in missing.text
    job = engine.queues.get_job(dead_job)
    assert (job.status, job.queue, job.attempts) == (JobStatus.QUEUED, "mail", 0)


def test_a_jobs_page_shows_every_attempt_and_its_whole_error(engine: Engine, dead_job: int) -> None:
    with serving(engine) as url, httpx.Client(base_url=url) as client:
        listing = client.get("/jobs?status=dead", headers=HTML)
        assert f'id="job-{dead_job}"' in listing.text
        assert client.get("/jobs?queue=mail.dead", headers=HTML).text.count('id="job-') == 1
        assert client.get("/jobs?status=queued", headers=HTML).text.count('id="job-') == 0
        page = client.get(f"/jobs/{dead_job}", headers=HTML).text
        for attempt in (1, 2):
            assert f'id="attempt-{attempt}"' in page
            assert f"{LONG_ERROR.strip()} (attempt {attempt})" in page  # not cut
        assert "ops@example.com" in page  # the payload
        assert "Retry" in page and "Cancel" not in page
        assert "hx-get" not in section_of(page, 'id="job"')  # a dead job does not reload
        bad = {
            "/jobs?status=exploded": (400, "status must be one of queued"),
            "/jobs?queue=nope": (404, "no queue named 'nope'"),
            "/jobs/999": (404, "no job 999"),
        }
        for path, (status, text) in bad.items():
            response = client.get(path)
            assert (response.status_code, response.text.count("\n")) == (status, 1), path
            assert text in response.text


def test_cancel_and_retry_a_job_from_its_page(engine: Engine, dead_job: int) -> None:
    with serving(engine) as url, httpx.Client(base_url=url) as client:
        token = csrf_token(client, f"/jobs/{dead_job}")

        def post(path: str) -> httpx.Response:
            return client.post(path, data={"csrf_token": token})

        retried = post(f"/jobs/{dead_job}/retry")
        assert retried.status_code == 303 and retried.headers["location"] == f"/jobs/{dead_job}"
        assert engine.queues.get_job(dead_job).status is JobStatus.QUEUED
        assert "Cancel" in client.get(f"/jobs/{dead_job}", headers=HTML).text
        assert post(f"/jobs/{dead_job}/cancel").status_code == 303
        assert engine.queues.get_job(dead_job).status is JobStatus.CANCELLED
        again = post(f"/jobs/{dead_job}/cancel")
        assert again.status_code == 409 and "only queued, retrying or active" in again.text
        assert post("/jobs/999/retry").status_code == 404


def test_read_only_offers_no_redrive_and_refuses_one(engine: Engine, dead_job: int) -> None:
    with serving(engine, UiOptions(read_only=True)) as url, httpx.Client(base_url=url) as client:
        token = csrf_token(client, "/queues")
        for path in ("/queues", "/jobs", f"/jobs/{dead_job}", "/ingestions", "/workers"):
            page = client.get(path, headers=HTML)
            assert page.status_code == 200 and 'method="post"' not in page.text, path
        refused = client.post("/queues/mail.dead/redrive", data={"csrf_token": token})
        assert refused.status_code == 403
    assert engine.queues.get_job(dead_job).status is JobStatus.DEAD


def test_the_ingestions_page_lists_and_cancels_an_ingestion(engine: Engine, tmp_path: Path) -> None:
    ws = engine.create_workspace("acme")
    file = tmp_path / "handbook.txt"
    file.write_text("How we work.\n")
    queued = engine.ingest(file, ws.id)
    with serving(engine) as url, httpx.Client(base_url=url) as client:
        listing = client.get("/ingestions", headers=HTML).text
        assert f'id="ingestion-{queued.id}"' in listing and "handbook.txt" in listing
        assert client.get("/ingestions?status=ready", headers=HTML).text.count("ingestion-") == 0
        page = client.get(f"/ingestions/{queued.id}", headers=HTML).text
        assert str(file) in page and "Cancel" in page
        token = csrf_token(client, f"/ingestions/{queued.id}")
        done = client.post(f"/ingestions/{queued.id}/cancel", data={"csrf_token": token})
        assert done.status_code == 303
        assert client.get("/ingestions/999").status_code == 404
        assert client.get("/ingestions?status=exploded").status_code == 400
    assert engine.ingestion(queued.id).status == "cancelled"


def test_the_workers_page_shows_each_workers_lanes_and_providers(
    engine: Engine, dead_job: int
) -> None:
    engine.settings.lanes = "mail=3"
    worker = engine.worker(listen=False)
    try:
        with serving(engine) as url, httpx.Client(base_url=url) as client:
            page = client.get("/workers", headers=HTML).text
            row = row_of(page, f'data-worker="{worker.id}"', by="")
            assert "mail</a>&nbsp;&times;3" in row
            assert "ui_gated" in row or "memory" in row  # what syncs it can run
            queues = client.get("/queues", headers=HTML).text
            assert '<td class="lanes">3</td>' in row_of(queues, "queue-mail")
    finally:
        worker.close()


def row_of(html: str, marker: str, by: str = "id") -> str:
    """The table row whose opening tag carries ``id="marker"`` (or ``marker`` itself)."""
    needle = f'{by}="{marker}"' if by else marker
    start = html.index(needle)
    return html[html.rindex("<tr", 0, start) : html.index("</tr>", start)]


def section_of(html: str, marker: str) -> str:
    start = html.index(marker)
    return html[html.rindex("<section", 0, start) : html.index(">", start)]
