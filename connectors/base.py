"""The connector class, its tables and what reading a table yields."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, BinaryIO, ClassVar, Generic, TypeVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict

from connectors.context import ConnectorContext
from connectors.files import Download, File


class Mode(StrEnum):
    """How a table is synced."""

    FULL = "full"
    """Every sync reads everything; rows not seen in a complete read are tombstoned."""
    INCREMENTAL = "incremental"
    """A cursor is saved per table (or partition) and the next sync reads what changed since;
    :class:`Table.deletions` says how deletions are found."""


class Deletions(StrEnum):
    """How the engine learns that a row was deleted upstream. Either way, with default
    settings, a deletion is tombstoned by the next sync that completes."""

    LISTING = "listing"
    """A complete listing shows them: a row a complete read of the table (or of a partition) did
    not see is gone. A ``full`` table is listed completely at every sync. An ``incremental``
    table read by update time, whose reads never show a deletion, is listed completely at every
    sync too: the engine withholds its cursor (``context.cursor`` answers None) and the
    connector reads the whole table after a ``Resync()``, with conditional requests where the
    provider answers unchanged pages with 304s. An operator may trade deletion latency for
    requests with the ``complete_every`` setting (the cursor is then given between complete
    passes)."""
    FEED = "feed"
    """The provider's feed of changes reports them (a delta query, a change feed): the
    incremental reads yield :class:`Deleted`, and the cursor is always given."""


@dataclass(frozen=True)
class Table:
    """A table a connector syncs: its name, the record field(s) that identify a row, its mode,
    and what the engine should know about how it is listed."""

    name: str
    primary_key: str | tuple[str, ...] = "id"
    mode: Mode = Mode.FULL
    shifting: bool = False
    """The listing can shift while it is read (page numbers, offsets): an item deleted on an
    earlier page moves a later one onto a page already read, so a key missing from a complete
    read is not proof of a deletion. Missing keys are confirmed with
    :meth:`Connector.confirm_deleted` before they are tombstoned, or, where that is not possible,
    tombstoned only once two complete listings missed them."""
    hash_ignores: tuple[str, ...] = ()
    """Fields (dotted paths into the record, e.g. ``"head.repo.pushed_at"``) left out of the
    content hash: a row whose other fields did not change is not rewritten. The row is stored
    whole when it is written for another reason."""
    deletions: Deletions = Deletions.LISTING
    """How deletions are found: by a complete listing (the default, and the only way for a
    ``full`` table) or by the provider's feed of changes (an ``incremental`` table whose reads
    yield :class:`Deleted`)."""
    confirm_limit: int = 100
    """At most this many missing keys per partition are confirmed one by one in a run; the rest
    wait for a second complete listing."""
    files: bool = False
    """Records of this table may be files (documents whose content can be fetched and indexed):
    the connector describes them with :meth:`Connector.describe_file` and streams their content
    with :meth:`Connector.download`. The records are stored like any other table's."""
    model: type[BaseModel] | None = None
    """The shape of a record, for readers: each field of the model (by its alias, where it has
    one) is a column of the table's typed view, with the Postgres type of its annotation. Fields
    the model does not name get columns too, typed from the data."""
    flatten: tuple[str, ...] = ()
    """Fields whose value is an object, shown to readers as one column per field of that object
    (``user`` becomes ``user__login``, ``user__id``...) instead of one ``jsonb`` column."""

    def __post_init__(self) -> None:
        if self.mode is Mode.FULL and self.deletions is Deletions.FEED:
            raise ValueError(
                f"table {self.name!r}: a full table finds deletions by its complete listing; "
                "a feed of deletions belongs to an incremental table"
            )

    @property
    def listed_whole_for_deletions(self) -> bool:
        """An incremental table whose deletions only a complete listing shows: its cursor is
        withheld at every sync unless an operator sets ``complete_every`` for it."""
        return self.mode is Mode.INCREMENTAL and self.deletions is Deletions.LISTING


@dataclass(frozen=True)
class Deleted:
    """Yielded by an incremental table: the row with this primary key was deleted upstream."""

    external_id: str


@dataclass(frozen=True)
class Checkpoint:
    """Yielded by an incremental table after the records it covers: once they are written the
    engine saves ``cursor``, and the next sync resumes from it."""

    cursor: Any
    partition: str | None = None
    """Save the cursor for this partition of the table (``context.cursor(table, partition)``)."""


@dataclass(frozen=True)
class Resync:
    """Yielded by an incremental table whose provider asked for a full resync (Microsoft Graph's
    410 on a delta link): the rows that follow are the whole table, so rows not among them are
    tombstoned when the table completes, as for a ``full`` table."""


@dataclass(frozen=True)
class Position:
    """Yielded after the records it covers: where the read would go on from (a next link, a page
    number, a page token, with whatever else the read needs to go on, such as the time it
    started). The engine saves it with the batch that holds those records; if the attempt ends
    before the table does, the next attempt of the same run gets it back from
    ``context.position(table, partition)`` and resumes there. It lives as long as the run; a
    cursor (:class:`Checkpoint`) outlives it."""

    value: Any


