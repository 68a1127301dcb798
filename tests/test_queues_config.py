"""Queue declarations (in code and in a TOML file), lanes from configuration, payloads, and the
manual clock: what is accepted, and the one-line error for each mistake."""

from __future__ import annotations

import math
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from sync.errors import InvalidInput
from sync.queues import ManualClock, QueuePolicy, parse_lanes, queue_spec, read_queue_file
from sync.queues.apps import load_setup
from sync.queues.lanes import served_queues
from sync.queues.payloads import json_payload
from sync.queues.registry import HandlerRegistry
from tests.conftest import DIRECT_URL


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert message and "\n" not in message
    return message


# Declarations in code


def test_a_declaration_has_the_documented_defaults() -> None:
    spec = queue_spec("knowledge.ingest")
    assert (spec.policy, spec.retry_limit, spec.retry_delay, spec.retry_ceiling) == (
        QueuePolicy.STANDARD,
        2,
        5.0,
        300.0,
    )
    assert (spec.expire, spec.dead_letter, spec.retention) == (900.0, None, 7 * 86400.0)
    assert spec.attempts_allowed == 3


@pytest.mark.parametrize(
    ("name", "options", "says"),
    [
        ("Knowledge Ingest", {}, "name: must be lower-case letters"),
        ("", {}, "name: must be lower-case letters"),
        ("q", {"policy": "fifo"}, "policy: Input should be 'standard' or 'exclusive'"),
        ("q", {"retry_limit": -1}, "retry_limit: Input should be greater than or equal to 0"),
        ("q", {"retry_delay": 0}, "retry_delay: Input should be greater than 0"),
        ("q", {"retry_delay": 60, "retry_ceiling": 30}, "retry_ceiling (30 s) must be at least"),
        ("q", {"dead_letter": "q"}, "dead_letter must name another queue"),
        ("q", {"expire": "soon"}, "expire: Input should be a valid number"),
        ("q", {"retry_limt": 3}, "retry_limt: Extra inputs are not permitted"),
        ("q", {"dead_letter": "Q!"}, "dead_letter: must be lower-case letters"),
        ("q", {"retention": math.inf}, "retention: Input should be less than or equal to"),
    ],
)
def test_a_bad_declaration_is_one_line_naming_the_queue_and_field(
    name: str, options: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidInput) as exc:
        queue_spec(name, **options)
    message = one_line(exc)
    assert message.startswith(f"queue {name!r}: ") and says in message


# Declarations in a file


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "queues.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_queue_file_puts_each_dead_letter_queue_before_the_queues_naming_it(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        """
[[queue]]
name = "knowledge.ingest"
retry_limit = 5
dead_letter = "knowledge.failed"

[[queue]]
name = "knowledge.failed"
dead_letter = "knowledge.dead"

[[queue]]
name = "knowledge.sync"
policy = "exclusive"

[[queue]]
name = "knowledge.dead"
retention = 2592000
""",
    )
    specs = read_queue_file(path)
    assert [s.name for s in specs] == [
        "knowledge.dead",
        "knowledge.failed",
        "knowledge.ingest",
        "knowledge.sync",
    ]
    by_name = {s.name: s for s in specs}
    assert by_name["knowledge.ingest"].retry_limit == 5
    assert by_name["knowledge.sync"].policy is QueuePolicy.EXCLUSIVE


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[[queue]]\nname = 'a'\nretry_limit = -2\n", "queue 'a': retry_limit: Input should"),
        ("[[queue]]\npolicy = 'exclusive'\n", "queue 1 has no name"),
        ("[[queue]]\nname = 'a'\n[[queue]]\nname = 'a'\n", "queue 'a' is declared twice"),
        ("[queues]\nname = 'a'\n", "unknown key 'queues'; declare queues as [[queue]]"),
        ("queue = 'a'\n", "'queue' must be a list of tables"),
        ("[[queue]\nname = 'a'\n", "not valid TOML"),
        (
            "[[queue]]\nname = 'a'\ndead_letter = 'b'\n[[queue]]\nname = 'b'\ndead_letter = 'a'\n",
            "dead-letter queues form a loop (a -> b -> a)",
        ),
    ],
)
def test_a_bad_queue_file_is_one_line_naming_the_file(tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidInput) as exc:
        read_queue_file(path)
    message = one_line(exc)
    assert says in message
    assert message.startswith(str(path)) or "loop" in message


def test_a_missing_queue_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as exc:
        read_queue_file(tmp_path / "absent.toml")
    assert "cannot read it" in one_line(exc)


# Lanes


def test_lanes_are_read_per_queue() -> None:
    assert parse_lanes("knowledge.ingest=4,knowledge.sync=1") == {
        "knowledge.ingest": 4,
        "knowledge.sync": 1,
    }
    assert parse_lanes(" knowledge.ingest = 4 , ") == {"knowledge.ingest": 4}
    assert parse_lanes("") == parse_lanes(None) == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("knowledge.ingest", "'knowledge.ingest' is not QUEUE=N"),
        ("=4", "'=4' is not QUEUE=N"),
        ("Knowledge=4", "'Knowledge' is not a queue name"),
        ("q=four", "the lanes of 'q' must be a whole number from 0 to 64, not 'four'"),
        ("q=-1", "not '-1'"),
        ("q=65", "not '65'"),
        ("q=²", "not '²'"),
        ("q=1,q=2", "'q' is given twice"),
    ],
)
def test_bad_lanes_are_one_line_naming_the_setting(text: str, says: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        parse_lanes(text)
    message = one_line(exc)
    assert message.startswith("CONNECTOR_SYNC_LANES: ") and says in message


def test_a_process_serves_the_queues_with_lanes_and_a_handler() -> None:
    assert served_queues({}, {"a", "b"}) == {}  # no lanes, no queue served
    assert served_queues({"a": 2, "b": 0}, {"a", "b"}) == {"a": 2}
    with pytest.raises(InvalidInput) as exc:
        served_queues({"a": 2, "c": 1}, {"a"})
    assert "gives lanes to c, with no handler registered in this process" in one_line(exc)


def test_a_handler_must_be_callable() -> None:
    with pytest.raises(InvalidInput) as exc:
        HandlerRegistry().register("q", "not a function")  # type: ignore[arg-type]
    assert "must be callable" in one_line(exc)


# Payloads

texts = st.text(max_size=8).filter(
    lambda t: "\x00" not in t and not any(0xD800 <= ord(c) < 0xE000 for c in t)
)


def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    containers,
    max_leaves=20,
)


def same_json(a: Any, b: Any) -> bool:
    """Equal values of equal types all the way down (key order aside)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.fixture(scope="module")
