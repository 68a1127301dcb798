"""Sending a job from the operator page's queues page, over HTTP on the real test database: the
form (JSON payload, key, priority, delay) behind the CSRF check, its mistakes beside their
fields with nothing sent, and the priority, limits and due time the pages then show."""

from __future__ import annotations

from datetime import timedelta

import httpx

from sync import Engine
from sync.queues import QueuePolicy, queue_spec
from sync.ui.app import UiOptions
from tests.test_ui_queues import HTML, row_of
from tests.ui_support import csrf_token, serving


def test_a_job_sent_from_the_queues_page_has_its_payload_key_priority_and_delay(
    engine: Engine,
) -> None:
    engine.queues.declare_queue(
        queue_spec("partner.api", policy=QueuePolicy.EXCLUSIVE, global_concurrency=3, priority=4)
    )
    with serving(engine) as url, httpx.Client(base_url=url) as client:
        page = client.get("/queues", headers=HTML).text
        row = row_of(page, "queue-partner.api")
        assert '<td class="priority">4</td>' in row and "at most 3 at once" in row
        token = csrf_token(client, "/queues")
        form = {
            "csrf_token": token,
            "queue": "partner.api",
            "payload": '{"account": 7}',
            "key": "account-7",
            "priority": "1",
            "delay": "5m",
        }
        sent = client.post("/queues/send", data=form)
        assert sent.status_code == 303 and sent.headers["location"].startswith("/jobs/")
        job_id = int(sent.headers["location"].rsplit("/", 1)[1])
        job = engine.queues.get_job(job_id)
        assert (job.payload, job.key, job.priority) == ({"account": 7}, "account-7", 1)
        assert job.run_after - job.created_at >= timedelta(minutes=5)
        shown = client.get(f"/jobs/{job_id}", headers=HTML).text
        assert "<dt>priority</dt><dd>1</dd>" in shown and "(in " in shown  # due later
        listed = row_of(client.get("/jobs", headers=HTML).text, f"job-{job_id}")
        assert '<td class="priority">1</td>' in listed

        again = client.post("/queues/send", data={**form, "payload": "{}", "priority": ""})
        assert again.headers["location"] == f"/jobs/{job_id}"  # the key is pending: that job
        assert len(engine.queues.list_jobs()) == 1


def test_the_send_form_shows_each_mistake_beside_its_field_and_sends_nothing(
    engine: Engine,
) -> None:
    engine.queues.declare_queue(queue_spec("reports"))
    with serving(engine) as url, httpx.Client(base_url=url) as client:
        token = csrf_token(client, "/queues")
        bad = {
            "csrf_token": token,
            "queue": "reports",
            "payload": "{not json",
            "priority": "12",
            "delay": "soon",
        }
        page = client.post("/queues/send", data=bad)
        assert page.status_code == 422
        for field in ("payload", "priority", "delay"):
            assert f'id="{field}-error"' in page.text, field
        assert "{not json" in page.text  # what was typed is kept
        keyed = client.post(
            "/queues/send", data={"csrf_token": token, "queue": "reports", "key": "k"}
        )
        assert keyed.status_code == 422 and "exclusive" in keyed.text
        missing = client.post("/queues/send", data={"csrf_token": token, "queue": "nowhere"})
        assert missing.status_code == 404 and "declare it first" in missing.text
        forged = client.post("/queues/send", data={"queue": "reports", "payload": "{}"})
        assert forged.status_code == 403
    assert engine.queues.list_jobs() == []


def test_a_read_only_page_offers_no_send_and_refuses_one(engine: Engine) -> None:
    engine.queues.declare_queue(queue_spec("reports"))
    with serving(engine, UiOptions(read_only=True)) as url, httpx.Client(base_url=url) as client:
        token = csrf_token(client, "/queues")
        assert 'id="send-form"' not in client.get("/queues", headers=HTML).text
        refused = client.post("/queues/send", data={"csrf_token": token, "queue": "reports"})
        assert refused.status_code == 403
    assert engine.queues.list_jobs() == []
