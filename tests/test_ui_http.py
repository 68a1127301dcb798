"""The operator page over HTTP, served by uvicorn on the real test database: who may use it,
CSRF, read-only mode, what a dead database looks like, the runtime role, and that no credential
reaches a page, a metric or a log line."""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.routing import Route

from connectors import PermanentError
from connectors.errors import RateLimited
from sync import Engine
from sync.queues import queue_spec
from sync.store.db import describe
from sync.testing import run_sync
from sync.ui.app import UiOptions, create_app
from tests.conftest import DATABASE_URL, DIRECT_URL, make_settings
from tests.ingestion_support import write_text
from tests.test_sync_flow import items, new_dataset
from tests.ui_support import GATES, csrf_token, new_gate, serving
from tests.waiting import poll_until

HTML = {"accept": "text/html"}
TOKEN = "ui-token-" + uuid.uuid4().hex


# Every action route, with the ids the tests use (connection 1, run 1).
ACTION_ROUTES = {
    "/connections/{connection_id:int}/sync": "/connections/1/sync",
    "/connections/{connection_id:int}/pause": "/connections/1/pause",
    "/connections/{connection_id:int}/resume": "/connections/1/resume",
    "/connections/new": "/connections/new",
    "/workspaces": "/workspaces",
    "/connections/{connection_id:int}/edit": "/connections/1/edit",
    "/connections/{connection_id:int}/credentials": "/connections/1/credentials",
    "/runs/{run_id:int}/cancel": "/runs/1/cancel",
    "/runs/{run_id:int}/retry": "/runs/1/retry",
    "/queues/{queue}/redrive": "/queues/mail/redrive",
    "/queues/send": "/queues/send",
    "/jobs/{job_id:int}/cancel": "/jobs/1/cancel",
    "/jobs/{job_id:int}/retry": "/jobs/1/retry",
    "/ingestions/{ingestion_id:int}/cancel": "/ingestions/1/cancel",
}
ACTIONS = list(ACTION_ROUTES.values())


def test_every_post_route_is_an_action_under_test(engine: Engine) -> None:
    """The CSRF and read-only tests walk every POST route the app has (besides signing in and
    out), so a new action cannot slip past them."""
    posts = {
        route.path
        for route in create_app(engine).routes
        if isinstance(route, Route) and "POST" in (route.methods or ())
    }
    assert posts == {*ACTION_ROUTES, "/login", "/logout"}


@pytest.fixture
def queued_run(engine: Engine) -> tuple[int, int]:
    """A connection (id 1) with a queued run (id 1)."""
    key, _ = new_dataset(items=items(1, 2, 3))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    run = engine.sync(conn.id)
    assert (conn.id, run.id) == (1, 1)
    return conn.id, run.id


def state(engine: Engine) -> tuple[str, str, int]:
    return (engine.connection(1).status, engine.run(1).status, len(engine.runs()))


# -- access ------------------------------------------------------------------------------------


