"""Ingestions as a kind of leased work, run in a lane slot of their own
(``CONNECTOR_SYNC_INGESTION_LANES``, one by default), so a long ingestion never holds up a sync.
A lane's claim takes an archive expansion if one is due, else a document ingestion. A document
ingestion is held by its lease (renewed and controlled by the worker's lease keeper: a cancel or
a lost lease trips its abort signal); an archive expansion holds none (its ``processing_since``
guards its writes). The recipe (``sync.ingestions.job``, ``sync.ingestions.archives``) writes
how a whole attempt ended itself, fenced; an attempt that ended early is decided by
``sync.ingestions.decisions`` and written here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sync.base.abort import AbortReason
from sync.base.settings import Settings
from sync.documents import DocumentLimits, Embedder
from sync.documents.embedders import close_embedder, embedder_from
from sync.ingestions.archives import ArchiveJob
from sync.ingestions.context import EndpointContext
from sync.ingestions.decisions import after_failure
from sync.ingestions.job import DocumentJob
from sync.ingestions.models import IngestionStatus
from sync.ingestions.rows import ClaimedIngestion
from sync.ingestions.store import IngestionStore
from sync.jobs.kind import Handling, Hold, Kind, Labels
from sync.jobs.lease import Control, LeaseKind, Terms
from sync.jobs.outcome import Action, Outcome
from sync.jobs.registry import SlotSpec, WorkerParts
from sync.store import Lease, RetryPolicy
from sync.store.db import Connection, first_line
from sync.vocabulary import ErrorKind, JobError

# How a whole attempt ended, as the recipe wrote it: what it finished as, or what it did instead.
_ENDED = {
    "queued": Outcome(Action.HAND_BACK),  # the file changed while it was indexed
    "lost": Outcome(Action.STOP),  # another worker took an expansion over
}


def read_ingestion_control(conn: Connection, lease: Lease) -> Control:
    cancel = IngestionStore.control(conn, lease)
    if cancel is None:
        return Control(AbortReason.LEASE_LOST)
    return Control(AbortReason.CANCELLED if cancel else None)


INGESTION_LEASES = LeaseKind(
    "ingestion", renew=IngestionStore.renew, control=read_ingestion_control
)


@dataclass(frozen=True)
class Claimed:
    """A claimed ingestion (its row, with its connection's), or an archive expansion."""

    row: ClaimedIngestion
    archive: bool


@dataclass(frozen=True)
class Handled:
    ended: str | None = None  # how the recipe ended the attempt, written already
    error: Exception | None = None  # what ended it early, for the decision


class Ingestions(Kind[Claimed, Handled]):
    name = "ingestion"
    lease_kind = INGESTION_LEASES

    def __init__(self, parts: WorkerParts) -> None:
        self._settings: Settings = parts.settings
        # An end is repeated while its connection is lost for most of a lease: the lease
        # keeper stops the attempt before the lease runs out.
        within = parts.settings.lease_seconds * 0.8
        self.store = IngestionStore(parts.pool, retry=RetryPolicy(within=within))
        self._worker_id = parts.worker_id
        self._providers = list(parts.providers())
        # The embedder of new chunks (CONNECTOR_SYNC_EMBEDDER), whose requests serve the attempt
        # running, and the caps and chunk settings (CONNECTOR_SYNC_DOCUMENTS_*).
        self.endpoint = EndpointContext(parts.settings.max_inline_wait)
        self.embedder: Embedder = embedder_from(parts.settings, self.endpoint)
        self.limits = DocumentLimits()
        self._secrets = parts.secrets

    def claim(self, limit: int) -> Sequence[Claimed]:
        s = self._settings
        reclaim = timedelta(seconds=s.archive_reclaim_seconds)
        archive = self.store.claim_archive(self._worker_id, reclaim, self._providers)
        if archive is not None:
            return [Claimed(archive, archive=True)]
        lease = timedelta(seconds=s.lease_seconds)
        document = self.store.claim_document(self._worker_id, lease, self._providers)
        return [Claimed(document, archive=False)] if document is not None else []

    def holds(self, unit: Claimed) -> Sequence[Hold]:
        if unit.archive:
            return []
        s = self._settings
        terms = Terms(s.lease_seconds, s.control_interval, s.ingestion_timeout_seconds)
        return [Hold(unit.row.lease, terms)]

    def labels(self, unit: Claimed) -> Labels:
        row = unit.row
        ids = {"archive" if unit.archive else "ingestion": row.id, "attempt": row.attempts}
        return Labels(ids, row.provider or "local")

    def handle(self, unit: Claimed, handling: Handling) -> Handled:
        recipe = self._archive() if unit.archive else self._document()
        try:
            return Handled(ended=recipe.work(unit.row, handling.abort, handling.log))
        except Exception as exc:
            return Handled(error=exc)

    def decide(self, unit: Claimed, handled: Handled, handling: Handling) -> Sequence[Outcome]:
        if handled.error is None:
            ended = handled.ended or "lost"
            return [_ENDED.get(ended, Outcome(Action.FINISH, ended))]
        s = self._settings
        outcome = after_failure(
            handled.error,
            abort=handling.abort.reason,
            attempts=unit.row.attempts,
            max_attempts=unit.row.max_attempts,
            schedule=s.backoff_seconds,
            jitter=s.backoff_jitter,
        )
        return [outcome]

    def apply(
        self, unit: Claimed, handled: Handled, outcomes: Sequence[Outcome], handling: Handling
    ) -> None:
        (outcome,) = outcomes
        log = handling.log
        if handled.error is None:
            return  # the recipe wrote its end
        if outcome.error is not None and outcome.error.kind is ErrorKind.INTERNAL:
            log.error("the attempt failed unexpectedly", exc_info=handled.error)
        if outcome.action is Action.STOP:
            log.warning("stopped: the lease was lost, so this attempt writes nothing more")
            return
        try:
            if unit.archive:
                self._end_archive(unit.row, outcome)
            else:
                self._end_document(unit.row, outcome)
        except Exception as exc:  # its lease runs out (or its stamp ages) and it is taken again
            log.warning("could not record how the attempt ended: %s", first_line(exc))
            return
        if outcome.action is Action.FINISH:
            log.warning("%s: %s", outcome.status, _message(outcome.error))
        elif outcome.action is Action.HAND_BACK:
            log.info("handed back at shutdown")
        else:
            log.info("retrying in %.1f s: %s", outcome.delay or 0.0, _message(outcome.error))

    def hand_back(self, unit: Claimed) -> None:
        if unit.archive:
            self._end_archive(unit.row, Outcome(Action.HAND_BACK), closing=True)
        else:
            self.store.hand_back(unit.row.lease, closing=True)

    def stop(self) -> None:
        close_embedder(self.embedder)

    def _document(self) -> DocumentJob:
        return DocumentJob(
            store=self.store,
            settings=self._settings,
            secrets=self._secrets,
            embedder=self.embedder,
            endpoint=self.endpoint,
            limits=self.limits,
        )

    def _archive(self) -> ArchiveJob:
        return ArchiveJob(
            store=self.store,
            settings=self._settings,
            secrets=self._secrets,
            embedder=self.embedder,
            limits=self.limits,
        )

    def _end_document(self, row: ClaimedIngestion, outcome: Outcome) -> None:
        if outcome.action is Action.HAND_BACK:
            self.store.hand_back(row.lease)
        elif outcome.action in (Action.REQUEUE, Action.WAIT):
            assert outcome.error is not None  # every retry says what failed
            self.store.requeue(
                row.lease,
                outcome.delay or 0.0,
                outcome.error,
                spend_attempt=outcome.action is Action.REQUEUE,
            )
        else:
            self.store.end(row.lease, _status(outcome), error=outcome.error)

    def _end_archive(
        self, row: ClaimedIngestion, outcome: Outcome, *, closing: bool = False
    ) -> None:
        since = row.processing_since
        assert since is not None  # an expansion's claim stamps it
        if outcome.action is Action.FINISH:
            self.store.end_archive(row.id, since, _status(outcome), error=outcome.error)
            return
        self.store.end_archive(
            row.id,
            since,
            IngestionStatus.QUEUED,
            error=outcome.error,
            delay_seconds=outcome.delay or 0.0,
            spend_attempt=outcome.action is Action.REQUEUE,
            closing=closing,
        )


def _status(outcome: Outcome) -> IngestionStatus:
    return IngestionStatus(outcome.status or IngestionStatus.FAILED)


def _message(error: JobError | None) -> str:
    return error.message if error is not None else ""


def slots(parts: WorkerParts) -> Sequence[SlotSpec]:
    """The ingestions' lane slot: ``ingestion_lanes`` at once (none: this worker indexes no
    file)."""
    lanes = parts.settings.ingestion_lanes
    return [SlotSpec(Ingestions(parts), lanes=lanes)] if lanes > 0 else []
