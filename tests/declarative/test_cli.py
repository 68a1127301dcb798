"""`connector-sync providers add|validate|remove|schema` and `new-connector`, as a user runs
them: mistakes each on a line naming the file's line, nothing stored; the listing shows declared
providers beside the plugins; a removal in use is one clear line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_backends import Cli

GOOD = """\
provider: tiny_api
config: {base_url: {type: string}}
credentials: {token: {type: string}}
base_url: "{config.base_url}"
auth: {type: bearer, token: "{credentials.token}"}
tables:
  - name: users
    path: /users
"""
BAD = """\
provider: tiny_api
config: {base_url: {type: string}}
base_url: "{config.base_url}"
auth: {type: bearer, token: "{credentials.token}"}
tables:
  - name: users
    path: /users
    primary_ky: id
"""


def declared(cli: Cli) -> dict[str, int]:
    listed = cli("providers", "--json").json()
    return {p["provider"]: p["declared_version"] for p in listed if p["declared_version"]}


def test_a_bad_file_is_reported_line_by_line_and_stores_nothing(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "tiny.yaml"
    bad.write_text(BAD)
    for command in ("validate", "add"):
        result = cli("providers", command, str(bad))
        assert result.code == 2 and "Traceback" not in result.err
        lines = [line for line in result.err.splitlines() if line.startswith("error:")]
        assert lines == [f"error: {bad}:8: tables[0].primary_ky: not a field here (a typo?)"]
    assert declared(cli) == {}

    bad.write_text(GOOD.replace('{credentials.token}"}', '{credentials.tokn}"}'))
    lines = cli("providers", "validate", str(bad)).err.splitlines()
    assert f"error: {bad}:5: auth.token: {{credentials.tokn}} names no field" in lines[0]


def test_add_list_and_remove(cli: Cli, tmp_path: Path) -> None:
    good = tmp_path / "tiny.yaml"
    good.write_text(GOOD)
    assert "is valid (tables: users)" in cli("providers", "validate", str(good)).ok().out
    assert declared(cli) == {}  # validate stores nothing
    assert "version 1" in cli("providers", "add", str(good)).ok().out
    assert cli("providers", "add", "--json", "-", stdin=GOOD).json()["version"] == 2
    assert declared(cli) == {"tiny_api": 2}
    listing = cli("providers", columns=120).ok().out
    assert "declared v2" in listing and "plugin" in listing

    cli("workspaces", "create", "w").ok()
    cli(
        "connections", "create", "-w", "w", "-n", "c", "-p", "tiny_api",
        "--config", '{"base_url": "https://api.tiny.example"}', "--credentials", '{"token": "t"}',
    ).ok()  # fmt: skip
    cli("providers", "remove", "tiny_api").one_line_error("1 connection(s) use provider")
    assert declared(cli) == {"tiny_api": 2}
    cli("providers", "remove", "nope").one_line_error("no declared provider 'nope'")


def test_the_schema_and_a_scaffold_name_refused(cli: Cli, tmp_path: Path) -> None:
    schema = json.loads(cli("providers", "schema").ok().out)
    assert schema["title"] == "connector-sync declarative provider"
    assert {"provider", "base_url", "tables"} <= set(schema["properties"])
    cli("new-connector", "Bad-Name", "--dir", str(tmp_path / "x")).one_line_error(
        "is not a provider name"
    )