def test_with_a_token_a_request_without_it_gets_401(engine: Engine, queued_run: Any) -> None:
    database = "postgresql://ops@db.internal:5432/billing, schema sync"
    options = UiOptions(token=TOKEN, database=database)
    with serving(engine, options) as url, httpx.Client(base_url=url) as client:
        for path in (
            "/connections",
            "/runs",
            "/runs/1",
            "/runs/1/live",
            "/queues",
            "/jobs",
            "/ingestions",
            "/workers",
            "/metrics",
        ):
            assert client.get(path).status_code == 401, path
            wrong = client.get(path, headers={"authorization": "Bearer not-the-token"})
            assert wrong.status_code == 401, path
            right = client.get(path, headers={"authorization": f"Bearer {TOKEN}"})
            assert right.status_code == 200, path
            assert TOKEN not in right.text
        # A POST without the token is refused before anything else is looked at.
        assert client.post("/runs/1/cancel").status_code == 401
        assert engine.run(1).status == "queued"

        # A browser gets the sign-in form with its 401; signing in sets a session cookie that
        # is not the token.
        page = client.get("/runs?status=queued", headers=HTML)
        assert page.status_code == 401 and 'name="token"' in page.text
        # Who has not signed in is not told which database is behind the page.
        assert "db.internal" not in page.text and "billing" not in page.text
        assert "db.internal" not in client.get("/login", headers=HTML).text
        token = csrf_token(client, "/login")
        bad = client.post("/login", data={"csrf_token": token, "token": "nope", "next": "/runs"})
        assert bad.status_code == 401 and "not the token" in bad.text
        assert "connector_sync_session" not in client.cookies
        good = client.post(
            "/login", data={"csrf_token": token, "token": TOKEN, "next": "/runs?status=queued"}
        )
        assert good.status_code == 303 and good.headers["location"] == "/runs?status=queued"
        assert TOKEN not in good.headers.get("set-cookie", "")
        signed_in = client.get("/runs/1", headers=HTML)
        assert signed_in.status_code == 200 and f"database: {database}" in signed_in.text

        # Signing out ends it; a redirect target off this server is never followed.
        token = csrf_token(client, "/runs")
        assert client.post("/logout", data={"csrf_token": token}).status_code == 303
        assert client.get("/runs").status_code == 401
        token = csrf_token(client, "/login")
        away = client.post(
            "/login", data={"csrf_token": token, "token": TOKEN, "next": "//evil.example/x"}
        )
        assert away.headers["location"] == "/"


def test_behind_a_proxy_the_named_header_says_who_is_signed_in(
    engine: Engine, queued_run: Any
) -> None:
    options = UiOptions(auth_header="X-Forwarded-User")
    with serving(engine, options) as url, httpx.Client(base_url=url) as client:
        assert client.get("/runs", headers=HTML).status_code == 401
        assert client.get("/runs", headers={"x-forwarded-user": ""}).status_code == 401
        page = client.get("/runs", headers={**HTML, "x-forwarded-user": "alice@example.com"})
        assert page.status_code == 200 and "alice@example.com" in page.text


# -- CSRF and read-only ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ACTIONS)
def test_a_post_without_the_csrf_token_is_refused(
    engine: Engine, queued_run: Any, path: str
) -> None:
    before = state(engine)
    with serving(engine) as url, httpx.Client(base_url=url) as client:
        token = csrf_token(client, "/connections")  # the client now has the cookie
        assert client.post(path).status_code == 403
        assert client.post(path, data={"csrf_token": ""}).status_code == 403
        assert client.post(path, data={"csrf_token": "0" * 64}).status_code == 403
        assert client.post(path, headers={"x-csrf-token": "0" * 64}).status_code == 403
        # Another browser's token does not fit this browser's cookie.
        with httpx.Client(base_url=url) as other:
            theirs = csrf_token(other, "/connections")
        assert theirs != token
        assert client.post(path, data={"csrf_token": theirs}).status_code == 403
        # The right token without the cookie (a forged form from another site) is refused.
        with httpx.Client(base_url=url) as forger:
            refused = forger.post(path, data={"csrf_token": token}, headers=HTML)
        assert refused.status_code == 403 and "reload" in refused.text
        assert state(engine) == before


