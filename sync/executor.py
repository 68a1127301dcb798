"""Executes one claimed run: a sync reads each table of the connector and writes its records; a
purge deletes a deleted connection's data in bounded batches. Every write is fenced by the
claim's lease owner. The decision about the run's fate is ``retry_policy.decide``; this module
gathers its inputs and applies its answer.

A sync resumes where earlier attempts of the same run left it (``sync.checkpoints``): tables
they settled are not read again, and every slice (a table, or one partition of it) that is not
done resumes at its last committed position. Results are kept twice: the run's row holds the
totals of every attempt, each attempt's history row its own counts."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb
from pydantic import BaseModel
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from connectors.base import Connector, Mode, Table
from connectors.context import CachedResponse
from connectors.errors import (
    Aborted,
    AuthError,
    ConnectorError,
    PermanentError,
    RateLimited,
    RetryableError,
)
from sync import redact, tracing
from sync.abort import AbortSignal
from sync.checkpoints import RunCheckpoints, seen_keys_intact
from sync.connector_setup import ConnectorSetupError, connector_inputs
from sync.db import Pool, first_line
from sync.errors import LeaseLost
from sync.http_cache import HttpCache
from sync.ingestions.store import queue_file_ingestions
from sync.lease import Control, Lease, LeaseKeeper
from sync.progress import RunProgress
from sync.queries import QUERIES
from sync.records import RecordWriter, fenced_one
from sync.retry_policy import (
    SETTLED,
    AbortReason,
    Action,
    Outcome,
    TableResult,
    TableStatus,
    Waiting,
    decide,
    merged,
    table_status,
)
from sync.secrets import SecretBox
from sync.settings import Settings
from sync.tombstones import TombstonePass
from sync.worker_metrics import WorkerMetrics, outcome_label

log = logging.getLogger("sync.run")


@dataclass(frozen=True)
class ClaimedRun:
    """A run as the claim returned it, with what the executor needs of its connection."""

    id: int
    connection_id: int | None
    workspace_id: int
    provider: str
    budget_key: str | None
    kind: str
    attempts: int
    max_attempts: int
    lease_owner: UUID
    lease_expires_at: datetime
    started_at: datetime | None
    waits: int
    results: dict[str, Any]
    processed_units: int
    connection_name: str | None
    connection_status: str | None
    config: dict[str, Any] | None
    credentials: bytes | None
    cursors: dict[str, Any] | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ClaimedRun:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.lease_owner)


class RunLog(logging.LoggerAdapter[logging.Logger]):
    """Every line about a run says which run, connection, attempt and worker, in the message
    (for plain-text logs) and as record attributes (for structured handlers)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        context = self.extra or {}
        kwargs["extra"] = {**context, **kwargs.get("extra", {})}
        tags = " ".join(f"{key.removesuffix('_id')}={value}" for key, value in context.items())
        return f"{msg} [{tags}]", kwargs


class BudgetView:
    """When the run's shared rate budget is free again; kept fresh by the lease keeper's
    control read and by the run's own reports."""

    def __init__(self) -> None:
        self.until: datetime | None = None

    def learn(self, control: Control) -> None:
        """What a control read says of the budget: a block only ever gets longer."""
        until = control.budget_blocked_until
        if until is not None and (self.until is None or until > self.until):
            self.until = until


