"""``connector-sync providers``: the providers there are (installed plugins and declared ones),
and the declared providers' files: ``add``, ``validate``, ``remove``, ``schema``; and
``new-connector``, the scaffold of a plugin package."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psycopg
import typer
from rich.text import Text

from connectors.declarative import ProviderFileError
from connectors.scaffold import ScaffoldError, write_package
from sync.catalog import describe_providers
from sync.cli.common import (
    USER_ERROR,
    JsonOption,
    app,
    command_group,
    emit_json,
    fail,
    guarded,
    load_settings,
    open_engine,
    stdout,
    warn,
)
from sync.cli.console import Cell, Col, fitted_table
from sync.providers import check_provider_file, provider_schema

providers_app = command_group(
    "Providers: the installed plugins, and declared providers (one YAML file each).\n\n"
    "Without a command, lists them all."
)
providers_app.info.invoke_without_command = True
providers_app.info.no_args_is_help = False
app.add_typer(providers_app, name="providers")

FileArg = typer.Argument(..., metavar="FILE", help="A provider file (YAML), or - for stdin.")


@providers_app.callback()
def providers(ctx: typer.Context, as_json: bool = JsonOption) -> None:
    """Every provider: its tables, config and credential fields, and whether it is an installed
    plugin or a declared provider (with the version new runs take).

    Each table says how a deletion upstream is found: at the next sync, from the provider's
    delta feed, or within the interval an operator set with CONNECTOR_SYNC_COMPLETE_EVERY.
    Fields are required unless marked optional; --json adds types, defaults and descriptions."""
    if ctx.invoked_subcommand is None:
        _list(as_json)


@guarded
def _list(as_json: bool) -> None:
    settings = load_settings()
    with open_engine(settings, check=False) as engine:
        try:
            engine.load_providers()
        except psycopg.errors.UndefinedTable:
            warn("declared providers are not listed: run `connector-sync migrate` first")
        described = describe_providers(settings.complete_every)
    if as_json:
        emit_json(described)
        return
    out = stdout()
    columns = [
        Col("provider", key=True),
        Col("kind"),
        Col("tables", text="words"),
        Col("config", text="words"),
        Col("credentials", text="words"),
    ]
    rows: list[list[Cell]] = [
        [
            d["provider"],
            "plugin" if d["declared_version"] is None else f"declared v{d['declared_version']}",
            ", ".join(
                f"{t['name']} ({t['mode']}; deletions: {t['deletions']})" for t in d["tables"]
            ),
            _fields_text(d["config"]),
            _fields_text(d["credentials"]),
        ]
        for d in described
    ]
    out.print(fitted_table(columns, rows, out.width))
    out.print(Text("`connector-sync providers --json` gives types, defaults and descriptions"))


def _fields_text(fields: list[dict[str, Any]] | None) -> str:
    if fields is None:
        return "any (not declared)"
    if not fields:
        return "none"
    return ", ".join(f"{f['name']}{'' if f['required'] else ' (optional)'}" for f in fields)


@providers_app.command("add")
@guarded
def providers_add(file: str = FileArg, as_json: bool = JsonOption) -> None:
    """Check a provider file and store it in the database: every worker runs it, with no
    deploy (each loads new files within CONNECTOR_SYNC_PROVIDERS_INTERVAL, 10 s).

    A file for a provider already declared is its next version: runs that start after take
    it, runs already started finish on theirs. Nothing is stored if the file has a mistake."""
    text = _read(file)
    with open_engine() as engine:
        try:
            added = engine.add_provider(text)
        except ProviderFileError as exc:
            _mistakes(file, exc)
    if as_json:
        emit_json({"provider": added.name, "version": added.version, "tables": added.tables})
        return
    stdout().print(
        f"stored provider {added.name} version {added.version} (tables: "
        f"{', '.join(added.tables)}); workers load it within "
        f"{load_settings().providers_interval:g} s"
    )


@providers_app.command("validate")
def providers_validate(file: str = FileArg) -> None:
    """Check a provider file without storing it: each mistake is printed with its line."""
    text = _read(file)
    try:
        spec = check_provider_file(text)
    except ProviderFileError as exc:
        _mistakes(file, exc)
    tables = ", ".join(t.name for t in spec.tables)
    stdout().print(f"{file}: provider {spec.provider} is valid (tables: {tables})")


@providers_app.command("remove")
@guarded
def providers_remove(
    name: str = typer.Argument(..., metavar="NAME", help="A declared provider."),
) -> None:
    """Remove a declared provider, every version of it. Refused while a connection uses it."""
    with open_engine() as engine:
        engine.remove_provider(name)
    stdout().print(f"removed declared provider {name}")


@providers_app.command("schema")
def providers_schema() -> None:
    """The JSON Schema of a provider file, for an editor's completion and checks."""
    sys.stdout.write(json.dumps(provider_schema(), indent=2) + "\n")


DirOption = typer.Option(
    None, "--dir", metavar="DIR", help="Where to write the package (default: ./NAME)."
)


@app.command("new-connector")
def new_connector(
    name: str = typer.Argument(
        ..., metavar="NAME", help="The provider's name: lower case letters, digits, _."
    ),
    directory: Path | None = DirOption,
) -> None:
    """Write a connector plugin package to start from: its pyproject.toml (with the entry
    point), the connector, a fake of the provider's API and a test, which pass as written
    (pip install -e 'DIR[test]', then pytest in DIR with DATABASE_URL set)."""
    target = directory or Path(name)
    try:
        written = write_package(name, target)
    except ScaffoldError as exc:
        fail(str(exc))
    out = stdout()
    for path in written:
        out.print(Text(f"wrote {path}"))
    out.print(Text(f"next: cd {target} && pip install -e '.[test]' && pytest"))


def _read(file: str) -> str:
    if file == "-":
        return sys.stdin.read()
    try:
        return Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {file}: {exc.strerror if isinstance(exc, OSError) else exc}")


def _mistakes(file: str, exc: ProviderFileError) -> None:
    """Each mistake on a line of its own, as compilers say them (FILE:LINE: ...), then exit 2:
    nothing was stored."""
    for mistake in exc.mistakes:
        where = f"{mistake.where}: " if mistake.where else ""
        print(f"error: {file}:{mistake.line}: {where}{mistake.message}", file=sys.stderr)
    raise typer.Exit(USER_ERROR)
