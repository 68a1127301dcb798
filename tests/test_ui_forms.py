"""Connections from the operator page, over HTTP against the real test database: created from a
form made of the provider's config and credentials models, changed, given new credentials;
each mistake beside its field; credentials written once and never shown again, in no page and
no log line; and every refusal of an action a page that says what to do."""

from __future__ import annotations

import html
import logging
import re
import uuid
from typing import Any

import httpx
import pytest

from connectors import AuthError
from sync import Engine
from sync.testing import run_sync
from tests.test_sync_flow import items, new_dataset
from tests.ui_support import csrf_token, serving

HTML = {"accept": "text/html"}
SIMULATED = "http://127.0.0.1:9"  # never called: these tests create and change connections


def canary() -> str:
    return "cs-" + uuid.uuid4().hex


def field_error(page: str, field: str) -> str:
    """What the page says is wrong beside a field (its input's id)."""
    found = re.search(rf'<p class="field-error" id="{re.escape(field)}-error">([^<]*)</p>', page)
    assert found, f"no error beside {field}"
    return html.unescape(found.group(1))


def field_tag(page: str, field: str) -> str:
    """The input (or textarea) of a field, as the page writes it."""
    found = re.search(rf'<(input|textarea|select)[^>]*id="{re.escape(field)}"[^>]*>', page)
    assert found, f"no field {field}"
    return found.group(0)


@pytest.fixture
def client(engine: Engine) -> Any:
    with serving(engine) as url, httpx.Client(base_url=url) as http:
        token = csrf_token(http, "/connections")

        class Client:
            def get(self, path: str) -> httpx.Response:
                return http.get(path, headers=HTML)

            def post(self, path: str, **data: str) -> httpx.Response:
                return http.post(path, data={"csrf_token": token, **data}, headers=HTML)

        yield Client()