def postgres() -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(DIRECT_URL, autocommit=True) as conn:
        yield conn


@settings(max_examples=200)
@given(value=json_values)
def test_a_payload_is_kept_as_postgres_jsonb_keeps_it(
    postgres: psycopg.Connection[Any], value: Any
) -> None:
    row = postgres.execute("SELECT %s::jsonb", (Jsonb(value),)).fetchone()
    assert row is not None
    assert same_json(json_payload("q", value), row[0])


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ({"x": math.inf}, "is not JSON (Out of range float values"),
        ({"x": object()}, "is not JSON (Object of type object"),
        ({"x": {None: 1}}, "has a key that is not a string (None)"),
        (["\ud800"], "holds text that is not valid Unicode"),
        ({"k\x00": 1}, "holds a NUL character"),
    ],
)
def test_a_payload_json_would_change_or_postgres_refuses_is_refused(
    payload: Any, says: str
) -> None:
    with pytest.raises(InvalidInput) as exc:
        json_payload("knowledge.ingest", payload)
    message = one_line(exc)
    assert message.startswith("the payload of a job for queue 'knowledge.ingest' ")
    assert says in message


# The manual clock


def test_a_manual_clock_moves_only_forward() -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    assert clock.advance(90) == datetime(2030, 1, 1, 0, 1, 30, tzinfo=UTC)
    assert clock.advance_to(datetime(2030, 1, 1, tzinfo=UTC)) == clock.now()
    assert clock.now() == datetime(2030, 1, 1, 0, 1, 30, tzinfo=UTC)
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        ManualClock(datetime(2030, 1, 1))


# Where `worker --app` finds an application


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A directory holding an application `jobs_<random>.py` whose setup imports a module beside
    it, outside sys.path, as a project checked out and `pip install .`-ed elsewhere is."""
    name = f"jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}_helpers.py").write_text("QUEUE = 'reports'\n")
    (tmp_path / f"{name}.py").write_text(
        f"from {name}_helpers import QUEUE\n\ndef setup(queues):\n    queues.append(QUEUE)\n"
    )
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    return tmp_path, name


def test_an_app_is_found_in_the_current_directory_as_uvicorn_and_celery_find_it(
    app_dir: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, name = app_dir
    monkeypatch.chdir(directory)
    declared: list[str] = []
    load_setup(f"{name}:setup")(declared)  # type: ignore[arg-type]
    assert declared == ["reports"]


def test_an_app_is_found_by_its_file_with_its_own_imports(app_dir: tuple[Path, str]) -> None:
    directory, name = app_dir
    declared: list[str] = []
    load_setup(f"{directory / name}.py:setup")(declared)  # type: ignore[arg-type]
    assert declared == ["reports"]


def test_an_app_that_is_not_there_is_one_line_that_says_where_to_look(
    app_dir: tuple[Path, str],
) -> None:
    directory, name = app_dir
    with pytest.raises(InvalidInput) as missing_module:
        load_setup(f"{name}:setup")  # not in the current directory, not on sys.path
    assert "run the worker from the directory that holds it" in one_line(missing_module)
    with pytest.raises(InvalidInput) as missing_file:
        load_setup(f"{directory}/elsewhere.py:setup")
    assert one_line(missing_file).endswith(f"there is no file {directory}/elsewhere.py")
    with pytest.raises(InvalidInput) as no_function:
        load_setup(f"{directory / name}.py:nothing")
    assert "has no function nothing" in one_line(no_function)
