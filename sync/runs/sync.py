"""The sync of one claimed run: each table of the connector read slice by slice (the table, or
one partition of it) into the record writer, then its tombstone pass once every slice is
settled. A sync resumes where earlier attempts of the same run left it (``sync.runs.checkpoints``):
tables they settled are not read again, and every slice that is not done resumes at its last
committed position. Results are kept twice: the run's row holds the totals of every attempt,
each attempt's history row its own counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import psycopg

from connectors.base import Connector, Table
from connectors.errors import Aborted, AuthError, ConnectorError, RetryableError
from connectors.registry import plugins
from sync.base import redact, tracing
from sync.base.abort import AbortReason, AbortSignal
from sync.base.secrets import SecretBox
from sync.base.settings import Settings
from sync.errors import LeaseLost
from sync.jobs.budgets import BudgetView
from sync.jobs.connectors import ConnectorSetupError, connector_inputs
from sync.jobs.declared import DeclaredProviders
from sync.jobs.log import Logger
from sync.jobs.outcome import database_error
from sync.runs.checkpoints import RunCheckpoints
from sync.runs.context import RunContext
from sync.runs.decide import AttemptReport, TableResult, merged
from sync.runs.http_cache import HttpCache
from sync.runs.outcome import Outcomes
from sync.runs.progress import RunProgress
from sync.runs.records import RecordWriter
from sync.runs.slices import SliceResults, slices_due
from sync.runs.tombstones import TombstonePass, partitions_gone
from sync.runs.typed import TableViews
from sync.store import ClaimedRun, CompletePasses, RunStore, TableWrites
from sync.store.db import Connection, first_line
from sync.store.typed import TypedStore
from sync.vocabulary import SETTLED, ConnectionStatus, ErrorKind, JobError, TableStatus


class _StopAttempt(Exception):
    """The attempt cannot go on (unusable config or credentials, refused credentials)."""

    def __init__(self, error: JobError) -> None:
        super().__init__(error.message)
        self.error = error


class SyncJob:
    """Reads a claimed sync's tables; ``run()`` says what the attempt gave."""

    def __init__(
        self, store: RunStore, outcomes: Outcomes, settings: Settings, secrets: SecretBox | None
    ) -> None:
        self._store = store
        self._outcomes = outcomes
        self._settings = settings
        self._secrets = secrets
        self._declared = DeclaredProviders(store.pool)
        self._typed = TypedStore(store.pool, retry=store.retry_policy)
        self._views_built: set[tuple[int, str]] = set()

    def run(self, run: ClaimedRun, abort: AbortSignal, logger: Logger) -> AttemptReport:
        before = {name: TableResult.from_json(r) for name, r in (run.results or {}).items()}
        totals = dict(before)
        budget = BudgetView()
        done = AttemptReport(totals, waits_slept=budget.waits_slept)
        if run.connection_status != ConnectionStatus.ACTIVE:
            state = run.connection_status or "gone"
            done.abort = AbortReason.CANCELLED
            done.error = JobError(ErrorKind.CANCELLED, f"the connection is {state}")
            return done
        # Only a run that has written before has checkpoints to resume from.
        checkpoints = RunCheckpoints()
        if run.processed_units > 0:
            checkpoints = RunCheckpoints(self._store.checkpoints(run.id))
        try:
            connector, context = self._open_connector(run, abort, budget, logger, checkpoints)
        except _StopAttempt as stop:
            done.error = stop.error
            return done
        self._read_tables(run, connector, context, abort, logger, checkpoints, before, done)
        if done.error is None:
            done.abort = abort.reason
        return done

    def _read_tables(
        self,
        run: ClaimedRun,
        connector: Connector,
        context: RunContext,
        abort: AbortSignal,
        logger: Logger,
        checkpoints: RunCheckpoints,
        before: dict[str, TableResult],
        done: AttemptReport,
    ) -> None:
        """Reads every table an earlier attempt did not settle, into ``done``; stops at a
        refusal of the credentials or a rate limit, which every other table would meet too."""
        totals, attempt = done.results, done.own
        for table in connector.tables:
            totals.setdefault(table.name, TableResult())
        # Tables settled by an earlier attempt are not read again.
        unsettled = [t for t in connector.tables if totals[t.name].status not in SETTLED]
        progress = RunProgress([t.name for t in connector.tables], checkpoints)
        try:
            passes = self._last_complete_passes(run, unsettled)
            now = self._store.now()
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
                    context,
                    table,
                    abort,
                    logger,
                    checkpoints,
                    progress,
                    before.get(table.name),
                    self._passes_due(run, table, passes, checkpoints, now),
                )
                tracing.end(
                    table_span,
                    {
                        "connector_sync.status": result.status.value,
                        "connector_sync.upserted": result.upserted,
                        "connector_sync.unchanged": result.unchanged,
                        "connector_sync.tombstoned": result.tombstoned,
                    },
                    error=result.error.message if result.error else None,
                )
                logger.info("table %s %s %s", table.name, result.status.value, result.to_json())
                if table.files and result.status in (TableStatus.SUCCEEDED, TableStatus.PARTIAL):
                    self._queue_files(run, table, logger)
                attempt[table.name] = result
                totals[table.name] = merged(before.get(table.name), result)
                if result.status is not TableStatus.SUCCEEDED:
                    done.seen_keys_left = True
                # Saved as each table ends, so a crash keeps them; the finish saves the last.
                if table is not unsettled[-1] and abort.reason is not AbortReason.LEASE_LOST:
                    self._outcomes.save_results(run, totals, attempt, abort)
                kind = result.error.kind if result.error else None
                if kind is ErrorKind.AUTH:
                    done.error = result.error
                    return
                if kind is ErrorKind.RATE_LIMITED:
                    # The provider's budget is spent for every table: end the attempt here.
                    break
        except psycopg.Error as exc:  # reading when the complete passes were
            logger.warning("database error before reading: %s", first_line(exc))
            done.error = database_error(exc)
        finally:
            try:
                connector.close()
            except Exception:
                logger.exception("connector close() failed")

    def _queue_files(self, run: ClaimedRun, table: Table, logger: Logger) -> None:
        """New and changed files are queued for ingestion; deleted ones dropped. A database
        error is logged, not raised: the table's records are written, and the next sync of the
        table queues what this one could not (the statement compares every live file with what
        was queued)."""
        assert run.connection_id is not None
        try:
            done = self._store.queue_file_ingestions(
                run.lease, run.connection_id, table.name, run.max_attempts
            )
        except psycopg.Error as exc:
            logger.warning(
                "could not queue the ingestions of table %s: %s; the next sync queues them",
                table.name,
                first_line(exc),
            )
            return
        if done.queued or done.deleted:
            logger.info(
                "table %s: %d file(s) queued for ingestion, %d document(s) of deleted files "
                "removed",
                table.name,
                done.queued,
                done.deleted,
            )

    def _last_complete_passes(
        self, run: ClaimedRun, tables: list[Table]
    ) -> dict[str, CompletePasses] | None:
        """When the connection's tables were last read completely; None when no table to read
        has a periodic complete pass (an operator's ``complete_every``)."""
        if not any(self._complete_every(run, t) for t in tables):
            return None
        assert run.connection_id is not None
        return self._store.last_complete_passes(run.connection_id)

    def _passes_due(
        self,
        run: ClaimedRun,
        table: Table,
        passes: dict[str, CompletePasses] | None,
        checkpoints: RunCheckpoints,
        now: datetime,
    ) -> Callable[[list[str]], set[str]] | None:
        """Which slices of an incremental ``table`` whose deletions only a complete listing
        shows are read completely in this run, once its partitions are known: every slice at
        every sync, unless an operator set a ``complete_every`` for the table; None for a
        table whose cursor is always given."""
        if not table.listed_whole_for_deletions:
            return None
        every = self._complete_every(run, table)
        if every is None:
            return set
        assert passes is not None
        return partial(
            slices_due,
            every=every,
            last=passes.get(table.name, CompletePasses(None, {})),
            began=checkpoints.of(table.name),
            now=now,
        )

    def _complete_every(self, run: ClaimedRun, table: Table) -> timedelta | None:
        if not table.listed_whole_for_deletions:
            return None
        return self._settings.complete_every_of(run.provider, table.name)

    def _open_connector(
        self,
        run: ClaimedRun,
        abort: AbortSignal,
        budget: BudgetView,
        logger: Logger,
        checkpoints: RunCheckpoints,
    ) -> tuple[Connector, RunContext]:
        try:
            pinned = None
            if run.provider not in plugins():  # declared: the version it started on
                pinned = self._declared.pinned(run.lease, run.provider)
            cls, config, credentials = connector_inputs(
                run.provider, run.config, run.credentials, self._secrets, pinned
            )
        except ConnectorSetupError as exc:
            raise _StopAttempt(exc.error) from None
        except ConnectorError as exc:
            raise _StopAttempt(JobError.of(exc)) from None
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
            store=self._store,
            secrets=self._secrets,
            settings=self._settings,
            logger=logger,
            checkpoints=checkpoints,
            cache=HttpCache(self._store, run.lease, run.connection_id),
        )
        try:
            return cls(context), context
        except ConnectorError as exc:
            raise _StopAttempt(JobError.of(exc)) from None
        except Exception as exc:
            logger.exception("connector %s failed to start", run.provider)
            raise _StopAttempt(
                JobError(ErrorKind.INTERNAL, f"the connector failed to start: {_brief(exc)}")
            ) from None

    def _sync_table(
        self,
        run: ClaimedRun,
        connector: Connector,
        context: RunContext,
        table: Table,
        abort: AbortSignal,
        logger: Logger,
        checkpoints: RunCheckpoints,
        progress: RunProgress,
        before: TableResult | None,
        due: Callable[[list[str]], set[str]] | None,
    ) -> TableResult:
        """Reads one table, slice by slice, and runs its tombstone pass once every slice is
        settled. ``due`` says which of its slices are due their periodic complete pass (their
        cursors are withheld). Returns this attempt's result for it."""
        assert run.connection_id is not None
        slices = SliceResults(before)
        names: list[str | None] | None = None
        views = TableViews(
            self._typed,
            run.lease,
            run.connection_id,
            table,
            logger,
            schema_prefix=self._settings.reader_schema_prefix,
            built=self._views_built,
        )
        try:
            with self._store.pool.connection() as conn:
                writer = RecordWriter(
                    conn,
                    run.lease,
                    run.connection_id,
                    table,
                    batch_size=self._settings.batch_size,
                    abort=abort,
                    progress=progress,
                    observer=views,
                )
                try:
                    partitions = connector.partitions(table)
                    listed: list[str | None] = (
                        [None] if partitions is None else list(dict.fromkeys(partitions))
                    )
                    names = listed
                    if due is not None:
                        context.withhold(table.name, due([n or "" for n in listed]))
                    for round_ in (1, 2):
                        resumed = checkpoints.of(table.name).values()
                        if any(s.seen for s in resumed) and not _seen_keys_intact(conn, run, table):
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
                            all_seen=writer.found_empty,
                        ):
                            break
                finally:
                    writer.close()  # no batch may still be writing when conn goes back
            if not abort.is_set:
                views.finish()
        except Exception as exc:
            status, error = self._failure(exc, abort, logger, table)
            slices.fail_table(status, error)
        result = slices.result(
            names,
            checkpoints.of(table.name),
            progress.table_total(table.name),
            progress.table_total_estimated(table.name),
        )
        return replace(result, warnings=tuple(views.warnings)) if views.warnings else result

    def _read_slices(
        self,
        connector: Connector,
        table: Table,
        names: list[str | None],
        writer: RecordWriter,
        abort: AbortSignal,
        logger: Logger,
        checkpoints: RunCheckpoints,
        slices: SliceResults,
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
                    or (error is not None and error.kind in _ENDS_ATTEMPT)
                ):
                    return True
                continue
            checkpoints.mark_done(table.name, name, resync=writer.resync)
            slices.add(name, TableResult(TableStatus.SUCCEEDED, *_counts(writer)))
        return False

    def _tombstone(
        self,
        conn: Connection,
        run: ClaimedRun,
        connector: Connector,
        table: Table,
        names: list[str | None],
        abort: AbortSignal,
        logger: Logger,
        checkpoints: RunCheckpoints,
        progress: RunProgress,
        slices: SliceResults,
        *,
        last_round: bool,
        all_seen: bool,
    ) -> bool:
        """The tombstone pass, once every slice is done or failed for good: over the slices
        read whole (None: the whole table). True if the table must be read again (its seen keys
        were lost while it was read). ``all_seen``: this attempt wrote every row the table
        holds, so the pass has nothing to look for."""
        done = {n: c for n in names if (c := checkpoints.get(table.name, n)) and c.done}
        if len(done) + sum(slices.failed(n) for n in names) < len(names):
            return False  # a slice waits for another attempt: tombstone nothing yet
        assert run.connection_id is not None
        tombstones = TombstonePass(
            conn, run.lease, run.connection_id, table, abort, step=self._settings.tombstone_step
        )
        if names != [None]:
            self._settle_partitions(conn, run, table, names, tombstones, slices, logger)
        whole = [n or "" for n, c in done.items() if c.resync]
        if not whole:
            return False
        confirm = None
        if table.shifting:

            def confirm(partition: str | None, missing: Any) -> Any:
                return connector.confirm_deleted(table, partition, missing)

        gone = tombstones.run(
            whole, every_partition=len(whole) == len(names), confirm=confirm, all_seen=all_seen
        )
        if gone is None:  # the seen keys were lost: nothing was tombstoned
            if last_round:
                raise RetryableError(
                    f"the keys table {table.name!r} saw were lost twice in one attempt (Postgres "
                    "restarted?); it is read again in the next attempt"
                )
            self._restart_table(conn, run, table, checkpoints, progress, logger)
            return True
        slices.tombstoned(gone)
        return False

    @staticmethod
    def _settle_partitions(
        conn: Connection,
        run: ClaimedRun,
        table: Table,
        names: list[str | None],
        tombstones: TombstonePass,
        slices: SliceResults,
        logger: Logger,
    ) -> None:
        """Tombstones the rows of the partitions that are gone (no longer listed, or answering
        404 at a second sync in a row), then saves this run's listing."""
        assert run.connection_id is not None
        writes = TableWrites(conn, run.lease, run.connection_id, table.name)
        saved, absent_before = writes.partitions()
        listed = [n for n in names if n is not None]
        found = partitions_gone(saved, absent_before, listed, slices.absent(listed), run.id)
        if found.gone:
            logger.warning(
                "table %s: partitions %s are gone (no longer listed, or 404 at two syncs in a "
                "row): tombstoning their rows",
                table.name,
                ", ".join(found.gone),
            )
            slices.gone(found.gone, tombstones.tombstone_partitions(found.gone))
        if found.changed:
            writes.save_partitions(listed, found.absent, found.gone)

    def _restart_table(
        self,
        conn: Connection,
        run: ClaimedRun,
        table: Table,
        checkpoints: RunCheckpoints,
        progress: RunProgress,
        logger: Logger,
    ) -> None:
        logger.warning(
            "the keys seen in table %s were lost (a crash restart of Postgres empties the "
            "unlogged run_seen_keys): reading the table again from its start",
            table.name,
        )
        assert run.connection_id is not None
        TableWrites(conn, run.lease, run.connection_id, table.name).reset_checkpoints(None)
        checkpoints.forget(table.name)
        progress.forget_table(table.name)

    def _failure(
        self,
        exc: BaseException,
        abort: AbortSignal,
        logger: Logger,
        table: Table,
        partition: str | None = None,
    ) -> tuple[TableStatus, JobError | None]:
        """What an exception that ended a table (or one of its partitions) means for it."""
        status: TableStatus
        error: JobError | None
        if isinstance(exc, Aborted | LeaseLost):
            if isinstance(exc, LeaseLost):
                logger.warning("lease lost while writing table %s: stopping", table.name)
                abort.trip(AbortReason.LEASE_LOST)
            status = {
                AbortReason.CANCELLED: TableStatus.CANCELLED,
                AbortReason.TIMEOUT: TableStatus.RETRY,
            }.get(abort.reason or AbortReason.LEASE_LOST, TableStatus.PENDING)
            error = None
        elif isinstance(exc, RetryableError):  # rate limits too, with their retry_after
            status, error = TableStatus.RETRY, JobError.of(exc)
        elif isinstance(exc, ConnectorError):  # permanent, auth, bad records
            status, error = TableStatus.FAILED, JobError.of(exc)
            if isinstance(exc, AuthError):
                logger.warning("credentials refused: %s", exc.message)
        elif isinstance(exc, psycopg.Error):
            error = database_error(exc, what="a record")
            if error.is_retryable:
                logger.warning("database error in table %s: %s", table.name, first_line(exc))
            status = TableStatus.RETRY if error.is_retryable else TableStatus.FAILED
        else:
            logger.exception("connector raised an unexpected error in table %s", table.name)
            status = TableStatus.RETRY
            error = JobError(ErrorKind.INTERNAL, f"unexpected error: {_brief(exc)}")
        if error is not None:
            if partition is not None:
                error = replace(error, message=f"{partition}: {error.message}", partition=partition)
            error = error.with_message(redact.redact(error.message))
        return status, error

    @staticmethod
    def _flush_quietly(writer: RecordWriter, logger: Logger) -> None:
        try:
            writer.flush(check_abort=False)
        except Exception as exc:
            logger.warning("could not write the records read before the stop: %s", _brief(exc))


def _seen_keys_intact(conn: Connection, run: ClaimedRun, table: Table) -> bool:
    assert run.connection_id is not None
    return TableWrites(conn, run.lease, run.connection_id, table.name).seen_keys_intact()


# A table error of these kinds ends the attempt: every other table would meet it too.
_ENDS_ATTEMPT = frozenset({ErrorKind.RATE_LIMITED, ErrorKind.AUTH})


def _counts(writer: RecordWriter) -> tuple[int, int, int]:
    return writer.counts.upserted, writer.counts.unchanged, writer.counts.tombstoned


def _brief(exc: BaseException) -> str:
    text = first_line(exc)
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text
