"""The purge of a deleted connection: its records in bounded fenced batches, then the schema of
its typed views, its table state and its row. A purge is never cancelled; any other stop hands
it back or retries it."""

from __future__ import annotations

import psycopg

from connectors.errors import Aborted
from sync.base.abort import AbortReason, AbortSignal
from sync.errors import LeaseLost
from sync.jobs.log import Logger
from sync.jobs.outcome import database_error
from sync.runs.decide import AttemptReport
from sync.store import ClaimedRun, RunStore
from sync.store.db import first_line
from sync.store.typed import TypedStore


def purge(
    run: ClaimedRun,
    store: RunStore,
    batch_size: int,
    abort: AbortSignal,
    logger: Logger,
    typed: TypedStore | None = None,
) -> AttemptReport:
    """What the attempt gave: no table results, the records deleted so far."""
    processed = run.processed_units
    done = AttemptReport({}, processed=processed)
    if run.connection_id is None:  # removed by an earlier attempt that died before finishing
        return done
    try:
        while True:
            abort.check()
            deleted = store.purge_records_batch(
                run.lease, run.connection_id, limit=batch_size, processed_units=processed
            )
            processed += deleted
            done.processed = processed
            if deleted < batch_size:
                break
        abort.check()
        typed = typed or TypedStore(store.pool, retry=store.retry_policy)
        if not typed.drop_schema(run.lease, run.connection_id):
            raise LeaseLost()
        store.purge_connection_row(run.lease, run.connection_id)
        logger.info("purged %d records and the connection row", done.processed)
    except (Aborted, LeaseLost) as exc:
        if isinstance(exc, LeaseLost):
            abort.trip(AbortReason.LEASE_LOST)
        # A purge is never cancelled; any other abort hands it back or retries it.
        reason = abort.reason
        done.abort = None if reason is AbortReason.CANCELLED else reason
    except psycopg.Error as exc:
        logger.warning("database error while purging: %s", first_line(exc))
        done.error = database_error(exc)
    return done
