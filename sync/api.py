"""The Python API for applications and operators.

``Engine`` opens the database (``DATABASE_URL``, or the embedded default) and does everything an
application needs: workspaces, connections, sync now, cancel, retry, delete, read runs, and the
repairs an operator makes (new credentials, config or schedule, a renamed or deleted workspace,
re-encrypted secrets). An ``Engine`` scoped to a workspace (``engine.scoped(workspace_id)``) can
only see and change that workspace's connections and runs: every statement it sends carries the
workspace id.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import psycopg

from connectors.registry import plugins
from sync.base import redact
from sync.base.embedded import data_dir, embedded_url
from sync.base.names import check_name, check_workspace_name, workspace_ref
from sync.base.secrets import SecretBox
from sync.base.settings import Settings
from sync.catalog import check_credentials, connector_class, valid_config
from sync.errors import Conflict, InvalidInput, NotFound
from sync.ingestions.api import IngestionsApi
from sync.ingestions.store import IngestionStore
from sync.jobs import registry as kinds
from sync.jobs.budgets import budget_key_of
from sync.models import Attempt, Connection, Record, Run, WorkerInfo, Workspace
from sync.overview import (
    ConnectionOverview,
    MetricsSnapshot,
    WorkerState,
    worker_state,
)
from sync.providers import ProvidersApi
from sync.queues.apps import install_handlers
from sync.queues.lanes import parse_lanes
from sync.queues.postgres import PostgresQueues
from sync.readers import ReadersApi
from sync.store import (
    ConnectionRepair,
    LockedConnection,
    OverviewStore,
    RunStore,
    TenantStore,
)
from sync.store.db import Pool, describe, open_pool
from sync.store.maintenance import MaintenanceStore
from sync.store.migrations import Migration, check_schema, grant, migrate
from sync.typed.naming import check_schema_name
from sync.vocabulary import ConnectionStatus, RunKind, RunStatus
from sync.worker import Worker
from sync.worker.services.cleaner import PruneReport, RetentionRules, prune

log = logging.getLogger("sync")


class Engine(IngestionsApi, ProvidersApi, ReadersApi):
    """Entry point of the Python API. Close it (or use it as a context manager) when done."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        database_url: str | None = None,
        pool_size: int | None = None,
    ) -> None:
        redact.install()
        self.settings = settings or Settings()
        self.embedded = not (database_url or self.settings.database_url)
        self.database = describe_database(self.settings, database_url)
        self.url = database_url or self.settings.database_url or embedded_url(self.settings.home)
        self.pool: Pool = open_pool(self.settings, self.url, size=pool_size)
        # The typed statements, on the same pool: the runs path's, the workspaces' and
        # connections', the operators' reads, and the ingestions'.
        self.store = RunStore(self.pool)
        self._tenants = TenantStore(self.pool)
        self._overview = OverviewStore(self.pool)
        self._ingestions = IngestionStore(self.pool)
        self._secrets: SecretBox | None = None
        self._workspace_id: int | None = None
        self._queues: PostgresQueues | None = None
        self._workers: list[Worker] = []  # closed with the engine, which owns their pool

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the workers made on this engine (their ids are free again), then the pool."""
        for worker in self._workers:
            worker.close()
        self._workers.clear()
        if self._workspace_id is None:
            self.pool.close()

    @property
    def secrets(self) -> SecretBox:
        if self._secrets is None:
            self._secrets = SecretBox.from_settings(self.settings)
        return self._secrets

    def scoped(self, workspace_id: int) -> Engine:
        """A view of this engine that sees only one workspace. It shares the pool; closing it
        does nothing."""
        view = copy.copy(self)
        view._workspace_id = workspace_id
        return view

    # -- schema ----------------------------------------------------------------------------

    def migrate(self) -> list[Migration]:
        with self.pool.connection() as conn:
            return migrate(conn, self.settings.schema_name)

    def check_schema(self) -> None:
        with self.pool.connection() as conn:
            check_schema(conn, self.settings.schema_name)

    def grant(self, role: str) -> None:
        with self.pool.connection() as conn:
            grant(conn, self.settings.schema_name, role)

    # -- workspaces ------------------------------------------------------------------------

    def create_workspace(self, name: str) -> Workspace:
        """A new workspace. Its name is unique, at most 200 characters, and not made of digits
        alone (a reference made of digits is an id)."""
        check_workspace_name(name)
        try:
            return self._tenants.create_workspace(name)
        except psycopg.errors.UniqueViolation:
            raise Conflict(f"a workspace named {name!r} already exists") from None

    def workspaces(self) -> list[Workspace]:
        """The workspaces, and deleted ones whose connections are still being purged."""
        return [w for w in self._tenants.workspaces() if self._sees(w.id)]

    def workspace(self, ref: int | str) -> Workspace:
        """A workspace by reference: an int, or a string of the digits 0-9, is an id (a
        deleted workspace too); anything else is the name of a workspace that is not deleted."""
        key = workspace_ref(ref)
        if isinstance(key, int):
            found = self._tenants.workspace_by_id(key)
            missing = f"no workspace with id {key}"
        else:
            found = self._tenants.workspace_by_name(key)
            missing = f"no workspace named {key!r}"
        if found is None or not self._sees(found.id):
            raise NotFound(f"{missing}; list them with `connector-sync workspaces list`")
        return found

    def rename_workspace(self, ref: int | str, name: str) -> Workspace:
        check_workspace_name(name)
        current = self.workspace(ref)
        try:
            renamed = self._tenants.rename_workspace(current.id, name)
        except psycopg.errors.UniqueViolation:
            raise Conflict(f"a workspace named {name!r} already exists") from None
        if renamed is None:
            raise Conflict(f"workspace {current.id} is deleted; it cannot be renamed")
        return renamed

    def delete_workspace(self, ref: int | str) -> list[Run]:
        """Delete a workspace: it is marked deleted (no connection can be created in it, its
        name is free again) and each of its connections is deleted as
        :meth:`delete_connection` does, in one transaction. Returns the purge runs; the
        workspace leaves :meth:`workspaces` when the last of them has succeeded. Its runs stay
        readable by workspace id. Calling it again returns the purges still pending."""
        if self._workspace_id is not None:
            raise InvalidInput("a workspace-scoped engine cannot delete its workspace")
        current = self.workspace(ref)
        return self._tenants.delete_workspace(current.id, self.settings.max_attempts)

    # -- connections -----------------------------------------------------------------------

    def create_connection(
        self,
        workspace_id: int,
        name: str,
        provider: str,
        *,
        config: Mapping[str, Any] | None = None,
        credentials: Mapping[str, Any] | None = None,
        schedule_every: timedelta | float | None = None,
        schema: str | None = None,
    ) -> Connection:
        """Create a connection. The provider must be installed and the config must validate
        against its model: a bad config is refused here, not later inside a run. ``schema``:
        the schema of its typed views (default ``<workspace>_<connection>``)."""
        if self._workspace_id is not None and workspace_id != self._workspace_id:
            raise NotFound(f"no workspace {workspace_id}")
        check_name(name, "connection")
        cls = self._class_of(provider)
        validated = valid_config(cls, config or {})
        creds = dict(credentials or {})
        redact.register(creds)
        check_credentials(cls, creds)
        seconds = _seconds(schedule_every)
        if schema is not None:
            check_schema_name(schema, self.settings.schema_name)
        try:
            created = self._tenants.create_connection(
                workspace_id=workspace_id,
                name=name,
                provider=provider,
                config=validated.model_dump(mode="json"),
                credentials=self.secrets.encrypt(creds) if creds else None,
                budget_key=budget_key_of(cls, provider, validated, creds),
                schedule_seconds=seconds,
                declared=provider not in plugins(),
                reader_schema=schema,
            )
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name == "connections_reader_schema":
                raise Conflict(f"another connection's views are in schema {schema!r}") from None
            raise Conflict(f"workspace {workspace_id} already has a connection {name!r}") from None
        if created is None:
            if provider not in self.load_providers() and provider not in plugins():
                raise NotFound(f"provider {provider!r} was removed meanwhile")
            raise NotFound(f"no workspace {workspace_id} (or it was deleted)")
        return created

    def _class_of(self, provider: str) -> Any:
        """The connector of ``provider``: an installed plugin, else a declared provider (loaded
        from the database first, so one added by another process is found)."""
        if provider not in plugins():
            self.load_providers()
        return connector_class(provider)

    def update_credentials(self, connection_id: int, credentials: Mapping[str, Any]) -> Connection:
        """Give a connection new credentials (a disconnected one becomes active again)."""
        return self.update_connection(connection_id, credentials=credentials)

    def update_connection(
        self,
        connection_id: int,
        *,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        credentials: Mapping[str, Any] | None = None,
        schedule_every: timedelta | float | None = None,
        no_schedule: bool = False,
    ) -> Connection:
        """Repair a connection; what is not given stays as it is.

        ``config`` is merged into the stored config (a key set to None is removed) and the
        result must validate against the provider's model. ``credentials`` replace the stored
        ones whole, are checked against the provider's credentials model, and make a
        disconnected connection active again. ``schedule_every`` sets the schedule (the next
        run is then at most that far away); ``no_schedule`` removes it. Takes the same row lock
        as a run's token refresh, so the two never interleave."""
        if name is not None:
            check_name(name, "connection")
        if no_schedule and schedule_every is not None:
            raise InvalidInput("give a new schedule or remove it, not both")
        seconds = _seconds(schedule_every)
        new_creds = dict(credentials) if credentials is not None else None
        if new_creds is not None:
            redact.register(new_creds)
        workspace_id: int | None = None  # the connection's, for a conflict's message

        def repair(stored: LockedConnection) -> ConnectionRepair:
            nonlocal workspace_id
            workspace_id = stored.workspace_id
            cls = self._class_of(stored.provider)
            merged = dict(stored.config)
            for key, value in (config or {}).items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            validated = valid_config(cls, merged)
            budget_key = stored.budget_key
            if new_creds is not None:
                check_credentials(cls, new_creds)
                budget_key = budget_key_of(cls, stored.provider, validated, new_creds)
            elif config:  # the budget may depend on the config and the stored credentials
                creds = self.secrets.decrypt(stored.credentials) if stored.credentials else {}
                redact.register(creds)
                budget_key = budget_key_of(cls, stored.provider, validated, creds)
            return ConnectionRepair(
                config=validated.model_dump(mode="json"),
                budget_key=budget_key,
                name=name,
                set_credentials=new_creds is not None,
                credentials=self.secrets.encrypt(new_creds) if new_creds else None,
                set_schedule=seconds is not None or no_schedule,
                schedule_seconds=seconds,
            )

        try:
            saved = self._tenants.repair_connection(connection_id, self._workspace_id, repair)
        except psycopg.errors.UniqueViolation:
            raise Conflict(f"workspace {workspace_id} already has a connection {name!r}") from None
        if saved is None:
            raise NotFound(f"no connection {connection_id} (or it is being deleted)")
        return saved

    def rotate_secret_keys(self, batch: int = 500) -> int:
        """Re-encrypt every connection's credentials under the newest key (the first of
        CONNECTOR_SYNC_SECRET_KEYS). After it, older keys can be dropped. Returns the count."""
        if self._workspace_id is not None:
            raise InvalidInput("a workspace-scoped engine cannot rotate keys")
        return self._tenants.rotate_credentials(self.secrets.rotate, batch=batch)

    def connections(self, workspace_id: int | None = None) -> list[Connection]:
        return self._tenants.connections(self._scope(workspace_id))

    def connection(self, connection_id: int) -> Connection:
        found = self._tenants.connection(connection_id, self._workspace_id)
        if found is None:
            raise NotFound(f"no connection {connection_id}")
        return found

    def pause(self, connection_id: int) -> Connection:
        """No scheduled or manual syncs until it is resumed."""
        return self._set_status(
            connection_id,
            ConnectionStatus.PAUSED,
            [ConnectionStatus.ACTIVE, ConnectionStatus.PAUSED],
        )

    def resume(self, connection_id: int, *, force: bool = False) -> Connection:
        """Resume a paused connection. A scheduled one is due at once (the next worker poll
        queues a sync), and its schedule goes on from now. A disconnected one (the provider
        refused its credentials) needs new credentials (:meth:`update_connection`), or ``force``
        to try the refused ones again."""
        allowed = [ConnectionStatus.PAUSED, ConnectionStatus.ACTIVE]
        if force:
            allowed.append(ConnectionStatus.DISCONNECTED)
        return self._set_status(connection_id, ConnectionStatus.ACTIVE, allowed)

    def _set_status(
        self, connection_id: int, status: ConnectionStatus, allowed: list[ConnectionStatus]
    ) -> Connection:
        changed = self._tenants.set_connection_status(
            connection_id, self._workspace_id, status, allowed
        )
        if changed is None:
            current = self.connection(connection_id)  # raises NotFound
            if current.status == ConnectionStatus.DISCONNECTED:
                raise Conflict(
                    f"connection {connection_id} is disconnected: the provider refused its "
                    "credentials; give it new ones (`connector-sync connections update "
                    f"{connection_id} --credentials @FILE`), or resume it with --force to try "
                    "the same ones again"
                )
            raise Conflict(f"connection {connection_id} is {current.status}")
        return changed

    def delete_connection(self, connection_id: int) -> Run:
        """Mark the connection deleting and queue its purge (behind a sync still running).
        Returns the purge run; the connection row disappears when it succeeds."""
        purge = self.store.delete_connection(
            connection_id, self._workspace_id, self.settings.max_attempts
        )
        if purge is None:
            raise NotFound(f"no connection {connection_id}")
        return purge

    # -- runs ------------------------------------------------------------------------------

    def sync(self, connection_id: int, *, trigger: str = "manual") -> Run:
        """Queue a sync now, or return the one already queued or running."""
        queued = self.store.enqueue(
            connection_id, self._workspace_id, trigger, self.settings.max_attempts
        )
        if queued is None:
            current = self.connection(connection_id)  # raises NotFound
            raise Conflict(
                f"connection {connection_id} is {current.status}; only an active connection "
                "syncs"
                + (" (resume it first)" if current.status == ConnectionStatus.PAUSED else "")
            )
        return queued

    def cancel_run(self, run_id: int) -> Run:
        """Cancel a queued run at once, or ask a running one to stop (it keeps its results)."""
        cancelled = self.store.cancel(run_id, self._workspace_id)
        if cancelled is None:
            run = self.run(run_id)  # raises NotFound
            if run.kind == RunKind.PURGE:
                raise Conflict(f"run {run_id} is a purge; a purge cannot be cancelled")
            raise Conflict(
                f"run {run_id} {_state(run)}; only a queued or running run can be cancelled"
            )
        return cancelled

    def retry_run(self, run_id: int) -> Run:
        """Put a dead-lettered (failed) or cancelled run back in the queue with a fresh set of
        attempts; the tables it had not finished are read again."""
        try:
            retried = self.store.retry(run_id, self._workspace_id, self.settings.max_attempts)
        except psycopg.errors.UniqueViolation:
            raise Conflict(
                f"run {run_id}'s connection already has a queued or running run; follow that "
                "one, or cancel it first"
            ) from None
        if retried is None:
            run = self.run(run_id)
            if run.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
                raise Conflict(
                    f"run {run_id} {_state(run)}; only a failed or cancelled run can be retried"
                )
            raise Conflict(f"run {run_id} cannot sync: {self._why_not_active(run)}")
        return retried

    def _why_not_active(self, run: Run) -> str:
        """Why a run's connection cannot sync, and what to do about it."""
        if run.connection_id is None:
            return "its connection was deleted"
        c = self.connection(run.connection_id)
        if c.status == ConnectionStatus.DISCONNECTED:
            return (
                f"connection {c.id} is disconnected (the provider refused its credentials); "
                f"give it new ones (`connector-sync connections update {c.id} --credentials "
                "@FILE`), then retry"
            )
        if c.status == ConnectionStatus.PAUSED:
            return f"connection {c.id} is paused; resume it, then retry"
        return f"connection {c.id} is {c.status}"

    def runs(
        self,
        *,
        connection_id: int | None = None,
        status: RunStatus | None = None,
        workspace_id: int | None = None,
        limit: int = 50,
    ) -> list[Run]:
        return self.store.list_runs(
            workspace_id=self._scope(workspace_id),
            connection_id=connection_id,
            status=status,
            limit=limit,
        )

    def run(self, run_id: int) -> Run:
        found = self.store.get_run(run_id, self._workspace_id)
        if found is None:
            raise NotFound(f"no run {run_id}")
        return found

    def attempts(self, run_id: int) -> list[Attempt]:
        return self.store.attempts(run_id, self._workspace_id)

    def records(
        self,
        connection_id: int,
        table: str | None = None,
        *,
        include_deleted: bool = False,
        limit: int = 10_000,
    ) -> list[Record]:
        """A connection's synced records (live ones unless ``include_deleted``)."""
        return self._tenants.records(
            connection_id,
            self._workspace_id,
            table=table,
            include_deleted=include_deleted,
            limit=limit,
        )

    # -- workers ---------------------------------------------------------------------------

    @property
    def queues(self) -> PostgresQueues:
        """The application queues on this engine's database (see docs/queues.md)."""
        if self._workspace_id is not None:
            raise InvalidInput("a workspace-scoped engine cannot reach the application queues")
        if self._queues is None:
            self._queues = PostgresQueues(
                self.pool, lease=self.settings.lease_seconds, schema=self.settings.schema_name
            )
        return self._queues

    def lanes_online(self) -> dict[str, int]:
        """Lanes per application queue among the live workers."""
        return self.queues.store.lanes_online(self.settings.stale_after)

    def worker(
        self, *, worker_id: str | None = None, listen: bool = True, apps: Sequence[str] = ()
    ) -> Worker:
        """A worker on this engine's pool. Refuses (SchemaBehind) if the schema is behind.

        When ``settings.lanes`` gives queues lanes, the applications installed under the
        entry-point group ``connector_sync.handlers`` and each ``module:function`` of ``apps``
        first declare their queues and register their handlers on :attr:`queues`; a process
        with no lanes loads none of them."""
        if self._workspace_id is not None:
            raise InvalidInput("a workspace-scoped engine cannot run workers")
        secrets = self.secrets
        if any(parse_lanes(self.settings.lanes).values()):
            install_handlers(self.queues, apps)
        worker = Worker(
            self.pool,
            self.settings,
            self.url,
            secrets=secrets,
            worker_id=worker_id,
            listen=listen,
            queues=self.queues,
            kinds=list(kinds.installed().values()),
        )
        self._workers.append(worker)
        return worker

    def workers(self) -> list[WorkerInfo]:
        return self._overview.workers()

    def queued_without_worker(self) -> list[tuple[str, int, int]]:
        """Queued syncs no live worker can take, by provider: ``(provider, runs, oldest run
        id)``. They stay queued until a worker with that provider's connector starts."""
        return list(self._overview.unserved(self.settings.stale_after, self._workspace_id))

    # -- plumbing --------------------------------------------------------------------------

    def _scope(self, workspace_id: int | None) -> int | None:
        if self._workspace_id is not None:
            if workspace_id not in (None, self._workspace_id):
                raise NotFound(f"no workspace {workspace_id}")
            return self._workspace_id
        return workspace_id

    def _sees(self, workspace_id: int) -> bool:
        return self._workspace_id is None or workspace_id == self._workspace_id

    # -- operator views (the web page and /metrics) -------------------------------------------

    def connections_overview(
        self, workspace_id: int | None = None, *, limit: int = 500
    ) -> list[ConnectionOverview]:
        """Connections with their queued or running run and their last finished one, by
        workspace; at most ``limit`` of them."""
        return self._overview.connections_overview(self._scope(workspace_id), limit=limit)

    def worker_states(self) -> list[tuple[WorkerInfo, WorkerState]]:
        """Every worker known to the database, with whether it is alive, stale or stopped."""
        stale_after = self.settings.stale_after
        return [(w, worker_state(w, stale_after)) for w in self.workers()]

    def metrics_snapshot(
        self, *, window_seconds: float = 3600.0, timeout: float = 5.0
    ) -> MetricsSnapshot:
        """The figures ``/metrics`` exports from the database (finished runs and their records
        over the last ``window_seconds``), read in one statement that may take at most
        ``timeout`` seconds. Not available to a workspace-scoped engine."""
        if self._workspace_id is not None:
            raise InvalidInput("a workspace-scoped engine cannot read fleet-wide metrics")
        return self._overview.metrics_snapshot(
            window_seconds=window_seconds,
            stale_after_seconds=self.settings.stale_after,
            timeout=timeout,
        )

    # -- retention -------------------------------------------------------------------------

    def prune(self, *, dry_run: bool = False) -> PruneReport:
        """Delete what retention says is no longer needed (old finished runs beyond the newest
        of each connection, their attempts, long-stopped workers, ended rate budgets, seen keys
        of ended runs, finished jobs past their queue's retention, old finished ingestions, and
        old tombstones when ``tombstone_days`` is set), now, in bounded
        batches, as a worker's cleaner does once per ``clean_interval``. ``dry_run`` deletes
        nothing and counts what would go. Not available to a workspace-scoped engine."""
        if self._workspace_id is not None:
            raise InvalidInput("a workspace-scoped engine cannot prune the fleet's history")
        rules = RetentionRules.from_settings(self.settings)
        return prune(MaintenanceStore(self.pool), rules, dry_run=dry_run)


def describe_database(settings: Settings, database_url: str | None = None) -> str:
    """Which database an Engine on these settings uses, for people (never a password)."""
    url = database_url or settings.database_url
    where = (
        f"{describe(url)} (DATABASE_URL)"
        if url
        else f"embedded Postgres under {data_dir(settings.home)}"
    )
    return f"{where}, schema {settings.schema_name}"


def _seconds(every: timedelta | float | None) -> float | None:
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    if seconds is not None and seconds <= 0:
        raise InvalidInput("schedule_every must be a positive duration")
    return seconds


def _state(run: Run) -> str:
    """``is queued``, ``has already ended (succeeded)``: a run's status in a sentence."""
    return f"has already ended ({run.status})" if run.is_terminal else f"is {run.status}"