@dataclass(frozen=True)
class Total:
    """Yielded when the provider says how many records the table (or the partition being read)
    holds: a ``Total`` header, ``@odata.count``. It fills the run's ``total_units`` and the
    progress bar."""

    count: int
    estimate: bool = False
    """The count is an estimate (GitHub's last page number times the page size is an upper
    bound): it is shown as one ("about 200"), and once the slice is read to its end the engine
    replaces it with the records read."""


Item = Mapping[str, Any] | Deleted | Checkpoint | Resync | Position | Total
"""One thing a table read yields. A page (a list of items) may be yielded instead."""


class NoConfig(BaseModel):
    """The config model of a connector that takes no settings."""

    model_config = ConfigDict(extra="forbid")


ConfigT = TypeVar("ConfigT", bound=BaseModel)


class Connector(Generic[ConfigT]):
    """Subclass this as ``Connector[MyConfig]``, set ``provider``, ``tables`` and
    ``config_model = MyConfig`` (and, if you like, ``credentials_model``), implement ``read``,
    and register the class with :func:`connectors.register` or an entry point.

    ``self.context.config`` (and the ``config`` that :meth:`budget_key` gets) is then typed as
    ``MyConfig``: the engine validates the connection's config with ``config_model`` before it
    makes the connector, and a class whose ``config_model`` is not the model it names in
    brackets is refused when it is defined."""

    provider: ClassVar[str]
    tables: ClassVar[Sequence[Table]] = ()
    config_model: ClassVar[type[BaseModel]] = NoConfig
    credentials_model: ClassVar[type[BaseModel] | None] = None
    """Optional: a pydantic model of the credentials (see ``connectors.credentials``). The
    engine refuses credentials that do not validate when a connection is created or given new
    ones; None accepts any."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__dict__.get("__orig_bases__", ()):
            if get_origin(base) is not Connector:
                continue
            (model,) = get_args(base)
            if isinstance(model, type) and not issubclass(cls.config_model, model):
                raise TypeError(
                    f"{cls.__name__} is a Connector[{model.__name__}] but its config_model is "
                    f"{cls.config_model.__name__}: set config_model = {model.__name__}"
                )

    def __init__(self, context: ConnectorContext[ConfigT]) -> None:
        self.context = context

    @classmethod
    def budget_key(cls, config: ConfigT, credentials: Mapping[str, Any]) -> str | None:
        """The rate budget this connection draws on (the token, the OAuth app, the tenant), or
        None if it shares none. Connections with one key are throttled together across workers.
        The engine stores only a hash of the key."""
        return None

    def read(self, table: Table) -> Iterable[Item | Sequence[Item]]:
        """Yield the records of ``table`` (dicts), page by page if you like."""
        raise NotImplementedError(f"{type(self).__name__} does not implement read()")

    def partitions(self, table: Table) -> Sequence[str] | None:
        """The partitions ``table`` is read in (repositories, projects, drives), or None to read
        it whole with :meth:`read`. Each partition is read with :meth:`read_partition` and is
        checkpointed, reported and tombstoned on its own: one that fails fails only its slice."""
        return None

    def read_partition(self, table: Table, partition: str) -> Iterable[Item | Sequence[Item]]:
        """Yield the records of one partition of ``table``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement read_partition()")

    def confirm_deleted(
        self, table: Table, partition: str | None, missing: Mapping[str, Mapping[str, Any]]
    ) -> Collection[str] | None:
        """For a ``shifting`` table: of the rows a complete read did not see (their key to their
        stored record), the keys the provider confirms are gone (a 404 or 410 on the item). Keys
        not returned stay live. Return None when the provider has no per-item read: then a key
        is tombstoned only once two complete listings missed it."""
        return None

    @classmethod
    def describe_file(cls, table: Table, record: Mapping[str, Any]) -> File | None:
        """For a table declared with ``files=True``: the :class:`~connectors.files.File` a
        stored record is, or None for a record that is not a file (a folder). It reads only
        the record (no provider, no connection), so the engine may call it on any worker, on
        any stored row. A record that claims to be a file but cannot be described (no name)
        raises :class:`~connectors.errors.PermanentError`."""
        raise NotImplementedError(f"{cls.__name__} does not implement describe_file()")

    def download(
        self, table: Table, record: Mapping[str, Any], out: BinaryIO, *, max_bytes: int
    ) -> Download:
        """Stream the content of the file a stored record of a ``files`` table is into ``out``
        (a seekable binary file, written from its current position), refusing more than
        ``max_bytes`` bytes: usually one call of ``HttpClient.download``. Given only the record
        and this connection's config and credentials, on whichever worker asks. Raise
        :class:`~connectors.errors.FileGone` when the provider says the file no longer
        exists."""
        raise NotImplementedError(f"{type(self).__name__} does not implement download()")

    def close(self) -> None:
        """Release what the connector holds (HTTP clients). Called once after the run."""
