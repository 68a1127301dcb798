"""The application queues on the command line: ``queues`` (figures per queue), ``queues
create|update|delete``, and ``jobs send|list|show|cancel|retry|redrive``. Every command calls
``Engine.queues`` (the Python API), never SQL."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import typer

from sync.base.durations import parse_duration
from sync.cli.common import (
    JsonOption,
    app,
    command_group,
    emit_json,
    fail,
    guarded,
    open_engine,
    stdout,
)
from sync.cli.console import Cell, Col, details, fitted_table, format_duration, styled, when
from sync.queues import Job, JobAttempt, JobStatus, QueuePolicy, QueueSpec, queue_spec

queues_app = command_group("Application queues: declared queues and their figures.")
queues_app.info.invoke_without_command = True
queues_app.info.no_args_is_help = False
jobs_app = command_group("Jobs of the application queues: send, read, cancel, retry, redrive.")
app.add_typer(queues_app, name="queues")
app.add_typer(jobs_app, name="jobs")

QueueArg = typer.Argument(..., metavar="QUEUE", help="A queue's name.")
JobArg = typer.Argument(..., metavar="JOB", min=1, help="A job id.")
PolicyOption = typer.Option(
    None, "--policy", metavar="POLICY", help="standard (many at once) or exclusive (one per key)."
)
RetryLimitOption = typer.Option(
    None, "--retry-limit", metavar="N", min=0, help="Retries after the first attempt."
)
RetryDelayOption = typer.Option(
    None, "--retry-delay", metavar="S", help="The first retry's delay (30, 30s, 5m); doubles."
)
RetryCeilingOption = typer.Option(
    None, "--retry-ceiling", metavar="S", help="The longest retry delay."
)
ExpireOption = typer.Option(
    None, "--expire", metavar="S", help="How long an attempt may run before it is taken back."
)
DeadLetterOption = typer.Option(
    None, "--dead-letter", metavar="QUEUE", help="The queue dead jobs move to."
)
RetentionOption = typer.Option(
    None, "--retention", metavar="S", help="How long finished jobs are kept (7d)."
)


def _seconds(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text).total_seconds()
    except ValueError as exc:
        fail(f"{option}: {exc}")


def _options(
    policy: str | None,
    retry_limit: int | None,
    retry_delay: str | None,
    retry_ceiling: str | None,
    expire: str | None,
    dead_letter: str | None,
    retention: str | None,
) -> dict[str, Any]:
    given: dict[str, Any] = {
        "policy": policy,
        "retry_limit": retry_limit,
        "retry_delay": _seconds(retry_delay, "--retry-delay"),
        "retry_ceiling": _seconds(retry_ceiling, "--retry-ceiling"),
        "expire": _seconds(expire, "--expire"),
        "dead_letter": dead_letter,
        "retention": _seconds(retention, "--retention"),
    }
    if policy is not None and policy not in {p.value for p in QueuePolicy}:
        fail(f"--policy must be standard or exclusive, not {policy!r}")
    return {k: v for k, v in given.items() if v is not None}


def _json(value: Any) -> Any:
    """A queues record as JSON: enums by value, times in ISO 8601."""
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _spec_json(spec: QueueSpec) -> dict[str, Any]:
    return _json(spec.model_dump())


def _job_json(job: Job) -> dict[str, Any]:
    return _json(asdict(job))


def _attempt_json(attempt: JobAttempt) -> dict[str, Any]:
    return _json(asdict(attempt))


def _describe(spec: QueueSpec) -> str:
    retries = (
        f"{spec.retry_limit} retries from {format_duration(spec.retry_delay)} up to "
        f"{format_duration(spec.retry_ceiling)}"
    )
    grave = f", dead letters to {spec.dead_letter}" if spec.dead_letter else ""
    return (
        f"queue {spec.name} ({spec.policy}): {retries}, expire "
        f"{format_duration(spec.expire)}{grave}"
    )


# -- queues ------------------------------------------------------------------------------------


@queues_app.callback()
@guarded
def queues_list(ctx: typer.Context, as_json: bool = JsonOption) -> None:
    """Per queue: jobs queued, active, retrying and dead, how long the oldest due one has
    waited, and the lanes live workers give it."""
    if ctx.invoked_subcommand is not None:
        return
    with open_engine() as engine:
        stats = engine.queues.queue_stats()
        lanes = engine.lanes_online()
    now = datetime.now(UTC)
    if as_json:
        emit_json(
            [
                {
                    **_json(asdict(s)),
                    "oldest_queued_seconds": (
                        None if s.oldest_due_at is None else (now - s.oldest_due_at).total_seconds()
                    ),
                    "lanes_online": lanes.get(s.name, 0),
                }
                for s in stats
            ]
        )
        return
    out = stdout()
    if not stats:
        out.print("no queues yet: create one with `connector-sync queues create NAME`")
        return
    columns = [
        Col("queue", key=True),
        Col("policy", keep=3),
        Col("queued", key=True, justify="right"),
        Col("active", keep=8, justify="right"),
        Col("retrying", keep=6, justify="right"),
        Col("dead", keep=7, justify="right"),
        Col("oldest", keep=5, justify="right"),
        Col("lanes", keep=4, justify="right"),
    ]
    rows: list[list[Cell]] = [
        [
            s.name,
            s.policy.value,
            str(s.queued),
            str(s.active),
            str(s.retrying),
            str(s.dead),
            "-"
            if s.oldest_due_at is None
            else format_duration(max((now - s.oldest_due_at).total_seconds(), 0)),
            str(lanes.get(s.name, 0)),
        ]
        for s in stats
    ]
    out.print(fitted_table(columns, rows, out.width))


@queues_app.command("create")
@guarded
def queues_create(
    name: str = QueueArg,
    policy: str | None = PolicyOption,
    retry_limit: int | None = RetryLimitOption,
    retry_delay: str | None = RetryDelayOption,
    retry_ceiling: str | None = RetryCeilingOption,
    expire: str | None = ExpireOption,
    dead_letter: str | None = DeadLetterOption,
    retention: str | None = RetentionOption,
    as_json: bool = JsonOption,
) -> None:
    """Create a queue (the defaults: standard, 2 retries from 5 s up to 5 min, expire 15 min,
    kept 7 days)."""
    spec = queue_spec(
        name,
        **_options(policy, retry_limit, retry_delay, retry_ceiling, expire, dead_letter, retention),
    )
    with open_engine() as engine:
        if any(q.name == name for q in engine.queues.list_queues()):
            fail(f"queue {name!r} already exists; change it with `connector-sync queues update`")
        made = engine.queues.declare_queue(spec)
    if as_json:
        emit_json(_spec_json(made))
    else:
        stdout().print(f"created {_describe(made)}")


@queues_app.command("update")
@guarded
def queues_update(
    name: str = QueueArg,
    policy: str | None = PolicyOption,
    retry_limit: int | None = RetryLimitOption,
    retry_delay: str | None = RetryDelayOption,
    retry_ceiling: str | None = RetryCeilingOption,
    expire: str | None = ExpireOption,
    dead_letter: str | None = DeadLetterOption,
    retention: str | None = RetentionOption,
    as_json: bool = JsonOption,
) -> None:
    """Change the options given; the others keep their values."""
    changes = _options(
        policy, retry_limit, retry_delay, retry_ceiling, expire, dead_letter, retention
    )
    with open_engine() as engine:
        current = engine.queues.get_queue(name)
        options = {**current.model_dump(exclude={"name"}), **changes}
        made = engine.queues.declare_queue(queue_spec(name, **options))
    if as_json:
        emit_json(_spec_json(made))
    else:
        stdout().print(f"updated {_describe(made)}")


@queues_app.command("delete")
@guarded
def queues_delete(name: str = QueueArg) -> None:
    """Delete a queue that has no queued, retrying or active job, with its finished jobs and
    its schedule."""
    with open_engine() as engine:
        engine.queues.delete_queue(name)
    stdout().print(f"deleted queue {name}")


# -- jobs --------------------------------------------------------------------------------------


@jobs_app.command("send")
@guarded
def jobs_send(
    queue: str = QueueArg,
    payload: str = typer.Option(
        "null", "--payload", metavar="JSON", help='The job\'s payload, such as {"doc": 7}.'
    ),
    key: str | None = typer.Option(
        None, "--key", metavar="K", help="Singleton key (exclusive queues): one pending job each."
    ),
    delay: str | None = typer.Option(
        None, "--delay", metavar="D", help="Start it later (30s, 5m, 1h)."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Send a job; on an exclusive queue a key (or the queue) already pending returns that
    job."""
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        fail(f"--payload is not valid JSON ({exc.msg} at column {exc.colno})")
    start_after = None
    if delay is not None:
        try:
            start_after = parse_duration(delay)
        except ValueError as exc:
            fail(f"--delay: {exc}")
    with open_engine() as engine:
        job_id = engine.queues.send(queue, value, key=key, start_after=start_after)
        job = engine.queues.get_job(job_id)
    if as_json:
        emit_json(_job_json(job))
    else:
        stdout().print(f"job #{job.id} is {job.status} in {job.queue}")


