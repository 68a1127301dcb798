"""Executes one claimed run: a sync reads each table of the connector and writes its records; a
purge deletes a deleted connection's data in bounded batches. Every write is fenced by the
claim's lease owner. The decision about the run's fate is ``retry_policy.decide``; this module
gathers its inputs and applies its answer."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ValidationError
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

import connectors
from connectors.base import Connector, Table
from connectors.errors import (
    Aborted,
    AuthError,
    ConnectorError,
    PermanentError,
    RateLimited,
    RetryableError,
)
from sync import redact
from sync.abort import AbortSignal
from sync.db import Pool, first_line
from sync.errors import LeaseLost, SecretsError, describe_validation_error
from sync.lease import LeaseKeeper
from sync.queries import QUERIES
from sync.records import Lease, RecordWriter
from sync.retry_policy import AbortReason, Action, Outcome, TableResult, TableStatus, decide
from sync.secrets import SecretBox
from sync.settings import Settings

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
    ) -> None:
        self._run = run
        self._connector_class = connector_class
        self._config = config
        self._credentials = credentials
        self._cursors = cursors
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

    def cursor(self, table: str) -> Any | None:
        return self._cursors.get(table)

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
    ) -> None:
        self._providers = providers  # what the claim of the next run may take
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
        self._keeper.watch(run.lease, abort, budget=budget, logger=logger)
        logger.info("%s run started (attempt %d of %d)", run.kind, run.attempts, run.max_attempts)
        try:
            if run.kind == "purge":
                outcome, results, processed = self._purge(run, abort, logger)
            else:
                outcome, results = self._sync(run, abort, budget, logger)
                processed = None
            return self._apply(run, outcome, results, processed, logger, claim_next=claim_next)
        finally:
            self._keeper.release()
            self.current = None
            if self._seen_keys_left:  # a full table that did not complete left its keys
                self._clear_seen_keys(run, logger)

    # -- sync ------------------------------------------------------------------------------

    def _sync(
        self,
        run: ClaimedRun,
        abort: AbortSignal,
        budget: BudgetView,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> tuple[Outcome, dict[str, TableResult]]:
        results = {name: TableResult.from_json(r) for name, r in (run.results or {}).items()}
        decide_ = self._decider(run)
        if run.connection_status != "active":
            state = run.connection_status or "gone"
            error = {"kind": "cancelled", "message": f"the connection is {state}"}
            return Outcome(Action.FINISH, "cancelled", error=error), results
        try:
            connector = self._open_connector(run, abort, budget, logger)
        except _StopAttempt as stop:
            return decide_(results, run_error=stop.error), results
        for table in connector.tables:
            results.setdefault(table.name, TableResult())
        # Tables settled by an earlier attempt are not read again.
        unsettled = [
            t
            for t in connector.tables
            if results[t.name].status not in (TableStatus.SUCCEEDED, TableStatus.FAILED)
        ]
        try:
            for table in unsettled:
                if abort.is_set:
                    break
                result = self._sync_table(run, connector, table, abort, logger)
                results[table.name] = result
                if result.status is not TableStatus.SUCCEEDED:
                    self._seen_keys_left = True
                # Saved as each table ends, so a crash keeps them; the finish saves the last.
                if table is not unsettled[-1] and abort.reason is not AbortReason.LEASE_LOST:
                    self._save_results(run, results, abort)
                kind = (result.error or {}).get("kind")
                if kind == "auth":
                    return decide_(results, run_error=result.error), results
                if kind == "rate_limited":
                    # The provider's budget is spent for every table: end the attempt here.
                    break
        finally:
            try:
                connector.close()
            except Exception:
                logger.exception("connector close() failed")
        return decide_(results, abort=abort.reason), results

    def _open_connector(
        self,
        run: ClaimedRun,
        abort: AbortSignal,
        budget: BudgetView,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> Connector:
        try:
            cls = connectors.get(run.provider)
        except connectors.UnknownProvider as exc:
            raise _StopAttempt({"kind": "config", "message": str(exc)}) from None
        try:
            config = cls.config_model.model_validate(run.config or {})
        except ValidationError as exc:
            raise _StopAttempt(
                {"kind": "config", "message": describe_validation_error(exc)}
            ) from None
        credentials: dict[str, Any] = {}
        if run.credentials is not None:
            if self._secrets is None:
                raise _StopAttempt({"kind": "config", "message": "no secret key is configured"})
            try:
                credentials = self._secrets.decrypt(run.credentials)
            except SecretsError as exc:
                raise _StopAttempt({"kind": "config", "message": str(exc)}) from None
            redact.register(credentials)
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
        )
        try:
            return cls(context)
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
    ) -> TableResult:
        assert run.connection_id is not None
        writer: RecordWriter | None = None
        try:
            with self._pool.connection() as conn:
                writer = RecordWriter(
                    conn,
                    run.lease,
                    run.connection_id,
                    table,
                    batch_size=self._settings.batch_size,
                    abort=abort,
                )
                try:
                    for item in connector.read(table):
                        abort.check()
                        writer.write(item)
                    abort.check()
                    writer.complete()
                except (LeaseLost, psycopg.Error):
                    raise
                except BaseException:
                    # Keep what was read before the stop or the failure (nothing is tombstoned).
                    if abort.reason is not AbortReason.LEASE_LOST:
                        self._flush_quietly(writer, logger)
                    raise
                finally:
                    writer.close()  # no batch may still be writing when conn goes back
            status, error = TableStatus.SUCCEEDED, None
        except (Aborted, LeaseLost) as exc:
            if isinstance(exc, LeaseLost):
                logger.warning("lease lost while writing table %s: stopping", table.name)
                abort.trip(AbortReason.LEASE_LOST)
            status = {
                AbortReason.CANCELLED: TableStatus.CANCELLED,
                AbortReason.TIMEOUT: TableStatus.RETRY,
            }.get(abort.reason or AbortReason.LEASE_LOST, TableStatus.PENDING)
            error = None
        except RateLimited as exc:
            status = TableStatus.RETRY
            error = {"kind": exc.kind, "message": exc.message, "retry_after": exc.retry_after}
        except RetryableError as exc:
            status, error = TableStatus.RETRY, {"kind": exc.kind, "message": exc.message}
        except ConnectorError as exc:  # permanent, auth, bad records
            status, error = TableStatus.FAILED, {"kind": exc.kind, "message": exc.message}
            if isinstance(exc, AuthError):
                logger.warning("credentials refused: %s", exc.message)
        except psycopg.DataError as exc:
            status = TableStatus.FAILED
            error = {"kind": "record", "message": f"Postgres rejected a record: {first_line(exc)}"}
        except psycopg.Error as exc:
            logger.warning("database error in table %s: %s", table.name, first_line(exc))
            status = TableStatus.RETRY
            error = {"kind": "database", "message": f"database error: {first_line(exc)}"}
        except Exception as exc:
            logger.exception("connector raised an unexpected error in table %s", table.name)
            status = TableStatus.RETRY
            error = {"kind": "internal", "message": f"unexpected error: {_brief(exc)}"}
        if error is not None:
            error = redact.redact_json(error)
        counts = writer.counts if writer else None
        result = TableResult(
            status=status,
            upserted=counts.upserted if counts else 0,
            unchanged=counts.unchanged if counts else 0,
            tombstoned=counts.tombstoned if counts else 0,
            error=error,
        )
        logger.info("table %s %s %s", table.name, status.value, result.to_json())
        return result

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
            return decide(
                results,
                attempts=run.attempts,
                max_attempts=run.max_attempts,
                abort=abort,
                run_error=run_error,
                schedule=s.backoff_seconds,
                jitter=s.backoff_jitter,
            )

        return decide_for_run

    def _apply(
        self,
        run: ClaimedRun,
        outcome: Outcome,
        results: dict[str, TableResult],
        processed: int | None,
        logger: logging.LoggerAdapter[logging.Logger],
        *,
        claim_next: bool,
    ) -> ClaimedRun | None:
        if outcome.action is Action.STOP:
            logger.warning("stopped: the lease was lost, so this attempt writes nothing more")
            return None
        sealed_results = {name: r.to_json() for name, r in results.items()}
        if outcome.action is Action.FINISH and outcome.status == "failed":
            for value in sealed_results.values():
                if value["status"] == TableStatus.RETRY.value:
                    value["status"] = TableStatus.FAILED.value
        params = {
            "run_id": run.id,
            "lease_owner": run.lease_owner,
            "results": Jsonb(sealed_results),
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
                finish = {
                    **params,
                    "status": outcome.status,
                    "processed_units": processed,
                    "disconnect": (outcome.error or {}).get("kind") == "auth",
                }
                if fold:
                    finish.update(
                        worker_id=self._worker_id,
                        lease=timedelta(seconds=self._settings.lease_seconds),
                        providers=self._providers,
                    )
                    row = conn.execute(QUERIES.finish_and_claim, finish).fetchone()
                    if row is not None and row["id"] is not None:
                        claimed.append(ClaimedRun.from_row(row))
                else:
                    row = conn.execute(QUERIES.finish_run, finish).fetchone()
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
        else:
            logger.info("run ended %s", ended)
        return claimed[0] if claimed else None

    def _save_results(
        self, run: ClaimedRun, results: dict[str, TableResult], abort: AbortSignal
    ) -> None:
        try:
            with self._pool.connection() as conn:
                row = conn.execute(
                    QUERIES.save_results,
                    {
                        "run_id": run.id,
                        "lease_owner": run.lease_owner,
                        "results": Jsonb({n: r.to_json() for n, r in results.items()}),
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
                conn.execute(QUERIES.clear_seen_keys, {"lease_owner": run.lease_owner})
        except psycopg.Error as exc:  # the sweep stage collects them later
            logger.warning("could not clear seen keys: %s", first_line(exc))


def _brief(exc: BaseException) -> str:
    text = first_line(exc)
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text