def test_with_the_csrf_token_each_action_does_what_it_says(engine: Engine, queued_run: Any) -> None:
    with serving(engine) as url, httpx.Client(base_url=url) as client:
        token = csrf_token(client, "/connections")

        def post(path: str, **kw: Any) -> httpx.Response:
            return client.post(path, data={"csrf_token": token}, **kw)

        cancelled = post("/runs/1/cancel")
        assert cancelled.status_code == 303 and cancelled.headers["location"] == "/runs/1"
        assert engine.run(1).status == "cancelled"
        # A refusal is one clear sentence, on a page or as text.
        again = post("/runs/1/cancel", headers=HTML)
        assert again.status_code == 409
        assert (
            "run 1 has already ended (cancelled); only a queued or running run can be cancelled"
            in again.text
        )
        # A cancelled run goes back to the queue, as a cancelled job does.
        retried = post("/runs/1/retry")
        assert retried.status_code == 303 and retried.headers["location"] == "/runs/1"
        assert engine.run(1).status == "queued"
        assert post("/runs/1/retry").text.strip() == (
            "409: run 1 is queued; only a failed or cancelled run can be retried"
        )
        engine.cancel_run(1)
        assert post("/runs/99/cancel").status_code == 404

        synced = post("/connections/1/sync")
        assert synced.status_code == 303 and synced.headers["location"] == "/runs/2"
        assert engine.run(2).status == "queued"
        assert post("/connections/1/pause").headers["location"] == "/connections"
        assert engine.connection(1).status == "paused"
        assert post("/connections/1/resume").status_code == 303
        assert engine.connection(1).status == "active"

        # A failed run goes back to the queue from its page.
        engine.cancel_run(2)
        failing, data = new_dataset(items=items(1))
        data.failures["items"] = (0, PermanentError("gone for good"))
        data.failures["notes"] = (0, PermanentError("gone for good"))
        ws = engine.workspace("acme")
        broken = engine.create_connection(ws.id, "broken", "memory", config={"dataset": failing})
        run = run_sync(engine, broken.id)
        assert run.status == "failed"
        retried = post(f"/runs/{run.id}/retry")
        assert retried.status_code == 303 and engine.run(run.id).status == "queued"


def test_read_only_refuses_every_action_and_offers_none(engine: Engine, queued_run: Any) -> None:
    engine.pause(1)
    engine.resume(1)
    before = state(engine)
    with serving(engine, UiOptions(read_only=True)) as url, httpx.Client(base_url=url) as client:
        token = csrf_token(client, "/connections")
        for path in ACTIONS:
            refused = client.post(path, data={"csrf_token": token}, headers=HTML)
            assert refused.status_code == 403, path
            assert "read-only" in refused.text
        assert state(engine) == before
        for path in ("/connections", "/runs", "/runs/1", "/workers"):
            page = client.get(path, headers=HTML)
            assert page.status_code == 200
            assert 'method="post"' not in page.text, path
            assert "read-only" in page.text
        for path in ("/connections/new", "/connections/1/edit", "/connections/1/credentials"):
            assert client.get(path, headers=HTML).status_code == 403, path  # no form either


# -- bad input and a database in trouble -----------------------------------------------------------


def test_bad_input_gets_a_clear_page_and_the_server_goes_on(
    engine: Engine, queued_run: Any
) -> None:
    with serving(engine) as url, httpx.Client(base_url=url) as client:
        cases = {
            "/runs?status=exploded": (400, "status must be one of waiting, queued"),
            "/runs?connection=abc": (400, "connection must be a number"),
            "/runs/12345": (404, "no run 12345"),
            "/connections?workspace=nope": (404, "no workspace named 'nope'"),
            "/no/such/page": (404, "Not Found"),
        }
        for path, (status, text) in cases.items():
            response = client.get(path)
            assert response.status_code == status, path
            assert text in response.text, response.text
            assert response.text.count("\n") == 1  # one line for scripts
        assert client.get("/runs").status_code == 200


def test_a_database_that_does_not_answer_gives_a_clear_page_and_metrics_say_so(
    schema: str, admin: Any
) -> None:
    with Engine(make_settings(schema, lock_timeout=0.2)) as engine:
        engine.migrate()
        engine.create_workspace("acme")
        with serving(engine) as url, httpx.Client(base_url=url) as client:
            with psycopg.connect(DIRECT_URL, options=f"-c search_path={schema}") as blocker:
                blocker.execute("LOCK TABLE connection_runs IN ACCESS EXCLUSIVE MODE")
                page = client.get("/runs", headers=HTML)
                assert page.status_code == 503
                assert "the database did not answer" in page.text
                assert "check that Postgres is running" in page.text
                scrape = client.get("/metrics")
                assert scrape.status_code == 200
                assert "connector_sync_database_up 0.0" in scrape.text
                assert "connector_sync_runs{" not in scrape.text
            # The lock is gone: the same server serves again.
            assert client.get("/runs").status_code == 200
            assert "connector_sync_database_up 1.0" in client.get("/metrics").text


