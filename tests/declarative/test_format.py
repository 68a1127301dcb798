"""The provider file format: its JSON Schema as published in docs/, mistakes reported at their
lines (YAML syntax, a key given twice, the shape, what the fields mean together), and templates
that only ever put values in as text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.declarative import ProviderFileError, json_schema, parse
from connectors.declarative.templates import MissingValue, TemplateError, fill, references

SCHEMA = Path(__file__).resolve().parent.parent.parent / "docs" / "declarative-provider.schema.json"
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples" / "declarative"


def mistakes(text: str) -> list[tuple[int, str]]:
    with pytest.raises(ProviderFileError) as refused:
        parse(text)
    return [(m.line, m.where) for m in refused.value.mistakes]


def test_the_published_schema_is_the_formats() -> None:
    assert json.loads(SCHEMA.read_text()) == json_schema(), (
        "regenerate it: connector-sync providers schema > docs/declarative-provider.schema.json"
    )


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_the_examples_are_valid(path: Path) -> None:
    assert parse(path.read_text()).tables


def test_yaml_syntax_and_a_key_given_twice_are_reported_at_their_lines() -> None:
    assert mistakes("provider: a\ntables: [\n") == [(3, "")]
    assert mistakes("provider: a\nbase_url: x\nprovider: b\n") == [(3, "provider")]


def test_what_the_fields_mean_together_is_checked_at_each_line() -> None:
    text = """\
provider: tiny
config: {base_url: {type: string}, repos: {type: array}}
credentials: {token: {type: string}}
base_url: "{config.base_url}?key={credentials.token}"
tables:
  - name: orders
    path: /users/{users.id}/orders
  - name: users
    path: users
    paginator: {type: cursor, path: next}
    deletions: {path: /deleted}
  - name: repos
    path: /repos/{config.repos}
    params: {q: "{config.repos}"}
    confirm: {path: "/repos/{config.repos}/{repos.id}"}
"""
    assert mistakes(text) == [
        (4, "base_url"),  # credentials never in a URL
        (7, "tables[0].path"),  # a parent declared after its child
        (8, "tables[1].records"),  # a cursor paginator reads an object: where are records?
        (9, "tables[1].path"),  # not under base_url
        (11, "tables[1].deletions"),  # a deletion feed needs a cursor
        (11, "tables[1].deletions.records"),
        (14, "tables[2].params.q"),  # a list only in a path
        (15, "tables[2].confirm"),  # confirming is for a shifting table
    ]


def test_templates_fill_from_values_as_text_and_evaluate_nothing() -> None:
    values = {"config": {"a": "x/../y?z=1", "n": 3, "flag": True}, "users": {"id": 7}}
    assert fill("/u/{users.id}/{config.a}", values, in_path=True) == "/u/7/x%2F..%2Fy%3Fz%3D1"
    assert fill("{config.n}-{config.flag}", values) == "3-true"
    with pytest.raises(MissingValue):
        fill("{config.__class__.__mro__}", values)
    with pytest.raises(TemplateError):
        references("{config.a + 1}")
    with pytest.raises(TemplateError):
        references("/users/{id")


@given(st.text(min_size=1, max_size=40))
def test_a_value_in_a_path_is_one_segment_whatever_it_holds(value: str) -> None:
    filled = fill("/items/{config.v}", {"config": {"v": value}}, in_path=True)
    assert filled.count("/") == 2 and "?" not in filled and "#" not in filled


DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "declarative-connectors.md"


def test_the_worked_examples_of_the_docs_are_valid_files() -> None:
    blocks = re.findall(r"```yaml\n# (\S+\.yaml).*?\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert [name for name, _ in blocks] == [
        "tiny.yaml",
        "simulated_crm.yaml",
        "github_pull_requests.yaml",
    ]
    for name, body in blocks:
        assert parse(body).tables, name
    # The CRM example is the example file itself, less its comments.
    crm = dict(blocks)["simulated_crm.yaml"]
    assert parse(crm) == parse((EXAMPLES / "simulated_crm.yaml").read_text()).model_copy(
        update={"description": None}
    )