class RunContext:
    """The engine's side of :class:`connectors.ConnectorContext` for one attempt."""

    def __init__(
        self,
        *,
        run: ClaimedRun,
        connector_class: type[Connector],
        config: BaseModel,
        credentials: Mapping[str, Any],
        cursors: dict[str, Any],
        abort: AbortSignal,
        budget: BudgetView,
        pool: Pool,
        secrets: SecretBox | None,
        settings: Settings,
        logger: logging.LoggerAdapter[logging.Logger],
        checkpoints: RunCheckpoints | None = None,
        cache: HttpCache | None = None,
    ) -> None:
        self._run = run
        self._connector_class = connector_class
        self._config = config
        self._credentials = credentials
        self._cursors = cursors
        self._checkpoints = checkpoints or RunCheckpoints()
        self._cache = cache
        # Incremental tables whose periodic complete pass is due: their cursor is withheld.
        self.withheld: set[str] = set()
        self._abort = abort
        self._budget = budget
        self._pool = pool
        self._secrets = secrets
        self._settings = settings
        self._logger = logger

    @property
    def config(self) -> BaseModel:
        return self._config

    @property
    def credentials(self) -> Mapping[str, Any]:
        return self._credentials

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        return self._logger

    def cursor(self, table: str, partition: str | None = None) -> Any | None:
        if table in self.withheld:
            return None
        saved = self._cursors.get(table)
        if partition is None:
            return saved
        return saved.get(partition) if isinstance(saved, dict) else None

    def position(self, table: str, partition: str | None = None) -> Any | None:
        return self._checkpoints.position(table, partition)

    def cached_response(self, url: str) -> CachedResponse | None:
        return self._cache.get(url) if self._cache is not None else None

    def store_response(self, url: str, response: CachedResponse) -> None:
        if self._cache is not None:
            self._cache.put(url, response)

    @property
    def aborted(self) -> bool:
        return self._abort.is_set

    def check_abort(self) -> None:
        self._abort.check()

    def sleep(self, seconds: float) -> None:
        if self._abort.wait(seconds):
            self._abort.check()

    @property
    def max_inline_wait(self) -> float:
        return self._settings.max_inline_wait

    def refresh_credentials(
        self, refresh: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    ) -> Mapping[str, Any]:
        if self._secrets is None:
            raise PermanentError("no secret key is configured, so credentials cannot be saved")
        params = {
            "run_id": self._run.id,
            "lease_owner": self._run.lease_owner,
            "connection_id": self._run.connection_id,
        }
        with self._pool.connection() as conn, conn.transaction():
            row = conn.execute(QUERIES.lock_credentials, params).fetchone()
            if row is None:
                raise LeaseLost()
            current = self._secrets.decrypt(row["credentials"]) if row["credentials"] else {}
            fresh = dict(refresh(current))
            redact.register(fresh)
            if fresh != current:
                conn.execute(
                    QUERIES.save_credentials,
                    {
                        "connection_id": self._run.connection_id,
                        "credentials": self._secrets.encrypt(fresh),
                        "budget_key": budget_key_of(
                            self._connector_class, self._run.provider, self._config, fresh
                        ),
                        "reconnect": False,
                    },
                )
                self._logger.info("credentials refreshed and saved")
        self._credentials = fresh
        return fresh

    def report_rate_limit(self, until: datetime, reason: str) -> None:
        key = self._run.budget_key
        if self._budget.until is None or until > self._budget.until:
            self._budget.until = until
        if key is None:
            return
        with self._pool.connection() as conn:
            conn.execute(
                QUERIES.block_rate_budget,
                {"key": key, "blocked_until": until, "reason": redact.redact(reason)},
            )
        self._logger.info("rate budget spent until %s: %s", until.isoformat(), reason)

    def rate_limited_until(self) -> datetime | None:
        until = self._budget.until
        if until is not None and until <= datetime.now(UTC):
            return None
        return until


def budget_key_of(
    cls: type[Connector], provider: str, config: BaseModel, credentials: Mapping[str, Any]
) -> str | None:
    """The hashed rate-budget key of a connection: never the connector's raw key, which may be
    derived from a secret."""
    key = cls.budget_key(config, credentials)
    if key is None:
        return None
    return f"{provider}:{hashlib.sha256(key.encode()).hexdigest()[:24]}"


