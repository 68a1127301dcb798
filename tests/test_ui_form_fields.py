"""The connection forms are made from a connector's pydantic models: a field per model field,
typed the way the model reads it, and a submitted form read back into what the model validates."""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, Field

from connectors.github import GitHubConfig
from sync.ui.forms import form_fields, parse_form, shown


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Everything(BaseModel):
    name: str = Field(description="Who it is.")
    count: int = 3
    ratio: float | None = None
    on: bool = True
    mode: Literal["fast", "safe"] = "safe"
    color: Color = Color.BLUE
    tags: list[str] = []
    extra: dict[str, int] = {}


def test_each_type_gets_the_input_that_reads_it() -> None:
    fields = {f.name: f for f in form_fields(Everything, "config")}
    kinds = {name: f.kind for name, f in fields.items()}
    assert kinds == {
        "name": "text", "count": "integer", "ratio": "number", "on": "checkbox",
        "mode": "choice", "color": "choice", "tags": "lines", "extra": "json",
    }  # fmt: skip
    assert fields["name"].required and fields["name"].help == "Who it is."
    assert (fields["count"].default, fields["on"].default, fields["color"].default) == (
        "3", "on", "blue"
    )  # fmt: skip
    assert fields["mode"].choices == ("fast", "safe")
    assert fields["ratio"].type_name == "float | None" and fields["ratio"].default is None
    github = {f.name: f for f in form_fields(GitHubConfig, "config")}
    assert github["repos"].kind == "lines" and github["repos"].required


def test_a_submitted_form_is_read_back_into_what_the_model_validates() -> None:
    fields = form_fields(Everything, "config")
    values, errors = parse_form(
        fields,
        {
            "config.name": "  acme  ",
            "config.count": "",  # empty: the model's default
            "config.ratio": "0.5",
            "config.mode": "fast",
            "config.tags": "a\n\n b \nc",
            "config.extra": '{"x": 1}',
        },
    )
    assert errors == {}
    assert values == {
        "name": "acme", "ratio": "0.5", "on": False, "mode": "fast",
        "tags": ["a", "b", "c"], "extra": {"x": 1},
    }  # fmt: skip
    assert Everything.model_validate(values).ratio == 0.5
    _, errors = parse_form(fields, {"config.extra": "{not json"})
    assert errors["extra"].startswith("is not JSON: ")
    assert shown("lines", ["a", "b"]) == "a\nb" and shown("json", {"x": 1}) == '{\n  "x": 1\n}'


def test_a_provider_without_a_credentials_model_takes_a_json_object() -> None:
    (field,) = form_fields(None, "credentials", secret=True)
    assert (field.kind, field.secret, field.whole) == ("json", True, True)
    values, errors = parse_form([field], {"credentials.credentials": '{"token": "t"}'})
    assert (values, errors) == ({"token": "t"}, {})
    _, errors = parse_form([field], {"credentials.credentials": "[1]"})
    assert errors == {"credentials": "must be a JSON object: {...}"}