# -- the runtime role ----------------------------------------------------------------------------


@pytest.fixture
def runtime_role(engine: Engine) -> Iterator[str]:
    role = f"ui_runtime_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    engine.grant(role)
    yield role
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_the_page_works_under_the_runtime_role(
    engine: Engine, queued_run: Any, runtime_role: str, schema: str
) -> None:
    url = psycopg.conninfo.make_conninfo(DATABASE_URL, user=runtime_role)
    with Engine(make_settings(schema, database_url=url)) as limited:
        with pytest.raises(Exception, match="may not change the schema"):
            limited.migrate()  # no DDL rights, as intended
        with serving(limited) as base, httpx.Client(base_url=base) as client:
            for path in (
                "/connections",
                "/runs",
                "/runs/1",
                "/queues",
                "/jobs",
                "/ingestions",
                "/workers",
            ):
                assert client.get(path).status_code == 200, path
            # /metrics answers 200 even when it cannot read the database: its figures say
            # whether this role could.
            scrape = client.get("/metrics")
            assert scrape.status_code == 200
            samples = {
                (sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(scrape.text)
                for sample in family.samples
            }
            assert samples[("connector_sync_database_up", ())] == 1.0
            queued = (("kind", "sync"), ("provider", "memory"), ("status", "queued"))
            assert samples[("connector_sync_runs", queued)] == 1.0
            assert samples[("connector_sync_queue_depth", (("queue", "runs"),))] == 1.0
            token = csrf_token(client, "/runs/1")
            assert client.post("/runs/1/cancel", data={"csrf_token": token}).status_code == 303
    assert engine.run(1).status == "cancelled"


# -- nothing from another origin -----------------------------------------------------------------

# Attributes through which a page makes the browser load or send something.
URL_ATTRIBUTES = {"src", "href", "action", "formaction", "poster", "data", "hx-get", "hx-post"}


class References(HTMLParser):
    """Every URL a page names: in its tags' attributes and in its inline styles."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._tag = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._tag = tag
        for name, value in attrs:
            if value is None:
                continue
            if name in URL_ATTRIBUTES:
                self.urls.append(value)
            elif name == "srcset":
                self.urls.extend(part.split()[0] for part in value.split(",") if part.strip())
            elif name == "style" and "url(" in value:
                self.urls.extend(CSS_URL.findall(value))

    def handle_data(self, data: str) -> None:
        if self._tag == "style":
            self.urls.extend(CSS_URL.findall(data))


CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)""")


def content_security_policy(header: str) -> dict[str, list[str]]:
    directives = (part.split() for part in header.split(";") if part.strip())
    return {name: sources for name, *sources in directives}


def test_pages_load_nothing_from_another_origin(
    engine: Engine, queued_run: Any, tmp_path: Path
) -> None:
    engine.queues.declare_queue(queue_spec("mail"))
    job_id = engine.queues.send("mail", {"to": "ops@example.com"})
    ingestion = engine.ingest(write_text(tmp_path / "notes.txt", paragraphs=2), 1)
    options = UiOptions(token=TOKEN)  # so that the sign-in page is served too
    with serving(engine, options) as url, httpx.Client(base_url=url) as client:
        origin = httpx.URL(url)
        signed_in = {**HTML, "authorization": f"Bearer {TOKEN}"}
        pages = [
            "/connections",
            "/connections/live",
            "/runs",
            "/runs/live",
            "/runs/1",
            "/runs/1/live",
            "/queues",
            "/jobs",
            f"/jobs/{job_id}",
            "/ingestions",
            f"/ingestions/{ingestion.id}",
            "/workers",
            "/login",
            "/runs/999",  # an error page
        ]
        static = ["/static/ui.css", "/static/ui.js", "/static/htmx.min.js"]
        for path in pages + static:
            response = client.get(path, headers=HTML if path == "/login" else signed_in)
            expected = {"/login": 401, "/runs/999": 404}.get(path, 200)  # the sign-in form: 401
            assert response.status_code == expected, path
            policy = content_security_policy(response.headers["content-security-policy"])
            assert policy["default-src"] == ["'self'"], path
            # No directive lets anything in from elsewhere: only this server (or the page's own
            # data: favicon).
            for directive, sources in policy.items():
                assert set(sources) <= {"'self'", "'none'", "data:"}, (path, directive)
            if path in static:
                continue
            found = References()
            found.feed(response.text)
            assert any("/static/" in u for u in found.urls) or path.endswith("/live"), path
            for reference in found.urls:
                target = origin.join(reference)
                assert target.scheme in ("http", "data"), (path, reference)
                if target.scheme == "http":
                    assert (target.host, target.port) == (origin.host, origin.port), (
                        path,
                        reference,
                    )
        # The stylesheet loads no font or image from elsewhere either.
        css = client.get("/static/ui.css", headers=signed_in).text
        for reference in CSS_URL.findall(css):
            assert origin.join(reference).host == origin.host, reference


