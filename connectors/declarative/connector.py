"""The connector a provider file describes: an ordinary :class:`Connector` subclass, built by
:func:`build` from a :class:`ProviderSpec`, so the engine runs it as any other (one HTTP client
and shared rate budget, read positions, the deletion contract, partitions, fencing).

Every URL it asks for is filled from the file's templates (config, credentials where allowed,
parent rows) and confined to ``base_url``'s host, so neither a config value nor a provider's
next link nor a parent row can send a request, or the credentials, anywhere else."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, create_model

from connectors.auth import ApiKey as ApiKeyAuth
from connectors.auth import Auth, BasicAuth, BearerToken
from connectors.auth import OAuth2 as OAuth2Auth
from connectors.base import (
    Checkpoint,
    Connector,
    Deleted,
    Deletions,
    Item,
    Mode,
    Position,
    Resync,
    Table,
)
from connectors.context import ConnectorContext
from connectors.credentials import OAuth2ClientCredentials, OAuth2RefreshCredentials
from connectors.declarative import policy
from connectors.declarative.checks import CONFIG, CREDENTIALS, Partitioning, partitioning
from connectors.declarative.listing import Page, Request, pages
from connectors.declarative.spec import (
    ApiKey,
    Basic,
    Bearer,
    FieldSpec,
    OAuth2,
    ProviderSpec,
    TableSpec,
)
from connectors.declarative.templates import MissingValue, as_text, dig, fill
from connectors.errors import PermanentError
from connectors.http import HttpClient

_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": {"string": list[str], "integer": list[int]},
}


class _Config(BaseModel):
    """A declared config: a field it does not declare is a mistake."""

    model_config = ConfigDict(extra="forbid")


class _Credentials(BaseModel):
    """Declared credentials: the engine saves refreshed OAuth2 tokens beside them."""

    model_config = ConfigDict(extra="allow")


def build(spec: ProviderSpec, *, version: int | None = None) -> type[DeclarativeConnector]:
    """The connector class of ``spec`` (``version``: the stored version it was read from)."""
    attributes = {
        "provider": spec.provider,
        "spec": spec,
        "version": version,
        "config_model": _model(f"{spec.provider}_config", spec.config, _Config),
        "credentials_model": _model(
            f"{spec.provider}_credentials", spec.credentials, _credentials_base(spec)
        ),
        "tables": tuple(_table(spec, t) for t in spec.tables),
        "__module__": __name__,
        "__doc__": spec.description or f"The declared provider {spec.provider!r}.",
    }
    return type(f"Declared_{spec.provider}", (DeclarativeConnector,), attributes)


def _model(name: str, fields: Mapping[str, FieldSpec], base: type[BaseModel]) -> type[BaseModel]:
    declared: dict[str, Any] = {}
    for field_name, field in fields.items():
        kind = _TYPES["array"][field.items] if field.type == "array" else _TYPES[field.type]
        required = field.required if field.required is not None else field.default is None
        if required:
            declared[field_name] = (kind, Field(description=field.description))
        else:
            declared[field_name] = (
                kind | None,
                Field(default=field.default, description=field.description),
            )
    model: type[BaseModel] = create_model(name, __base__=base, __module__=__name__, **declared)
    return model


def _credentials_base(spec: ProviderSpec) -> type[BaseModel]:
    if isinstance(spec.auth, OAuth2):
        grant = spec.auth.grant
        return OAuth2RefreshCredentials if grant == "refresh_token" else OAuth2ClientCredentials
    return _Credentials


def _table(spec: ProviderSpec, table: TableSpec) -> Table:
    key = table.primary_key if isinstance(table.primary_key, str) else tuple(table.primary_key)
    feed = table.incremental is not None and (
        table.deleted is not None or table.deletions is not None
    )
    return Table(
        table.name,
        primary_key=key,
        mode=Mode.INCREMENTAL if table.incremental else Mode.FULL,
        shifting=table.shifting,
        hash_ignores=tuple(table.hash_ignores),
        deletions=Deletions.FEED if feed else Deletions.LISTING,
    )


class DeclarativeConnector(Connector[BaseModel]):
    """The behaviour every declared provider shares; :func:`build` makes a subclass per file."""

    spec: ClassVar[ProviderSpec]
    version: ClassVar[int | None] = None

    def __init__(self, context: ConnectorContext[BaseModel]) -> None:
        super().__init__(context)
        spec = self.spec
        self._config = context.config.model_dump(mode="json")
        self._secrets = dict(context.credentials)
        values = {CONFIG: self._config, CREDENTIALS: self._secrets}
        base_url = _filled(spec.base_url, {CONFIG: self._config}, "base_url")
        if not base_url.startswith(("http://", "https://")):
            raise PermanentError(f"base_url must be an http:// or https:// URL, not {base_url!r}")
        self._specs = {t.name: t for t in spec.tables}
        self._parted = {t.name: partitioning(spec, t) for t in spec.tables}
        # The parent values a complete read of a parent table listed, for its children.
        self._listed: dict[str, list[str]] = {}
        rules = spec.rate_limit
        self.http = HttpClient(
            context,
            base_url=base_url.rstrip("/"),
            auth=self._auth(values),
            headers={k: _filled(v, values, f"headers.{k}") for k, v in spec.headers.items()},
            classify_response=lambda r, now: policy.classify(r, now, rules, spec.retry),
            on_response=self._note_budget if rules and rules.remaining_header else None,
            confine_to_base_url=True,
        )

    @classmethod
    def budget_key(cls, config: BaseModel, credentials: Mapping[str, Any]) -> str | None:
        rules = cls.spec.rate_limit
        if rules is None or rules.budget_key is None:
            return None
        values = {CONFIG: config.model_dump(mode="json"), CREDENTIALS: dict(credentials)}
        try:
            key = fill(rules.budget_key, values)
        except MissingValue:
            return None
        # Only a digest leaves here: the template may name a secret.
        return f"{cls.provider}:{hashlib.sha256(key.encode()).hexdigest()[:32]}"

    def close(self) -> None:
        self.http.close()

    # -- tables ----------------------------------------------------------------------------

    def read(self, table: Table) -> Iterator[Item | list[Item]]:
        return self._read(table, None)

    def partitions(self, table: Table) -> Sequence[str] | None:
        parted = self._parted[table.name]
        if parted is None:
            return None
        if parted.config_list is not None:
            return [as_text(v) for v in self._config.get(parted.config_list) or ()]
        assert parted.parent is not None
        if parted.parent not in self._listed:
            for _ in self._listing(self._specs[parted.parent], None, None, None, keep=True):
                pass
        return list(dict.fromkeys(self._listed.get(parted.parent, ())))

    def read_partition(self, table: Table, partition: str) -> Iterator[Item | list[Item]]:
        return self._read(table, partition)

    def confirm_deleted(
        self, table: Table, partition: str | None, missing: Mapping[str, Mapping[str, Any]]
    ) -> Collection[str] | None:
        spec = self._specs[table.name]
        if spec.confirm is None:
            return None
        gone_statuses = tuple(spec.confirm.gone)
        redirects = any(300 <= s < 400 for s in gone_statuses)
        gone = []
        for key, record in missing.items():
            values = {**self._values(spec, partition), table.name: record}
            try:
                url = fill(spec.confirm.path, values, in_path=True)
            except MissingValue:
                continue  # a stored row without the fields: left to a second listing
            response = self.http.get(url, expect=gone_statuses, follow_redirects=not redirects)
            if response.status_code in gone_statuses or self._marked(spec, response):
                gone.append(key)
        return gone

    # -- reading ---------------------------------------------------------------------------

    def _read(self, table: Table, partition: str | None) -> Iterator[Item | list[Item]]:
        spec = self._specs[table.name]
        resumed = self.context.position(table.name, partition)
        since = None
        if spec.incremental is not None:
            if resumed is not None:
                since = resumed.get("since")
            else:
                since = (self.context.cursor(table.name, partition) or {}).get("since")
                if since is None:
                    yield Resync()  # no cursor: the whole table follows
        tracker = _CursorTracker(spec, resumed)
        yield from self._listing(spec, partition, since, resumed, tracker=tracker)
        if spec.incremental is None:
            return
        if spec.deletions is not None and since is not None:
            yield from self._deleted_since(spec, partition, since)
        cursor = tracker.cursor()
        if cursor is not None and cursor != since:
            yield Checkpoint({"since": cursor}, partition=partition)

    def _listing(
        self,
        spec: TableSpec,
        partition: str | None,
        since: Any,
        resumed: Mapping[str, Any] | None,
        *,
        tracker: _CursorTracker | None = None,
        keep: bool = False,
    ) -> Iterator[Item | list[Item]]:
        """The table's listing (what changed ``since``, when given), page by page, each page
        followed by the position after it. The values of the fields its children's paths name
        are kept when the listing is complete (or ``keep``, a listing only for them)."""
        values = self._values(spec, partition)
        params = {k: _param(v, values) for k, v in spec.params.items()}
        if since is not None and spec.incremental is not None:
            params[spec.incremental.param] = since
        conditional = spec.conditional if spec.conditional is not None else self.spec.conditional
        request = Request(
            url=_filled(spec.path, values, f"table {spec.name}: path", in_path=True),
            params=params,
            records=spec.records,
            conditional=conditional and since is None,
        )
        children = self._children_fields(spec.name)
        complete = keep or (since is None and not resumed)
        listed: list[str] | None = [] if children and complete else None
        paginator = spec.paginator or self.spec.paginator
        for page in pages(self.http, paginator, request, (resumed or {}).get("page")):
            if tracker is not None:
                tracker.see(page)
            if listed is not None:
                listed.extend(self._parent_values(spec, page.records, children))
            if keep:
                continue
            yield self._items(spec, page.records)
            if page.next is not None:
                state = tracker.state() if tracker is not None else {}
                yield Position({"page": page.next, "since": since, **state})
        if listed is not None:
            self._listed[spec.name] = listed

    def _deleted_since(
        self, spec: TableSpec, partition: str | None, since: Any
    ) -> Iterator[list[Item]]:
        """The deletion feed since the cursor the changes were read from."""
        feed = spec.deletions
        assert feed is not None and spec.incremental is not None
        values = self._values(spec, partition)
        request = Request(
            url=_filled(feed.path, values, f"table {spec.name}: deletions.path", in_path=True),
            params={spec.incremental.param: since},
            records=feed.records,
        )
        id_field = feed.id_field
        for page in pages(self.http, feed.paginator or self.spec.paginator, request, None):
            if id_field is not None:
                yield [Deleted(as_text(r[id_field])) for r in page.records if r.get(id_field)]
            else:
                yield [Deleted(_key(r, spec.primary_key)) for r in page.records]

    def _items(self, spec: TableSpec, records: list[dict[str, Any]]) -> list[Item]:
        """A page's records; those marked deleted are a :class:`Deleted` in an incremental
        table, and left out of a full one (its tombstone pass finds them gone)."""
        if spec.deleted is None:
            return list(records)
        items: list[Item] = []
        for record in records:
            if not _is_marked(spec, record):
                items.append(record)
            elif spec.incremental is not None:
                items.append(Deleted(_key(record, spec.primary_key)))
        return items

    def _marked(self, spec: TableSpec, response: httpx.Response) -> bool:
        """A row asked for by its key that the provider shows marked deleted."""
        if spec.deleted is None or not response.is_success:
            return False
        body = self.http.json_of(response)
        return isinstance(body, Mapping) and _is_marked(spec, body)

    # -- templates -------------------------------------------------------------------------

    def _values(self, spec: TableSpec, partition: str | None) -> dict[str, Mapping[str, Any]]:
        """What the templates of a table's slice are filled from: the config (with the slice's
        item in place of a config list) and the parent's fields (from the partition)."""
        values: dict[str, Mapping[str, Any]] = {CONFIG: self._config}
        parted = self._parted[spec.name]
        if parted is None or partition is None:
            return values
        if parted.config_list is not None:
            values[CONFIG] = {**self._config, parted.config_list: partition}
        elif parted.parent is not None:
            values[parted.parent] = _partition_fields(parted, partition)
        return values

    def _children_fields(self, name: str) -> tuple[str, ...]:
        fields: dict[str, None] = {}
        for parted in self._parted.values():
            if parted is not None and parted.parent == name:
                fields.update(dict.fromkeys(parted.fields))
        return tuple(fields)

    def _parent_values(
        self, spec: TableSpec, records: list[dict[str, Any]], fields: tuple[str, ...]
    ) -> Iterator[str]:
        for record in records:
            if spec.deleted is not None and _is_marked(spec, record):
                continue
            found = [dig(record, f) for f in fields]
            if any(v is None or v == "" for v in found):
                continue
            texts = [as_text(v) for v in found]
            yield texts[0] if len(texts) == 1 else json.dumps(texts, separators=(",", ":"))

    def _auth(self, values: Mapping[str, Mapping[str, Any]]) -> Auth | None:
        auth = self.spec.auth
        if isinstance(auth, Bearer):
            return BearerToken(_filled(auth.token, values, "auth.token", secret=True))
        if isinstance(auth, Basic):
            return BasicAuth(
                _filled(auth.username, values, "auth.username", secret=True),
                _filled(auth.password, values, "auth.password", secret=True),
            )
        if isinstance(auth, ApiKey):
            key = _filled(auth.value, values, "auth.value", secret=True)
            if auth.in_ == "query":
                return ApiKeyAuth(key, param=auth.name)
            return ApiKeyAuth(key, header=auth.name)
        if isinstance(auth, OAuth2):
            return OAuth2Auth(
                self.context,
                token_url=_filled(auth.token_url, {CONFIG: self._config}, "auth.token_url"),
                grant=auth.grant,
                scope=auth.scope,
                client_auth=auth.client_auth,
            )
        return None

    def _note_budget(self, response: httpx.Response) -> None:
        rules = self.spec.rate_limit
        assert rules is not None
        until = policy.spent_until(response, datetime.now(UTC), rules)
        if until is not None:
            self.context.report_rate_limit(
                until, f"{self.provider}: {rules.remaining_header} reached 0"
            )


