"""Every tunable of the engine, from env vars (``CONNECTOR_SYNC_*``, plus ``DATABASE_URL``) and
CLI flags, in one pydantic-settings model. The defaults and what each means are listed in
docs/operations.md."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sync.base.durations import parse_duration

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# A provider's table, as `complete_every` names it: github.issues, procore.rfis.
_TABLE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
_COMPLETE_EVERY = "write PROVIDER.TABLE=DURATION[,...], such as github.issues=12h,procore.rfis=2d"


def default_home() -> Path:
    """The user's data directory (``~/.local/share/connector-sync`` on Linux), never the
    current directory: every command finds the same embedded database wherever it runs."""
    return Path(platformdirs.user_data_dir("connector-sync", appauthor=False))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CONNECTOR_SYNC_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DATABASE_URL", "CONNECTOR_SYNC_DATABASE_URL"),
        description="The Postgres to use; unset means the embedded one under `home`.",
    )
    home: Path = Field(
        default_factory=default_home,
        description="The embedded Postgres (pgdata/), the credentials key file, demo logs.",
    )
    schema_name: str = Field(
        default="sync",
        validation_alias=AliasChoices("CONNECTOR_SYNC_SCHEMA", "schema_name"),
        description="The schema every table lives in.",
    )
    secret_keys: SecretStr | None = Field(
        default=None,
        description="Comma-separated Fernet keys; the first encrypts, all decrypt (rotation).",
    )

    lease_seconds: float = Field(default=120.0, gt=0)
    poll_interval: float = Field(default=2.0, gt=0)
    control_interval: float = Field(default=2.0, gt=0)
    heartbeat_interval: float = Field(default=15.0, gt=0)
    stale_heartbeats: int = Field(
        default=3,
        ge=2,
        description="Heartbeat intervals without one after which a worker counts as gone.",
    )
    max_backoff: float = Field(
        default=30.0,
        gt=0,
        description="Longest wait between retries while the database keeps failing: the "
        "worker's idle poll, the LISTEN reconnect and each worker service.",
    )
    listen_check_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds the LISTEN connection waits for a notification before it checks "
        "that the connection is still alive.",
    )
    run_timeout_seconds: float = Field(default=6 * 3600.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    reader_schema_prefix: str = Field(
        default="",
        pattern=r"^[a-z0-9_]{0,20}$",
        description="Put before the default name of each connection's schema of typed views "
        "(`<workspace>_<connection>`), to keep two installations in one database apart.",
    )
    backoff_seconds: tuple[float, ...] = Field(default=(5.0, 30.0, 120.0), min_length=1)
    backoff_jitter: float = Field(default=0.2, ge=0, lt=1)
    batch_size: int = Field(default=1000, ge=1)
    purge_batch_size: int = Field(default=5000, ge=1)
    providers_interval: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between a worker's loads of the declared providers added since.",
    )
    schedule_interval: float = Field(
        default=1.0, gt=0, description="Seconds between a worker's scans for due schedules."
    )
    schedule_batch: int = Field(default=100, ge=1)
    sweep_interval: float = Field(
        default=60.0,
        gt=0,
        description="Seconds between sweeps of the seen keys that ended runs left behind, "
        "by one worker of the fleet.",
    )
    sweep_batch: int = Field(default=10000, ge=1)
    tombstone_step: int = Field(
        default=10_000,
        ge=1,
        description="Stored rows a step of the tombstone pass reads: each step is one short "
        "fenced statement, so the lease's renewals interleave with the pass.",
    )
    clean_interval: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds between retention passes (the cleaner), by one worker of the fleet.",
    )
    history_days: float = Field(
        default=30.0,
        gt=0,
        description="Finished runs and finished ingestions older than this are deleted.",
    )
    history_keep_runs: int = Field(
        default=20,
        ge=0,
        description="The newest runs of each connection kept whatever their age.",
    )
    stopped_worker_days: float = Field(
        default=1.0,
        gt=0,
        description="Workers stopped (or silent) for longer than this are deleted.",
    )
    tombstone_days: float | None = Field(
        default=None,
        gt=0,
        description="Records tombstoned longer ago than this are deleted; unset keeps them.",
    )
    http_cache_days: float = Field(
        default=7.0,
        ge=1,
        description="ETag cache entries (conditional requests) nobody asked for in this long are "
        "deleted.",
    )
    retention_batch: int = Field(
        default=1000, ge=1, description="Rows per delete statement of the cleaner."
    )
    pool_size: int = Field(default=4, ge=3)
    statement_timeout: float = Field(default=60.0, gt=0, description="Seconds per statement.")
    lock_timeout: float = Field(default=10.0, gt=0, description="Seconds to wait for a lock.")
    idle_in_transaction_timeout: float = Field(
        default=300.0,
        gt=0,
        description="Seconds a session may sit idle inside a transaction before Postgres ends it.",
    )
    connect_timeout: int = Field(default=10, ge=1, description="Seconds to open a connection.")
    pooler: Literal["none", "transaction"] = Field(
        default="none",
        description="`transaction` when a transaction pooler (PgBouncer in transaction mode) "
        "stands between the engine and Postgres: the engine then sends its settings in every "
        "transaction instead of once per connection, prepares no statement on the server, and "
        "listens only on `listen_url`.",
    )
    listen_url: str | None = Field(
        default=None,
        description="A direct connection to Postgres for the worker's LISTEN (wake-ups). Unset: "
        "DATABASE_URL, or behind a transaction pooler none, and workers find work by polling.",
    )
    max_inline_wait: float = Field(
        default=30.0, ge=0, description="Longest Retry-After slept inside a run; longer requeues."
    )
    run_deadline: float = Field(
        default=24 * 3600.0,
        gt=0,
        description="Seconds from a run's start past which it stops waiting for rate limits "
        "and ends failed.",
    )

    complete_every: Annotated[dict[str, timedelta], NoDecode] = Field(
        default_factory=dict,
        description="An opt-in that trades deletion latency for requests: how often an "
        "incremental table whose deletions only a complete listing shows is read completely, "
        "per provider and table (`github.issues=12h,procore.rfis=2d`); between those passes "
        "only what changed is read, and a deletion is found up to that much later. Unset: "
        "every sync lists such a table completely, so a deletion is found by the next sync.",
    )

    metrics_timeout: float = Field(
        default=5.0, gt=0, description="Seconds the statement behind a /metrics scrape may take."
    )

    ingestion_lanes: int = Field(
        default=1,
        ge=0,
        le=64,
        description="How many files a worker indexes at once, in lanes of their own beside its "
        "sync runs (0: this worker indexes none).",
    )
    lanes: str | None = Field(
        default=None,
        description="Lanes per application queue, QUEUE=N,...: how many jobs of each queue a "
        "worker runs at once. Unset: the worker serves no application queue.",
    )
    queue_schedule_interval: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between a lane-serving worker's scans for due cron schedules of "
        "the application queues (how late a tick may fire).",
    )

    # Ingestions: files made searchable (see docs/documents.md).
    ingestion_batch_size: int = Field(
        default=200, ge=1, description="Chunks embedded and written per fenced batch."
    )
    ingestion_timeout_seconds: float = Field(
        default=6 * 3600.0, gt=0, description="Seconds one attempt of an ingestion may take."
    )
    archive_reclaim_seconds: float = Field(
        default=900.0,
        gt=0,
        description="Seconds after which an archive expansion still processing (its worker "
        "died) is taken by another worker.",
    )

    # Embeddings: what turns chunks (by the workers) and queries (by search) into vectors. Every
    # process of a deployment needs the same ones (see docs/documents.md).
    embedder: Literal["hashing", "openai"] = Field(
        default="hashing",
        description="`hashing`: lexical feature hashing, no network; `openai`: an "
        "OpenAI-compatible embeddings endpoint, set by the `embeddings_*` settings.",
    )
    embeddings_url: str | None = Field(
        default=None,
        description="The endpoint's base URL, to which `/embeddings` is added, such as "
        "https://api.openai.com/v1 (embedder `openai`).",
    )
    embeddings_model: str | None = Field(
        default=None,
        description="The model the endpoint embeds with, such as text-embedding-3-small.",
    )
    embeddings_dimensions: int | None = Field(
        default=None,
        ge=16,
        le=16_000,
        description="The vectors' length: what the model serves (1536 for "
        "text-embedding-3-small), or what it is asked for with `embeddings_send_dimensions`. "
        "Required for `openai`; 256 for `hashing` when unset.",
    )
    embeddings_send_dimensions: bool = Field(
        default=False,
        description="Ask the endpoint for `embeddings_dimensions` (OpenAI's text-embedding-3 "
        "models shorten on request; older models refuse the parameter).",
    )
    embeddings_api_key: SecretStr | None = Field(
        default=None,
        description="The endpoint's API key, sent as a Bearer token; unset sends none (a "
        "self-hosted server). Never printed or logged.",
    )

    ui_token: SecretStr | None = Field(
        default=None,
        description="The operator page's access token; requests without it get 401.",
    )
    ui_auth_header: str | None = Field(
        default=None,
        description="A header naming the user, set by a reverse proxy the operator trusts.",
    )

    @model_validator(mode="after")
    def _endpoint_is_complete(self) -> Settings:
        if self.embedder != "openai":
            return self
        missing = [
            "CONNECTOR_SYNC_" + name.upper()
            for name in ("embeddings_url", "embeddings_model", "embeddings_dimensions")
            if not getattr(self, name)
        ]
        if missing:
            raise ValueError(
                "the embedder `openai` needs " + ", ".join(missing) + " (or set "
                "CONNECTOR_SYNC_EMBEDDER=hashing)"
            )
        url = self.embeddings_url or ""
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                "CONNECTOR_SYNC_EMBEDDINGS_URL is not an http(s) URL; give the endpoint's "
                "base URL, such as https://api.openai.com/v1"
            )
        return self

    @field_validator("home", mode="before")
    @classmethod
    def _empty_home_is_unset(cls, value: object) -> object:
        # `CONNECTOR_SYNC_HOME=` would be the current directory: a second embedded database
        # wherever a command runs, which the user's data directory is there to prevent.
        if isinstance(value, str) and not value.strip():
            return default_home()
        return value

    @field_validator("schema_name")
    @classmethod
    def _schema_is_identifier(cls, value: str) -> str:
        if not _IDENTIFIER.match(value):
            raise ValueError("must be a lower-case SQL identifier such as `sync`")
        return value

    @field_validator("complete_every", mode="before")
    @classmethod
    def _parse_complete_every(cls, value: Any) -> Any:
        """``PROVIDER.TABLE=DURATION,...`` as it comes from the environment; a mapping (from
        Python) is validated as it is."""
        if not isinstance(value, str):
            return value
        found: dict[str, Any] = {}
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            name, sep, every = (part.strip() for part in item.partition("="))
            if not sep or not _TABLE.match(name):
                raise ValueError(f"{item!r} is not PROVIDER.TABLE=DURATION; {_COMPLETE_EVERY}")
            if name in found:
                raise ValueError(f"{name!r} is given twice; give each table once")
            try:
                found[name] = parse_duration(every)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return found

    @field_validator("complete_every")
    @classmethod
    def _complete_every_is_positive(cls, value: dict[str, timedelta]) -> dict[str, timedelta]:
        for name, every in value.items():
            if every <= timedelta(0):
                raise ValueError(f"the interval of {name!r} must be longer than zero")
        return value

    def complete_every_of(self, provider: str, table: str) -> timedelta | None:
        """How often ``provider``'s incremental ``table``, whose deletions only a complete
        listing shows, is read completely; None (the default): at every sync."""
        return self.complete_every.get(f"{provider}.{table}")

    @property
    def renew_interval(self) -> float:
        """Leases are renewed at a third of their length."""
        return self.lease_seconds / 3

    @property
    def stale_after(self) -> float:
        """Seconds without a heartbeat after which a worker that recorded no stop counts as
        gone (crashed, frozen or cut off): ``stale_heartbeats`` heartbeat intervals."""
        return self.stale_heartbeats * self.heartbeat_interval