# -- no credential anywhere ----------------------------------------------------------------------


def test_a_canary_credential_appears_in_no_page_metric_or_log(
    schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    credential = "canary-credential-" + uuid.uuid4().hex
    password = "canary-password-" + uuid.uuid4().hex
    token = "canary-ui-token-" + uuid.uuid4().hex
    # The test server trusts local connections, so any password gets in: the canary is real.
    url = psycopg.conninfo.make_conninfo(DATABASE_URL, password=password)
    caplog.set_level(logging.DEBUG)
    with Engine(make_settings(schema, database_url=url)) as engine:
        engine.migrate()
        key, _ = new_dataset(items=items(1, 2))
        ws = engine.create_workspace("acme")
        good = engine.create_connection(
            ws.id, "mem", "memory", config={"dataset": key}, credentials={"token": credential}
        )
        run_sync(engine, good.id)
        bad_key, bad = new_dataset(items=items(1))
        bad.failures["items"] = (0, ValueError(f"the provider said: bad token {credential}"))
        broken = engine.create_connection(
            ws.id,
            "broken",
            "memory",
            config={"dataset": bad_key},
            credentials={"token": credential},
        )
        worker = engine.worker(listen=False)
        failed = run_sync(engine, broken.id, worker=worker)
        engine.sync(good.id)
        # A job whose handler's error carries the credential, dead in its dead-letter queue.
        engine.queues.declare_queue(queue_spec("mail.dead"))
        engine.queues.declare_queue(queue_spec("mail", retry_limit=0, dead_letter="mail.dead"))

        def leak(job: Any, abort: Any) -> None:
            raise RuntimeError(f"the server said: bad token {credential}")

        engine.queues.register("mail", leak)
        job_id = engine.queues.send("mail", {"to": "ops@example.com"})
        engine.queues.run_due()
        options = UiOptions(token=token, database=describe(url))
        seen: list[str] = []
        with serving(engine, options) as base, httpx.Client(base_url=base) as client:
            auth = {"authorization": f"Bearer {token}"}
            paths = [
                "/connections",
                "/connections/live",
                "/runs",
                "/runs/live",
                "/workers",
                "/workers/live",
                "/queues",
                "/queues/live",
                "/jobs",
                "/jobs/live",
                f"/jobs/{job_id}",
                f"/jobs/{job_id}/live",
                "/ingestions",
                "/ingestions/live",
                "/metrics",
                "/runs/999",
                "/nope",
                *[f"/runs/{r.id}" for r in engine.runs()],
                *[f"/runs/{r.id}/live" for r in engine.runs()],
            ]
            for path in paths:
                response = client.get(path, headers={**HTML, **auth})
                seen.append(response.text + str(response.headers))
            seen.append(client.get("/runs", headers=HTML).text)  # the sign-in page
            login = csrf_token(client, "/login")
            signed_in = client.post("/login", data={"csrf_token": login, "token": token})
            seen.append(signed_in.text + str(signed_in.headers))
            cancel = csrf_token(client, "/runs")
            done = client.post(f"/runs/{failed.id}/retry", data={"csrf_token": cancel})
            seen.append(done.text + str(done.headers))
            redrive = client.post("/queues/mail.dead/redrive", data={"csrf_token": cancel})
            seen.append(redrive.text + str(redrive.headers))
        # The worker's own registry.
        seen.append(generate_latest(worker.metrics.registry).decode())
        worker.close()
    seen.extend(record.getMessage() for record in caplog.records)
    seen.extend(str(record.args) for record in caplog.records)
    assert any("GET /runs" in line for line in seen)  # the access log was captured
    everything = "\n".join(seen)
    assert "the server said: bad token" in everything  # the job's error was on its page
    assert "connector_sync_worker_records_total" in everything
    for canary in (credential, password, token):
        assert canary not in everything


# -- what a run is doing ---------------------------------------------------------------------------


def test_a_runs_page_says_where_it_is_and_what_it_waits_for(schema: str) -> None:
    with Engine(make_settings(schema, batch_size=25)) as engine:
        engine.migrate()
        ws = engine.create_workspace("acme")
        limited_key, limited_data = new_dataset(items=items(1))
        limited_data.failures["items"] = (0, RateLimited("slow down", retry_after=600))
        limited = engine.create_connection(
            ws.id, "limited", "memory", config={"dataset": limited_key}
        )
        waiting = engine.sync(limited.id)
        worker = engine.worker(listen=False)
        worker.poll()  # the oldest run: it meets the rate limit and waits
        gate = new_gate(rows=100, pause_at=50)
        gated = engine.create_connection(ws.id, "gated", "ui_gated", config={"gate": gate})
        running = engine.sync(gated.id)
        polling = threading.Thread(target=worker.poll)
        with serving(engine) as url, httpx.Client(base_url=url) as client:
            page = client.get(f"/runs/{waiting.id}", headers=HTML).text
            assert "waiting for the memory rate limit until" in page
            assert "waited 1 time so far" in page
            listing = client.get("/runs", headers=HTML).text
            assert re.search(r"waiting for the memory rate limit, in (9|10)m", listing)
            polling.start()
            assert GATES[gate].reached.wait(60)
            # Rows 25-49 may still be on their way: the record writer's helper thread commits
            # a batch, and the progress with it, while the connector reads on to the gate.
            poll_until(lambda: engine.run(running.id).processed_units == 50)
            page = client.get(f"/runs/{running.id}/live", headers=HTML).text
            assert "now: table 1 of 1 (items)" in page and "50 records" in page
            GATES[gate].release.set()
            polling.join(60)
        worker.close()
        assert engine.run(running.id).status == "succeeded"


def test_a_cancel_is_shown_as_the_reason_a_run_ended_not_as_an_error(schema: str) -> None:
    # The control read that would see a cancel is minutes away: a late one finds the work done.
    with Engine(make_settings(schema, control_interval=300), pool_size=6) as engine:
        engine.migrate()
        key, data = new_dataset(items=items(1, 2))
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        cancelled = engine.cancel_run(engine.sync(conn.id).id)
        late = engine.sync(conn.id)
        data.before_row["items"] = lambda index: index == 1 and engine.cancel_run(late.id)
        assert engine.worker(listen=False).poll()
        assert engine.run(late.id).status == "succeeded"
        with serving(engine) as url, httpx.Client(base_url=url, headers=HTML) as client:
            page = client.get(f"/runs/{cancelled.id}").text
            shown = page[page.index('id="run-error"') :]
            assert shown.startswith('id="run-error">\n<div class="reason">'), shown[:80]
            assert "<h2>Why it ended</h2>" in page and "<h2>Error</h2>" not in page
            listed = client.get("/runs").text
            row = listed[listed.index(f'id="run-{cancelled.id}"') :]
            assert '<td class="headline quiet">' in row[: row.index("</tr>")]
            page = client.get(f"/runs/{late.id}").text
            said = re.search(r'<p class="note" id="cancel-late">([^<]*)</p>', page)
            assert said is not None and said.group(1).endswith(
                "after the work was done: the run ended succeeded."
            )