class _CursorTracker:
    """The cursor an incremental read moves to: the largest ``cursor_field`` value among its
    records, or the ``cursor_path`` value of its first page, carried in the read position so a
    resumed read counts what earlier attempts read."""

    def __init__(self, spec: TableSpec, resumed: Mapping[str, Any] | None) -> None:
        self._incremental = spec.incremental
        self._value = (resumed or {}).get("cursor")

    def see(self, page: Page) -> None:
        incremental = self._incremental
        if incremental is None:
            return
        if incremental.cursor_path is not None:
            if self._value is None:
                self._value = dig(page.body, incremental.cursor_path)
            return
        assert incremental.cursor_field is not None
        for record in page.records:
            found = dig(record, incremental.cursor_field)
            if found is not None and (self._value is None or _later(found, self._value)):
                self._value = found

    def state(self) -> dict[str, Any]:
        return {"cursor": self._value} if self._incremental is not None else {}

    def cursor(self) -> Any:
        return self._value


def _later(value: Any, than: Any) -> bool:
    numbers = (int, float)
    if isinstance(value, numbers) and isinstance(than, numbers):
        return value > than
    return as_text(value) > as_text(than)


def _is_marked(spec: TableSpec, record: Mapping[str, Any]) -> bool:
    marker = spec.deleted
    assert marker is not None
    found = dig(record, marker.field)
    return bool(found) if marker.value is None else found == marker.value


