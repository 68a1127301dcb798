"""The purge of a deleted connection: its records in bounded fenced batches, then its table
state and its row. A purge is never cancelled; any other stop hands it back or retries it."""

from __future__ import annotations

import psycopg

from connectors.errors import Aborted
from sync.base.abort import AbortReason, AbortSignal
from sync.errors import LeaseLost
from sync.jobs.outcome import Action, Decider, Outcome, TableResult, database_error
from sync.runs.log import Logger
from sync.store import ClaimedRun, RunStore
from sync.store.db import first_line
from sync.vocabulary import RunStatus


def purge(
    run: ClaimedRun,
    store: RunStore,
    batch_size: int,
    abort: AbortSignal,
    logger: Logger,
    decide: Decider,
) -> tuple[Outcome, dict[str, TableResult], int | None]:
    """Returns the outcome, the (empty) results and the records deleted so far."""
    results: dict[str, TableResult] = {}
    processed = run.processed_units
    if run.connection_id is None:  # removed by an earlier attempt that died before finishing
        return Outcome(Action.FINISH, RunStatus.SUCCEEDED), results, processed
    try:
        while True:
            abort.check()
            deleted = store.purge_records_batch(
                run.lease, run.connection_id, limit=batch_size, processed_units=processed
            )
            processed += deleted
            if deleted < batch_size:
                break
        abort.check()
        store.purge_connection_row(run.lease, run.connection_id)
        logger.info("purged %d records and the connection row", processed)
        return Outcome(Action.FINISH, RunStatus.SUCCEEDED), results, processed
    except (Aborted, LeaseLost) as exc:
        if isinstance(exc, LeaseLost):
            abort.trip(AbortReason.LEASE_LOST)
        # A purge is never cancelled; any other abort hands it back or retries it.
        reason = abort.reason
        if reason is AbortReason.CANCELLED:
            reason = None
        return decide(results, abort=reason), results, processed
    except psycopg.Error as exc:
        logger.warning("database error while purging: %s", first_line(exc))
        return decide(results, run_error=database_error(exc)), results, processed