@jobs_app.command("list")
@guarded
def jobs_list(
    queue: str | None = typer.Option(None, "--queue", "-q", metavar="QUEUE", help="One queue."),
    status: str | None = typer.Option(
        None, "--status", metavar="STATUS", help="queued, active, retrying, completed, dead..."
    ),
    limit: int = typer.Option(50, "--limit", metavar="N", min=1, max=1000, help="At most N."),
    as_json: bool = JsonOption,
) -> None:
    """Jobs, the newest first."""
    if status is not None and status not in {s.value for s in JobStatus}:
        fail(f"--status must be one of {', '.join(s.value for s in JobStatus)}, not {status!r}")
    with open_engine() as engine:
        found = engine.queues.list_jobs(
            queue=queue, status=JobStatus(status) if status else None, limit=limit
        )
    if as_json:
        emit_json([_job_json(j) for j in found])
        return
    out = stdout()
    if not found:
        out.print("no jobs")
        return
    columns = [
        Col("job", key=True),
        Col("queue", key=True),
        Col("status", key=True),
        Col("key", keep=3),
        Col("tries", keep=6, justify="right"),
        Col("due", keep=4),
        Col("finished", keep=5),
        Col("error", text="ellipsis"),
    ]
    rows: list[list[Cell]] = [
        [
            f"#{j.id}",
            j.queue,
            styled(j.status.value),
            j.key or "-",
            str(j.attempts),
            when(j.run_after, seconds=False),
            when(j.finished_at, seconds=False),
            j.error or "",
        ]
        for j in found
    ]
    out.print(fitted_table(columns, rows, out.width))