def _key(record: Mapping[str, Any], primary_key: str | list[str]) -> str:
    """The row's key as the engine stores it: the field's value as text, or a JSON array of a
    composite key's values."""
    names = [primary_key] if isinstance(primary_key, str) else primary_key
    values = [record.get(name) for name in names]
    if any(v is None or v == "" for v in values):
        raise PermanentError(f"a deleted record has no primary key field ({', '.join(names)})")
    if len(values) == 1:
        return str(values[0])
    return json.dumps(values, separators=(",", ":"), default=str)


def _partition_fields(parted: Partitioning, partition: str) -> dict[str, Any]:
    if len(parted.fields) == 1:
        return {parted.fields[0]: partition}
    return dict(zip(parted.fields, json.loads(partition), strict=True))


def _param(value: str | int | float | bool, values: Mapping[str, Mapping[str, Any]]) -> Any:
    if not isinstance(value, str):
        return as_text(value) if isinstance(value, bool) else value
    return _filled(value, values, "params")


def _filled(
    template: str,
    values: Mapping[str, Mapping[str, Any]],
    where: str,
    *,
    in_path: bool = False,
    secret: bool = False,
) -> str:
    try:
        return fill(template, values, in_path=in_path)
    except MissingValue as exc:
        what = "a credential" if secret else str(exc)
        raise PermanentError(f"{where}: {what} is missing, so the URL cannot be made") from None