class _StopAttempt(Exception):
    """The attempt cannot go on (unusable config or credentials, refused credentials)."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error["message"])
        self.error = error


class Executor:
    def __init__(
        self,
        pool: Pool,
        settings: Settings,
        secrets: SecretBox | None,
        keeper: LeaseKeeper,
        worker_id: str,
        *,
        providers: list[str] | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._providers = providers  # what the claim of the next run may take
        self._metrics = metrics
        self._pool = pool
        self._settings = settings
        self._secrets = secrets
        self._keeper = keeper
        self._worker_id = worker_id
        self.current: AbortSignal | None = None
        self._seen_keys_left = False

    def execute(self, run: ClaimedRun, *, claim_next: bool = False) -> ClaimedRun | None:
        """Run one claimed run to its end and apply the outcome. With ``claim_next``, a run that
        finishes is sealed and the next run claimed in one round trip; that run is returned (it
        is running under this worker's lease, to be executed next)."""
        abort = AbortSignal()
        budget = BudgetView()
        logger = RunLog(
            log,
            {
                "run_id": run.id,
                "connection_id": run.connection_id,
                "attempt": run.attempts,
                "worker_id": self._worker_id,
            },
        )
        self.current = abort
        self._seen_keys_left = False
        watch = self._keeper.watch(run.lease, abort, on_control=budget.learn, logger=logger)
        logger.info("%s run started (attempt %d of %d)", run.kind, run.attempts, run.max_attempts)
        outcome: Outcome | None = None
        attempt: dict[str, TableResult] = {}
        started = time.monotonic()
        span = tracing.begin(
            f"connector_sync.{run.kind}",
            {
                "connector_sync.run_id": run.id,
                "connector_sync.connection_id": run.connection_id or 0,
                "connector_sync.provider": run.provider,
                "connector_sync.attempt": run.attempts,
                "connector_sync.worker_id": self._worker_id,
            },
        )
        try:
            if run.kind == "purge":
                outcome, results, processed = self._purge(run, abort, logger)
            else:
                outcome, results, attempt = self._sync(run, abort, budget, logger)
                processed = None
            return self._apply(
                run, outcome, results, attempt, processed, logger, claim_next=claim_next
            )
        finally:
            self._keeper.release(watch)
            self.current = None
            if self._metrics is not None:
                elapsed = time.monotonic() - started
                self._metrics.attempt_ended(run.kind, run.provider, outcome, elapsed, attempt)
            ended = outcome_label(outcome)
            failed = ended in ("failed", "error", "requeue")
            tracing.end(
                span,
                {"connector_sync.outcome": ended},
                error=_span_error(outcome) if failed else None,
            )
            # Seen keys serve every attempt of the run: they go when the run has ended.
            if self._seen_keys_left and outcome is not None and outcome.action is Action.FINISH:
                self._clear_seen_keys(run, logger)

    # -- sync ------------------------------------------------------------------------------

    def _sync(
        self,
        run: ClaimedRun,
        abort: AbortSignal,
        budget: BudgetView,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> tuple[Outcome, dict[str, TableResult], dict[str, TableResult]]:
        """Returns the outcome, the run's results (totals of every attempt) and this attempt's
        own."""
        before = {name: TableResult.from_json(r) for name, r in (run.results or {}).items()}
        totals = dict(before)
        attempt: dict[str, TableResult] = {}
        decide_ = self._decider(run)
        if run.connection_status != "active":
            state = run.connection_status or "gone"
            error = {"kind": "cancelled", "message": f"the connection is {state}"}
            return Outcome(Action.FINISH, "cancelled", error=error), totals, attempt
        # Only a run that has written before has checkpoints to resume from.
        checkpoints = RunCheckpoints()
        if run.processed_units > 0:
            with self._pool.connection() as conn:
                checkpoints = RunCheckpoints.load(conn, run.id)
        try:
            connector, context = self._open_connector(run, abort, budget, logger, checkpoints)
        except _StopAttempt as stop:
            return decide_(totals, run_error=stop.error), totals, attempt
        for table in connector.tables:
            totals.setdefault(table.name, TableResult())
        # Tables settled by an earlier attempt are not read again.
        unsettled = [t for t in connector.tables if totals[t.name].status not in SETTLED]
        progress = RunProgress([t.name for t in connector.tables], checkpoints)
        try:
            context.withheld = self._complete_passes_due(run, unsettled, checkpoints)
            for table in unsettled:
                if abort.is_set:
                    break
                progress.begin_table(table.name)
                table_span = tracing.begin(
                    "connector_sync.table",
                    {"connector_sync.table": table.name, "connector_sync.run_id": run.id},
                )
                result = self._sync_table(
                    run,
                    connector,
                    table,
                    abort,
                    logger,
                    checkpoints,
                    progress,
                    before.get(table.name),
                )
                tracing.end(
                    table_span,
                    {
                        "connector_sync.status": result.status.value,
                        "connector_sync.upserted": result.upserted,
                        "connector_sync.unchanged": result.unchanged,
                        "connector_sync.tombstoned": result.tombstoned,
                    },
                    error=(result.error or {}).get("message") if result.error else None,
                )
                logger.info("table %s %s %s", table.name, result.status.value, result.to_json())
                if table.files and result.status in (TableStatus.SUCCEEDED, TableStatus.PARTIAL):
                    # New and changed files are queued for ingestion; deleted ones dropped.
                    queue_file_ingestions(
                        self._pool, run.lease, run.connection_id, table.name, run.max_attempts
                    )
                attempt[table.name] = result
                totals[table.name] = merged(before.get(table.name), result)
                if result.status is not TableStatus.SUCCEEDED:
                    self._seen_keys_left = True
                # Saved as each table ends, so a crash keeps them; the finish saves the last.
                if table is not unsettled[-1] and abort.reason is not AbortReason.LEASE_LOST:
                    self._save_results(run, totals, attempt, abort)
                kind = (result.error or {}).get("kind")
                if kind == "auth":
                    return decide_(totals, run_error=result.error), totals, attempt
                if kind == "rate_limited":
                    # The provider's budget is spent for every table: end the attempt here.
                    break
        except psycopg.Error as exc:  # deciding the complete passes
            logger.warning("database error before reading: %s", first_line(exc))
            error = {"kind": "database", "message": f"database error: {first_line(exc)}"}
            return decide_(totals, run_error=error), totals, attempt
        finally:
            try:
                connector.close()
            except Exception:
                logger.exception("connector close() failed")
        return decide_(totals, abort=abort.reason), totals, attempt

    def _complete_passes_due(
        self, run: ClaimedRun, tables: list[Table], checkpoints: RunCheckpoints
    ) -> set[str]:
        """The incremental tables to read whole in this run (their periodic complete pass is
        due, or an earlier attempt of the run began it), whose cursors are withheld."""
        periodic = [t for t in tables if t.mode is Mode.INCREMENTAL and t.complete_every]
        if not periodic:
            return set()
        with self._pool.connection() as conn:
            rows = conn.execute(
                QUERIES.last_complete_passes, {"connection_id": run.connection_id}
            ).fetchall()
        last = {r["table_name"]: r["last_full_sync_at"] for r in rows}
        now = datetime.now(UTC)
        due = set()
        for table in periodic:
            assert table.complete_every is not None
            slices = checkpoints.of(table.name)
            if slices:  # resumed: go on as the run began
                if any(s.resync for s in slices.values()):
                    due.add(table.name)
                continue
            when = last.get(table.name)
            if when is None or now - when >= table.complete_every:
                due.add(table.name)
        return due

    def _open_connector(
        self,
        run: ClaimedRun,
        abort: AbortSignal,
        budget: BudgetView,
        logger: logging.LoggerAdapter[logging.Logger],
        checkpoints: RunCheckpoints,
    ) -> tuple[Connector, RunContext]:
        try:
            cls, config, credentials = connector_inputs(
                run.provider, run.config, run.credentials, self._secrets
            )
        except ConnectorSetupError as exc:
            raise _StopAttempt(exc.error) from None
        assert run.connection_id is not None
        cursors = dict(run.cursors or {})
        context = RunContext(
            run=run,
            connector_class=cls,
            config=config,
            credentials=credentials,
            cursors=cursors,
            abort=abort,
            budget=budget,
            pool=self._pool,
            secrets=self._secrets,
            settings=self._settings,
            logger=logger,
            checkpoints=checkpoints,
            cache=HttpCache(self._pool, run.lease, run.connection_id),
        )
        try:
            return cls(context), context
        except ConnectorError as exc:
            raise _StopAttempt({"kind": exc.kind, "message": exc.message}) from None
        except Exception as exc:
            logger.exception("connector %s failed to start", run.provider)
            raise _StopAttempt(
                {"kind": "internal", "message": f"the connector failed to start: {_brief(exc)}"}
            ) from None

    def _sync_table(
        self,
        run: ClaimedRun,
        connector: Connector,
        table: Table,
        abort: AbortSignal,
        logger: logging.LoggerAdapter[logging.Logger],
        checkpoints: RunCheckpoints,
        progress: RunProgress,
        before: TableResult | None,
    ) -> TableResult:
        """Reads one table, slice by slice, and runs its tombstone pass once every slice is
        settled. Returns this attempt's result for it."""
        assert run.connection_id is not None
        slices = _SliceResults(before)
        names: list[str | None] | None = None
        try:
            with self._pool.connection() as conn:
                writer = RecordWriter(
                    conn,
                    run.lease,
                    run.connection_id,
                    table,
                    batch_size=self._settings.batch_size,
                    abort=abort,
                    progress=progress,
                )
                try:
                    partitions = connector.partitions(table)
                    listed: list[str | None] = (
                        [None] if partitions is None else list(dict.fromkeys(partitions))
                    )
                    names = listed
                    for round_ in (1, 2):
                        resumed = checkpoints.of(table.name).values()
                        if any(s.seen for s in resumed) and not seen_keys_intact(
                            conn, run.id, table.name
                        ):
                            self._restart_table(conn, run, table, checkpoints, progress, logger)
                        if self._read_slices(
                            connector, table, listed, writer, abort, logger, checkpoints, slices
                        ):
                            break  # stopped: another attempt goes on
                        if not self._tombstone(
                            conn,
                            run,
                            connector,
                            table,
                            listed,
                            abort,
                            logger,
                            checkpoints,
                            progress,
                            slices,
                            last_round=round_ == 2,
                        ):
                            break
                finally:
                    writer.close()  # no batch may still be writing when conn goes back
        except Exception as exc:
            status, error = self._failure(exc, abort, logger, table)
            slices.fail_table(status, error)
        return slices.result(names, checkpoints.of(table.name), progress.table_total(table.name))

    def _read_slices(
        self,
        connector: Connector,
        table: Table,
        names: list[str | None],
        writer: RecordWriter,
        abort: AbortSignal,
        logger: logging.LoggerAdapter[logging.Logger],
        checkpoints: RunCheckpoints,
        slices: _SliceResults,
    ) -> bool:
        """Reads every slice of the table that is not settled. True if the attempt must stop
        here (aborted, rate limited, credentials refused)."""
        for name in names:
            found = checkpoints.get(table.name, name)
            if (found is not None and found.done) or slices.failed_before(name):
                continue
            if found is not None and found.position is None:
                # The connector gave no position to resume from: the slice is read again from
                # its start, and what earlier attempts saw of it no longer counts.
                writer.forget(name)
                checkpoints.forget_slice(table.name, name)
                found = None
            if found is not None:
                logger.info(
                    "table %s%s resumes after page %d, where an earlier attempt left it",
                    table.name,
                    f" ({name})" if name else "",
                    found.pages,
                )
            writer.begin(name, found)
            try:
                read = (
                    connector.read(table) if name is None else connector.read_partition(table, name)
                )
                for item in read:
                    abort.check()
                    writer.write(item)
                abort.check()
                writer.end()
            except psycopg.Error:
                raise
            except Exception as exc:
                # Keep what was read before the stop or the failure, and where it got to.
                if not isinstance(exc, LeaseLost) and abort.reason is not AbortReason.LEASE_LOST:
                    self._flush_quietly(writer, logger)
                status, error = self._failure(exc, abort, logger, table, name)
                slices.add(name, TableResult(status, *_counts(writer), error=error))
                if (
                    name is None
                    or isinstance(exc, Aborted | LeaseLost)
                    or (error or {}).get("kind") in ("rate_limited", "auth")
                ):
                    return True
                continue
            checkpoints.mark_done(table.name, name, resync=writer.resync)
            slices.add(name, TableResult(TableStatus.SUCCEEDED, *_counts(writer)))
        return False

    def _tombstone(
        self,
        conn: psycopg.Connection[DictRow],
        run: ClaimedRun,
        connector: Connector,
        table: Table,
        names: list[str | None],
        abort: AbortSignal,
        logger: logging.LoggerAdapter[logging.Logger],
        checkpoints: RunCheckpoints,
        progress: RunProgress,
        slices: _SliceResults,
        *,
        last_round: bool,
    ) -> bool:
        """The tombstone pass, once every slice is done or failed for good: over the slices
        read whole (None: the whole table). True if the table must be read again (its seen keys
        were lost while it was read)."""
        done = {n: c for n in names if (c := checkpoints.get(table.name, n)) and c.done}
        if len(done) + sum(slices.failed(n) for n in names) < len(names):
            return False  # a slice waits for another attempt: tombstone nothing yet
        whole = [n or "" for n, c in done.items() if c.resync]
        if not whole:
            return False
        if not seen_keys_intact(conn, run.id, table.name):
            if last_round:
                raise RetryableError(
                    f"the keys table {table.name!r} saw were lost twice in one attempt (Postgres "
                    "restarted?); it is read again in the next attempt"
                )
            self._restart_table(conn, run, table, checkpoints, progress, logger)
            return True
        confirm = None
        if table.shifting:

            def confirm(partition: str | None, missing: Any) -> Any:
                return connector.confirm_deleted(table, partition, missing)

        assert run.connection_id is not None
        gone = TombstonePass(conn, run.lease, run.connection_id, table, abort).run(
            None if len(whole) == len(names) else whole, confirm=confirm
        )
        slices.tombstoned(gone)
        return False

    def _restart_table(
        self,
        conn: psycopg.Connection[DictRow],
        run: ClaimedRun,
        table: Table,
        checkpoints: RunCheckpoints,
        progress: RunProgress,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        logger.warning(
            "the keys seen in table %s were lost (a crash restart of Postgres empties the "
            "unlogged run_seen_keys): reading the table again from its start",
            table.name,
        )
        fenced_one(
            conn,
            QUERIES.reset_table_checkpoints,
            {
                "run_id": run.id,
                "lease_owner": run.lease_owner,
                "table_name": table.name,
                "partition": None,
            },
        )
        checkpoints.forget(table.name)
        progress.forget_table(table.name)

    def _failure(
        self,
        exc: BaseException,
        abort: AbortSignal,
        logger: logging.LoggerAdapter[logging.Logger],
        table: Table,
        partition: str | None = None,
    ) -> tuple[TableStatus, dict[str, Any] | None]:
        """What an exception that ended a table (or one of its partitions) means for it."""
        status: TableStatus
        error: dict[str, Any] | None
        if isinstance(exc, Aborted | LeaseLost):
            if isinstance(exc, LeaseLost):
                logger.warning("lease lost while writing table %s: stopping", table.name)
                abort.trip(AbortReason.LEASE_LOST)
            status = {
                AbortReason.CANCELLED: TableStatus.CANCELLED,
                AbortReason.TIMEOUT: TableStatus.RETRY,
            }.get(abort.reason or AbortReason.LEASE_LOST, TableStatus.PENDING)
            error = None
        elif isinstance(exc, RateLimited):
            status = TableStatus.RETRY
            error = {"kind": exc.kind, "message": exc.message, "retry_after": exc.retry_after}
        elif isinstance(exc, RetryableError):
            status, error = TableStatus.RETRY, {"kind": exc.kind, "message": exc.message}
        elif isinstance(exc, ConnectorError):  # permanent, auth, bad records
            status, error = TableStatus.FAILED, {"kind": exc.kind, "message": exc.message}
            if isinstance(exc, AuthError):
                logger.warning("credentials refused: %s", exc.message)
        elif isinstance(exc, psycopg.DataError):
            status = TableStatus.FAILED
            error = {"kind": "record", "message": f"Postgres rejected a record: {first_line(exc)}"}
        elif isinstance(exc, psycopg.Error):
            logger.warning("database error in table %s: %s", table.name, first_line(exc))
            status = TableStatus.RETRY
            error = {"kind": "database", "message": f"database error: {first_line(exc)}"}
        else:
            logger.exception("connector raised an unexpected error in table %s", table.name)
            status = TableStatus.RETRY
            error = {"kind": "internal", "message": f"unexpected error: {_brief(exc)}"}
        if error is not None:
            if partition is not None:
                error = {**error, "message": f"{partition}: {error['message']}"}
                error["partition"] = partition
            error = redact.redact_json(error)
        return status, error

    @staticmethod
    def _flush_quietly(writer: RecordWriter, logger: logging.LoggerAdapter[logging.Logger]) -> None:
        try:
            writer.flush(check_abort=False)
        except Exception as exc:
            logger.warning("could not write the records read before the stop: %s", _brief(exc))

    # -- purge -----------------------------------------------------------------------------

    def _purge(
        self, run: ClaimedRun, abort: AbortSignal, logger: logging.LoggerAdapter[logging.Logger]
    ) -> tuple[Outcome, dict[str, TableResult], int | None]:
        results: dict[str, TableResult] = {}
        processed = run.processed_units
        if run.connection_id is None:  # removed by an earlier attempt that died before finishing
            return Outcome(Action.FINISH, "succeeded"), results, processed
        params = {
            "run_id": run.id,
            "lease_owner": run.lease_owner,
            "connection_id": run.connection_id,
        }
        try:
            with self._pool.connection() as conn:
                while True:
                    abort.check()
                    row = conn.execute(
                        QUERIES.purge_records_batch,
                        {
                            **params,
                            "limit": self._settings.purge_batch_size,
                            "processed_units": processed,
                        },
                    ).fetchone()
                    if not row or not row["fenced"]:
                        raise LeaseLost()
                    processed += row["deleted"]
                    if row["deleted"] < self._settings.purge_batch_size:
                        break
                abort.check()
                row = conn.execute(QUERIES.purge_connection_row, params).fetchone()
                if not row or not row["fenced"]:
                    raise LeaseLost()
            logger.info("purged %d records and the connection row", processed)
            return Outcome(Action.FINISH, "succeeded"), results, processed
        except (Aborted, LeaseLost) as exc:
            if isinstance(exc, LeaseLost):
                abort.trip(AbortReason.LEASE_LOST)
            # A purge is never cancelled; any other abort hands it back or retries it.
            reason = abort.reason
            if reason is AbortReason.CANCELLED:
                reason = None
            return self._decider(run)(results, abort=reason), results, processed
        except psycopg.Error as exc:
            logger.warning("database error while purging: %s", first_line(exc))
            error = {"kind": "database", "message": f"database error: {first_line(exc)}"}
            return self._decider(run)(results, run_error=error), results, processed

    # -- effects ---------------------------------------------------------------------------

    def _decider(self, run: ClaimedRun) -> Any:
        s = self._settings

        def decide_for_run(
            results: dict[str, TableResult],
            *,
            abort: AbortReason | None = None,
            run_error: dict[str, Any] | None = None,
        ) -> Outcome:
            now = datetime.now(UTC)
            return decide(
                results,
                attempts=run.attempts,
                max_attempts=run.max_attempts,
                abort=abort,
                run_error=run_error,
                schedule=s.backoff_seconds,
                jitter=s.backoff_jitter,
                waiting=Waiting(
                    waiting_for=f"the {run.provider} rate limit",
                    started_at=run.started_at or now,
                    waits=run.waits,
                    now=now,
                    deadline=timedelta(seconds=s.run_deadline),
                )
                if run.kind == "sync"
                else None,
            )

        return decide_for_run

    def _apply(
        self,
        run: ClaimedRun,
        outcome: Outcome,
        results: dict[str, TableResult],
        attempt_results: dict[str, TableResult],
        processed: int | None,
        logger: logging.LoggerAdapter[logging.Logger],
        *,
        claim_next: bool,
    ) -> ClaimedRun | None:
        if outcome.action is Action.STOP:
            logger.warning("stopped: the lease was lost, so this attempt writes nothing more")
            return None
        sealed_results = {name: r.to_json() for name, r in results.items()}
        own_results = {name: r.to_json() for name, r in attempt_results.items()}
        if outcome.action is Action.FINISH and outcome.status == "failed":
            for value in (*sealed_results.values(), *own_results.values()):
                if value["status"] == TableStatus.RETRY.value:
                    value["status"] = TableStatus.FAILED.value
        params = {
            "run_id": run.id,
            "lease_owner": run.lease_owner,
            "results": Jsonb(sealed_results),
            "attempt_results": Jsonb(own_results),
            "error": Jsonb(outcome.error) if outcome.error else None,
        }

        claimed: list[ClaimedRun] = []

        def write(fold: bool) -> str | None:
            with self._pool.connection() as conn:
                if outcome.action is Action.HAND_BACK:
                    row = conn.execute(QUERIES.hand_back_run, params).fetchone()
                    return "queued" if row and row["moved"] else None
                if outcome.action is Action.REQUEUE:
                    row = conn.execute(
                        QUERIES.requeue_run, {**params, "delay_seconds": outcome.delay}
                    ).fetchone()
                    return row["status"] if row else None
                if outcome.action is Action.WAIT:
                    row = conn.execute(
                        QUERIES.wait_for_rate_limit,
                        {
                            **params,
                            "delay_seconds": outcome.delay,
                            "waiting_for": outcome.waiting_for,
                        },
                    ).fetchone()
                    return row["status"] if row else None
                finish = {
                    **params,
                    "status": outcome.status,
                    "processed_units": processed,
                    "disconnect": (outcome.error or {}).get("kind") == "auth",
                }
                # The finish writes the run's totals on the attempt's history row too; the
                # attempt's own counts follow in the same round trip.
                with conn.pipeline():
                    if fold:
                        finish.update(
                            worker_id=self._worker_id,
                            lease=timedelta(seconds=self._settings.lease_seconds),
                            providers=self._providers,
                        )
                        cursor = conn.execute(QUERIES.finish_and_claim, finish)
                    else:
                        cursor = conn.execute(QUERIES.finish_run, finish)
                    conn.execute(QUERIES.record_attempt_results, params)
                row = cursor.fetchone()
                if fold and row is not None and row["id"] is not None:
                    claimed.append(ClaimedRun.from_row(row))
                return outcome.status if row and row["sealed"] else None

        for attempt in Retrying(
            retry=retry_if_exception_type(psycopg.OperationalError),
            stop=stop_after_delay(self._settings.lease_seconds * 0.8),
            wait=wait_random_exponential(multiplier=0.5, max=5),
            reraise=True,
        ):
            with attempt:
                # A retry never claims: if the first try committed and only its answer was
                # lost, a second claim would strand the first claimed run until its lease ends.
                ended = write(claim_next and attempt.retry_state.attempt_number == 1)
        if ended is None:
            logger.warning("the lease was lost before the run could be %s", outcome.action.value)
        elif outcome.action is Action.REQUEUE and ended == "queued":
            logger.info("requeued to retry in %.1f s: %s", outcome.delay or 0, outcome.error)
        elif outcome.action is Action.WAIT and ended == "queued":
            logger.info("waiting %.0f s for %s", outcome.delay or 0, outcome.waiting_for)
        else:
            logger.info("run ended %s", ended)
        return claimed[0] if claimed else None

    def _save_results(
        self,
        run: ClaimedRun,
        results: dict[str, TableResult],
        attempt_results: dict[str, TableResult],
        abort: AbortSignal,
    ) -> None:
        try:
            with self._pool.connection() as conn:
                row = conn.execute(
                    QUERIES.save_results,
                    {
                        "run_id": run.id,
                        "lease_owner": run.lease_owner,
                        "results": Jsonb({n: r.to_json() for n, r in results.items()}),
                        "attempt_results": Jsonb(
                            {n: r.to_json() for n, r in attempt_results.items()}
                        ),
                    },
                ).fetchone()
        except psycopg.Error:
            return  # the finish writes them again
        if row is None:
            abort.trip(AbortReason.LEASE_LOST)

    def _clear_seen_keys(
        self, run: ClaimedRun, logger: logging.LoggerAdapter[logging.Logger]
    ) -> None:
        try:
            with self._pool.connection() as conn:
                conn.execute(QUERIES.clear_seen_keys, {"run_id": run.id})
        except psycopg.Error as exc:  # the sweep stage collects them later
            logger.warning("could not clear seen keys: %s", first_line(exc))


class _SliceResults:
    """This attempt's results for the slices of one table (keyed '' for a table read whole),
    beside what earlier attempts of the run left."""

    def __init__(self, before: TableResult | None) -> None:
        self._before = dict((before.partitions or {}) if before else {})
        # A table an operator's retry made pending again reads its failed partitions again.
        self._retried = before is None or before.status is TableStatus.PENDING
        self._parts: dict[str, TableResult] = {}
        self._failure: tuple[TableStatus, dict[str, Any] | None] | None = None

    def failed_before(self, name: str | None) -> bool:
        """A partition an earlier attempt gave up for good is not read again."""
        prior = self._before.get(name or "")
        return (
            name is not None
            and not self._retried
            and prior is not None
            and prior.status is TableStatus.FAILED
        )

    def failed(self, name: str | None) -> bool:
        now = self._parts.get(name or "")
        return self.failed_before(name) or (now is not None and now.status is TableStatus.FAILED)

    def add(self, name: str | None, result: TableResult) -> None:
        self._parts[name or ""] = result

    def tombstoned(self, gone: Mapping[str, int]) -> None:
        for name, n in gone.items():
            part = self._parts.setdefault(name, TableResult(TableStatus.SUCCEEDED))
            part.tombstoned += n

    def fail_table(self, status: TableStatus, error: dict[str, Any] | None) -> None:
        self._failure = (status, error)

    def result(
        self, names: list[str | None] | None, slices: Mapping[str, Any], total: int | None
    ) -> TableResult:
        counts = (
            sum(p.upserted for p in self._parts.values()),
            sum(p.unchanged for p in self._parts.values()),
            sum(p.tombstoned for p in self._parts.values()),
        )
        partitioned = names != [None] and (names is not None or bool(self._before))
        if not partitioned:
            whole = self._parts.get("")
            status, error = (
                self._failure
                if self._failure
                else (whole.status, whole.error)
                if whole
                else (TableStatus.SUCCEEDED, None)
            )
            return TableResult(status, *counts, error, total)
        latest: dict[str, TableResult] = {}
        for name in [n or "" for n in names or []] or list(self._before):
            found = self._parts.get(name) or self._before.get(name)
            done = name in slices and slices[name].done
            latest[name] = found or TableResult(
                TableStatus.SUCCEEDED if done else TableStatus.PENDING
            )
        failing = [(n, r) for n, r in latest.items() if r.error]
        if self._failure:
            status, error = self._failure
        else:
            status = table_status(latest) if latest else TableStatus.SUCCEEDED
            error = None
            if failing and status is not TableStatus.SUCCEEDED:
                error = dict(failing[0][1].error or {})
                if status is TableStatus.PARTIAL:
                    gave_up = [n for n, r in latest.items() if r.status is TableStatus.FAILED]
                    error["message"] = (
                        f"{len(gave_up)} of {len(latest)} partitions failed "
                        f"({', '.join(gave_up)}); first: {error.get('message', '')}"
                    )
        return TableResult(status, *counts, error, total, dict(self._parts))


def _counts(writer: RecordWriter) -> tuple[int, int, int]:
    return writer.counts.upserted, writer.counts.unchanged, writer.counts.tombstoned


def _span_error(outcome: Outcome | None) -> str:
    if outcome is None:
        return "the attempt raised"
    return str((outcome.error or {}).get("message") or outcome_label(outcome))


def _brief(exc: BaseException) -> str:
    text = first_line(exc)
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text
