"""What the fields of a provider file mean together, checked before anything runs: every
template names a field that is declared, from a namespace that place may use (so credentials
never land in a URL, and a path is filled only from config and parent rows); a parent table is
declared before the tables it partitions; a table's options fit one another. Each problem comes
with the location of the field it is about, so the file's reader can name its line."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

from connectors.declarative.spec import (
    ApiKey,
    Basic,
    Bearer,
    Cursor,
    NextUrl,
    OAuth2,
    ProviderSpec,
    TableSpec,
)
from connectors.declarative.templates import Reference, TemplateError, references

Location = tuple[str | int, ...]
Problem = tuple[Location, str]

CONFIG = "config"
CREDENTIALS = "credentials"


@dataclass(frozen=True)
class Partitioning:
    """Where a table's partitions come from: the rows of a parent table (the fields its path
    names), or the items of a config field that is a list."""

    parent: str | None = None
    fields: tuple[str, ...] = ()
    config_list: str | None = None


def partitioning(spec: ProviderSpec, table: TableSpec) -> Partitioning | None:
    """How ``table`` is partitioned, read from its path; None: it is read whole."""
    try:
        refs = references(table.path)
    except TemplateError:
        return None
    parents = [r for r in refs if r.namespace not in (CONFIG, CREDENTIALS)]
    if parents:
        fields = tuple(dict.fromkeys(r.field for r in parents))
        return Partitioning(parent=parents[0].namespace, fields=fields)
    lists = [
        r.field
        for r in refs
        if r.namespace == CONFIG and (f := spec.config.get(r.field)) and f.type == "array"
    ]
    return Partitioning(config_list=lists[0]) if lists else None


def problems(spec: ProviderSpec, reserved: Collection[str] = ()) -> list[Problem]:
    """Every problem found. ``reserved``: provider names the file may not take (the installed
    plugins')."""
    found: list[Problem] = []
    if spec.provider in reserved:
        found.append((("provider",), "an installed plugin has this name; choose another"))
    found += _provider(spec)
    for i, table in enumerate(spec.tables):
        found += _table(spec, i, table)
    return found


def _provider(spec: ProviderSpec) -> Iterator[Problem]:
    yield from _template(spec, ("base_url",), spec.base_url, {CONFIG})
    for name, value in spec.headers.items():
        yield from _template(spec, ("headers", name), value, {CONFIG, CREDENTIALS})
    auth = spec.auth
    secrets = {CONFIG, CREDENTIALS}
    if isinstance(auth, Bearer):
        yield from _template(spec, ("auth", "token"), auth.token, secrets)
    elif isinstance(auth, Basic):
        yield from _template(spec, ("auth", "username"), auth.username, secrets)
        yield from _template(spec, ("auth", "password"), auth.password, secrets)
    elif isinstance(auth, ApiKey):
        yield from _template(spec, ("auth", "value"), auth.value, secrets)
    elif isinstance(auth, OAuth2):
        yield from _template(spec, ("auth", "token_url"), auth.token_url, {CONFIG})
        if not auth.token_url.startswith(("https://", "http://", "{config.")):
            yield ("auth", "token_url"), "must be an http:// or https:// URL"
    if spec.rate_limit is not None and spec.rate_limit.budget_key is not None:
        where = ("rate_limit", "budget_key")
        yield from _template(spec, where, spec.rate_limit.budget_key, secrets)
    for kind in (CONFIG, CREDENTIALS):
        for name, field in getattr(spec, kind).items():
            if field.type == "array" and kind == CREDENTIALS:
                yield (kind, name, "type"), "a credential is a single value, not an array"
    names = [t.name for t in spec.tables]
    for i, name in enumerate(names):
        if name in names[:i]:
            yield ("tables", i, "name"), f"a second table named {name!r}"


def _table(spec: ProviderSpec, i: int, table: TableSpec) -> Iterator[Problem]:
    at: Location = ("tables", i)
    parted = partitioning(spec, table)
    rows = {table.name} | ({parted.parent} if parted and parted.parent else set())
    yield from _template(spec, (*at, "path"), table.path, {CONFIG}, parents=rows - {table.name})
    if not table.path.startswith("/"):
        yield (*at, "path"), "must start with / (a path under base_url)"
    yield from _parent(spec, i, table, parted)
    for key, value in table.params.items():
        if isinstance(value, str):
            yield from _template(spec, (*at, "params", key), value, {CONFIG})
    if table.confirm is not None:
        where = (*at, "confirm", "path")
        yield from _template(spec, where, table.confirm.path, {CONFIG}, parents=rows)
    if table.deletions is not None:
        where = (*at, "deletions", "path")
        yield from _template(spec, where, table.deletions.path, {CONFIG}, parents=rows)
        if table.incremental is None:
            yield (
                (*at, "deletions"),
                ("a deletion feed is read since the table's cursor: declare `incremental` too"),
            )
        if not isinstance(table.primary_key, str) and table.deletions.id_field is None:
            yield (*at, "deletions", "id_field"), "required with a composite primary key"
    yield from _options(spec, at, table)


def _parent(
    spec: ProviderSpec, i: int, table: TableSpec, parted: Partitioning | None
) -> Iterator[Problem]:
    if parted is None or parted.parent is None:
        return
    where = ("tables", i, "path")
    parents = {r.namespace for r in _refs(table.path)} - {CONFIG, CREDENTIALS}
    if len(parents) > 1:
        yield where, f"names {len(parents)} parent tables; a table has at most one"
    earlier = {t.name: t for t in spec.tables[:i]}
    parent = earlier.get(parted.parent)
    if parent is None:
        declared = parted.parent in {t.name for t in spec.tables}
        yield (
            where,
            (
                f"{{{parted.parent}.…}}: table {parted.parent!r} must be declared before this one"
                if declared
                else f"{{{parted.parent}.…}} names no table (nor config, nor credentials)"
            ),
        )
    elif partitioning(spec, parent) is not None:
        yield where, f"its parent {parent.name!r} is partitioned itself; nest one level only"


def _options(spec: ProviderSpec, at: Location, table: TableSpec) -> Iterator[Problem]:
    incremental = table.incremental
    if incremental is not None and (incremental.cursor_field is None) == (
        incremental.cursor_path is None
    ):
        yield (*at, "incremental"), "give one of cursor_field and cursor_path"
    main = table.paginator or spec.paginator
    if _reads_object(main) and table.records is None:
        yield (*at, "records"), _where_records(main)
    feed = table.deletions
    if feed is not None and _reads_object(feed.paginator or main) and feed.records is None:
        yield (*at, "deletions", "records"), _where_records(feed.paginator or main)
    if table.confirm is not None and not table.shifting:
        yield (*at, "confirm"), "confirms rows of a `shifting: true` table only"


def _reads_object(paginator: object) -> bool:
    return isinstance(paginator, NextUrl | Cursor)


def _where_records(paginator: object) -> str:
    kind = getattr(paginator, "type", "")
    return f"a {kind} paginator reads an object body: say where its records are"


def _refs(template: str) -> list[Reference]:
    try:
        return references(template)
    except TemplateError:
        return []


def _template(
    spec: ProviderSpec,
    where: Location,
    template: str,
    namespaces: set[str],
    *,
    parents: Collection[str] = (),
) -> Iterator[Problem]:
    """Problems of one template: malformed, a namespace this place may not use, a field not
    declared."""
    try:
        refs = references(template)
    except TemplateError as exc:
        yield where, str(exc)
        return
    for ref in refs:
        if ref.namespace in parents:
            continue
        if ref.namespace not in namespaces:
            yield where, _not_here(ref, namespaces | set(parents))
            continue
        fields = spec.config if ref.namespace == CONFIG else spec.credentials
        field = fields.get(ref.field)
        if field is None:
            yield where, f"{ref} names no field declared under `{ref.namespace}`"
        elif field.type == "array" and not (where[-1] == "path" and where[0] == "tables"):
            yield where, f"{ref} is a list; only a table's path may use one (a partition each)"


def _not_here(ref: Reference, allowed: set[str]) -> str:
    if ref.namespace == CREDENTIALS:
        return f"{ref}: credentials go only in auth, headers and budget_key, never in a URL"
    listing = ", ".join(sorted(allowed))
    return f"{ref}: this place is filled only from {listing}"