def test_a_connection_is_created_from_the_page(
    engine: Engine, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = canary()
    # No workspace yet: the page offers to make one, and says what is wrong with a name.
    first = client.get("/connections/new")
    assert 'id="workspace-form"' in first.text and 'id="choose-form"' not in first.text
    digits = client.post("/workspaces", workspace_name="42")
    assert digits.status_code == 400
    assert "digits alone" in field_error(digits.text, "workspace_name")
    made = client.post("/workspaces", workspace_name="acme-inc")
    assert made.status_code == 303 and made.headers["location"] == "/connections/new?workspace=1"

    # Then a provider, and a form made of its models: types, defaults, help; secrets as such.
    form = client.get("/connections/new?workspace=1&provider=simulated").text
    assert 'value="25"' in field_tag(form, "config-page_size")
    assert 'type="number"' in field_tag(form, "config-page_size")
    assert "Default: <code>25</code>" in form and "The tenant (account) to read." in form
    assert 'type="password"' in field_tag(form, "credentials-token")
    assert "The API token, sent as a bearer token." in form

    # Every mistake at once, each beside its field; what was typed comes back, but no secret.
    wrong = client.post(
        "/connections/new",
        workspace="1",
        provider="simulated",
        name="",
        every="soon",
        **{"config.tenant": "acme", "config.page_size": "9000", "credentials.token": secret},
    )
    assert wrong.status_code == 400
    assert "needs a name" in field_error(wrong.text, "name")
    assert "'soon' is not a duration" in field_error(wrong.text, "every")
    assert field_error(wrong.text, "config-base_url") == "Field required"
    assert "less than or equal to 500" in field_error(wrong.text, "config-page_size")
    assert 'value="acme"' in field_tag(wrong.text, "config-tenant")
    assert 'value="9000"' in field_tag(wrong.text, "config-page_size")
    assert secret not in wrong.text
    assert 'value=""' in field_tag(wrong.text, "credentials-token")
    missing = client.post(
        "/connections/new",
        workspace="1",
        provider="simulated",
        name="tracker",
        **{"config.base_url": SIMULATED, "config.tenant": "acme"},
    )
    assert field_error(missing.text, "credentials-token") == "Field required"
    assert engine.connections() == []

    created = client.post(
        "/connections/new",
        workspace="1",
        provider="simulated",
        name="tracker",
        every="15m",
        **{"config.base_url": SIMULATED, "config.tenant": "acme", "credentials.token": secret},
    )
    assert created.status_code == 303
    assert created.headers["location"] == "/connections?done=created&connection=1"
    c = engine.connection(1)
    assert (c.name, c.provider, c.has_credentials) == ("tracker", "simulated", True)
    assert c.config == {"base_url": SIMULATED, "tenant": "acme", "page_size": 25}
    assert c.schedule_every is not None and c.schedule_every.total_seconds() == 900
    listed = client.get(created.headers["location"]).text
    assert "Connection tracker created." in listed
    # An address naming a connection that is not there says nothing, and is no error.
    assert client.get("/connections?done=created&connection=99").status_code == 200
    # The same name again is refused beside the name.
    again = client.post(
        "/connections/new",
        workspace="1",
        provider="simulated",
        name="tracker",
        **{"config.base_url": SIMULATED, "config.tenant": "acme", "credentials.token": secret},
    )
    assert "already has a connection 'tracker'" in field_error(again.text, "name")
    for path in ("/connections", "/connections/1/edit", "/connections/1/credentials", "/runs"):
        assert secret not in client.get(path).text, path
    assert secret not in caplog.text


def test_a_connection_s_config_and_schedule_are_changed_from_the_page(
    engine: Engine, client: Any
) -> None:
    ws = engine.create_workspace("acme")
    config = {"base_url": SIMULATED, "tenant": "acme", "page_size": 40}
    engine.create_connection(
        ws.id, "tracker", "simulated", config=config, credentials={"token": "t"}
    )
    engine.create_connection(
        ws.id, "crm", "simulated_crm", config=config, credentials={"token": "t"}
    )
    form = client.get("/connections/1/edit").text
    assert 'value="40"' in field_tag(form, "config-page_size")
    assert 'value="tracker"' in field_tag(form, "name")
    assert "credentials" not in re.sub(r"<a [^>]*credentials[^>]*>", "", form).split("<form")[1]

    full = {"config.base_url": SIMULATED, "config.tenant": "acme"}
    taken = client.post("/connections/1/edit", name="crm", **full)
    assert taken.status_code == 400
    assert "already has a connection 'crm'" in field_error(taken.text, "name")
    wrong = client.post(
        "/connections/1/edit", name="tracker", every="0s", **{"config.page_size": "x"}
    )
    assert "not a positive duration" in field_error(wrong.text, "every")
    assert "valid integer" in field_error(wrong.text, "config-page_size")
    assert field_error(wrong.text, "config-base_url") == "Field required"

    # The page size left empty goes back to its default; the schedule is set.
    saved = client.post(
        "/connections/1/edit",
        name="tracker-eu",
        every="1h",
        **{"config.base_url": SIMULATED, "config.tenant": "acme-eu", "config.page_size": ""},
    )
    assert saved.headers["location"] == "/connections?done=updated&connection=1"
    c = engine.connection(1)
    assert (c.name, c.config["tenant"], c.config["page_size"]) == ("tracker-eu", "acme-eu", 25)
    assert c.schedule_every is not None and c.schedule_every.total_seconds() == 3600
    client.post(
        "/connections/1/edit",
        name="tracker-eu",
        every="",
        **{"config.base_url": SIMULATED, "config.tenant": "acme-eu"},
    )
    assert engine.connection(1).schedule_every is None


def test_a_refused_credential_s_run_leads_to_the_form_and_back_to_a_retry(
    engine: Engine, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key, data = new_dataset(items=items(1))
    data.failures["items"] = data.failures["notes"] = (0, AuthError("401: the token was revoked"))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    run = run_sync(engine, conn.id)
    assert run.status == "failed" and engine.connection(conn.id).status == "disconnected"

    # The run's page offers new credentials, not a retry that cannot work.
    shown = client.get(f"/runs/{run.id}").text
    assert 'id="new-credentials"' in shown and ">Retry<" not in shown
    assert f'href="/connections/{conn.id}/credentials?run={run.id}"' in shown
    refused = client.post(f"/runs/{run.id}/retry")
    assert refused.status_code == 409
    assert "disconnected" in refused.text and "give it new ones first" in refused.text
    assert f'href="/connections/{conn.id}/credentials?run={run.id}"' in refused.text
    listed = client.get("/connections").text
    assert f'href="/connections/{conn.id}/credentials"' in listed

    # The form: a provider without a credentials model takes a JSON object, checked as such.
    form = client.get(f"/connections/{conn.id}/credentials?run={run.id}").text
    assert "The provider refused the stored credentials" in form
    assert f'name="run" value="{run.id}"' in form
    secret = canary()
    bad = client.post(f"/connections/{conn.id}/credentials", run=str(run.id), **{
        "credentials.credentials": f'["{secret}"]'
    })  # fmt: skip
    assert bad.status_code == 400 and secret not in bad.text
    assert "must be a JSON object" in field_error(bad.text, "credentials-credentials")
    assert "<textarea" in field_tag(bad.text, "credentials-credentials")
    assert field_tag(bad.text, "credentials-credentials").endswith(">")
    assert f">{secret}" not in bad.text

    del data.failures["items"], data.failures["notes"]
    replaced = client.post(
        f"/connections/{conn.id}/credentials",
        run=str(run.id),
        **{"credentials.credentials": f'{{"token": "{secret}"}}'},
    )
    assert replaced.headers["location"] == f"/runs/{run.id}?credentials=replaced"
    assert engine.connection(conn.id).status == "active"
    back = client.get(replaced.headers["location"]).text
    assert "New credentials stored: mem is active; retry the run." in back
    assert ">Retry<" in back
    assert client.post(f"/runs/{run.id}/retry").headers["location"] == f"/runs/{run.id}"
    assert secret not in back and secret not in caplog.text


def test_every_refusal_of_an_action_is_a_page_that_says_what_to_do(
    engine: Engine, client: Any
) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    finished = run_sync(engine, conn.id)
    engine.pause(conn.id)
    refusals = {
        f"/connections/{conn.id}/sync": ("paused; resume it first", "/connections#connection-"),
        f"/runs/{finished.id}/cancel": ("has already ended", f"/runs/{finished.id}"),
        f"/runs/{finished.id}/retry": ("only a failed or cancelled run", f"/runs/{finished.id}"),
        "/connections/99/pause": ("no connection 99", "/connections"),
        "/jobs/99/cancel": ("no job 99", "/jobs"),
        "/queues/nowhere/redrive": ("no queue named 'nowhere'", "/queues"),
    }
    for path, (said, link) in refusals.items():
        page = client.post(path)
        assert 400 <= page.status_code < 500, path
        text = html.unescape(page.text)
        assert said in text, (path, text)
        steps = text[text.index('id="next-steps"') : text.index("</ul>")]
        assert f'href="{link}' in steps, (path, steps)
    # A disconnected connection cannot be resumed; the page says to give it credentials.
    engine.resume(conn.id)
    with engine.pool.connection() as db:
        db.execute("UPDATE connections SET status = 'disconnected' WHERE id = %s", (conn.id,))
    refused = client.post(f"/connections/{conn.id}/sync")
    assert "give it new ones first" in refused.text
    assert f'href="/connections/{conn.id}/credentials"' in refused.text


def test_resuming_says_that_a_scheduled_connection_syncs_now(engine: Engine, client: Any) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    every = engine.create_connection(
        ws.id, "scheduled", "memory", config={"dataset": key}, schedule_every=900
    )
    asked = engine.create_connection(ws.id, "by-hand", "memory", config={"dataset": key})
    for c in (every, asked):
        engine.pause(c.id)
    resumed = client.post(f"/connections/{every.id}/resume")
    assert resumed.headers["location"] == f"/connections?done=resumed&connection={every.id}"
    assert (
        "Its schedule makes it due now: a worker starts a sync"
        in client.get(resumed.headers["location"]).text
    )
    resumed = client.post(f"/connections/{asked.id}/resume")
    assert (
        "It has no schedule: it syncs when you press Sync now."
        in client.get(resumed.headers["location"]).text
    )