@jobs_app.command("show")
@guarded
def jobs_show(job_id: int = JobArg, as_json: bool = JsonOption) -> None:
    """A job and its attempts."""
    with open_engine() as engine:
        job = engine.queues.get_job(job_id)
        attempts = engine.queues.attempts(job_id)
    if as_json:
        emit_json({**_job_json(job), "attempt_history": [_attempt_json(a) for a in attempts]})
        return
    out = stdout()
    progress = (
        "-"
        if job.processed_units is None
        else f"{job.processed_units}/{job.total_units if job.total_units is not None else '?'}"
    )
    rows: list[tuple[str, Cell]] = [
        ("job", f"#{job.id}"),
        (
            "queue",
            job.queue
            if job.queue == job.origin_queue
            else f"{job.queue} (sent to {job.origin_queue})",
        ),
        ("status", styled(job.status.value)),
        ("key", job.key or "-"),
        ("payload", json.dumps(job.payload)),
        ("attempts", str(job.attempts)),
        ("due", when(job.run_after)),
        ("created", when(job.created_at)),
        ("started", when(job.started_at)),
        ("finished", when(job.finished_at)),
        ("expires", when(job.expires_at)),
        ("progress", progress),
        ("tick", when(job.tick)),
        ("error", job.error or "-"),
    ]
    out.print(details(rows))
    if attempts:
        columns = [
            Col("try", key=True, justify="right"),
            Col("queue", keep=2),
            Col("started", key=True),
            Col("took", keep=4, justify="right"),
            Col("outcome", key=True),
            Col("error", text="ellipsis"),
        ]
        table: list[list[Cell]] = [
            [
                str(a.attempt),
                a.queue,
                when(a.started_at),
                "-"
                if a.finished_at is None
                else format_duration((a.finished_at - a.started_at).total_seconds()),
                styled(a.outcome.value if a.outcome else "running"),
                a.error or "",
            ]
            for a in attempts
        ]
        out.print(fitted_table(columns, table, out.width))


@jobs_app.command("cancel")
@guarded
def jobs_cancel(job_id: int = JobArg, as_json: bool = JsonOption) -> None:
    """Cancel a queued, retrying or active job (an active one's handler is told to stop)."""
    with open_engine() as engine:
        job = engine.queues.cancel_job(job_id)
    if as_json:
        emit_json(_job_json(job))
    else:
        stdout().print(f"job #{job.id} cancelled")


@jobs_app.command("retry")
@guarded
def jobs_retry(job_id: int = JobArg, as_json: bool = JsonOption) -> None:
    """A dead or cancelled job back to its queue with a fresh set of attempts; a retrying job
    due now."""
    with open_engine() as engine:
        job = engine.queues.retry_job(job_id)
    if as_json:
        emit_json(_job_json(job))
    else:
        stdout().print(f"job #{job.id} is {job.status} in {job.queue}, due now")


@jobs_app.command("redrive")
@guarded
def jobs_redrive(queue: str = QueueArg, as_json: bool = JsonOption) -> None:
    """Every dead job in QUEUE (a dead-letter queue, or a queue without one) back to the queue
    it was sent to."""
    with open_engine() as engine:
        done = engine.queues.redrive(queue)
        letters = engine.queues.get_queue(queue).dead_letter
        dead = {s.name: s.dead for s in engine.queues.queue_stats()}.get(letters or "", 0)
    if as_json:
        emit_json({"redriven": list(done.redriven), "skipped": list(done.skipped)})
        return
    out = stdout()
    out.print(f"redrove {len(done.redriven)} job(s) from {queue}")
    if not done.redriven and not done.skipped and letters:
        # Its dead jobs are not here: they moved to its dead-letter queue.
        out.print(
            f"{queue}'s dead jobs move to its dead-letter queue {letters}, which holds {dead}: "
            f"`connector-sync jobs redrive {letters}` sends them back to {queue}"
        )
    if done.skipped:
        out.print(
            f"left {len(done.skipped)} dead: their key is pending again or their queue is gone "
            f"({', '.join(f'#{i}' for i in done.skipped[:10])})"
        )
