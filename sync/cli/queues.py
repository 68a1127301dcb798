"""The application queues on the command line: ``queues`` (figures per queue), ``queues
create|update|delete``, and ``jobs send|list|show|cancel|retry|redrive``. Every command calls
``Engine.queues`` (the Python API), never SQL."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import typer

from sync.base.durations import format_rate, parse_duration, parse_rate
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
PriorityDefaultOption = typer.Option(
    None, "--priority", metavar="N", help="The priority of jobs sent without one (0 first, 9 last)."
)
PriorityStepOption = typer.Option(
    None,
    "--priority-step",
    metavar="S",
    help="Waiting one priority level is worth (1m): no job waits longer behind better ones.",
)
ConcurrencyOption = typer.Option(
    None,
    "--global-concurrency",
    metavar="N",
    help="At most N jobs of the queue run at once across all workers (0: no limit).",
)
RateOption = typer.Option(
    None,
    "--rate",
    metavar="N/PERIOD",
    help="At most N jobs start per period across all workers (10/s, 100/1m; none: no limit).",
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
    limits: dict[str, Any],
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
    return {**{k: v for k, v in given.items() if v is not None}, **limits}


def _limits(
    priority: int | None, step: str | None, concurrency: int | None, rate: str | None
) -> dict[str, Any]:
    """The priority and limit options given, as declaration fields; 0 and ``none`` lift a
    limit."""
    given: dict[str, Any] = {}
    if priority is not None:
        given["priority"] = priority
    if step is not None:
        given["priority_step"] = _seconds(step, "--priority-step")
    if concurrency is not None:
        given["global_concurrency"] = concurrency or None
    if rate is not None and rate.strip().lower() == "none":
        given["rate_limit"] = given["rate_period"] = None
    elif rate is not None:
        try:
            given["rate_limit"], given["rate_period"] = parse_rate(rate)
        except ValueError as exc:
            fail(f"--rate: {exc}")
    return given


def limits_text(spec: QueueSpec) -> str:
    """A queue's fleet-wide limits in a few words: ``max 3, 10/1m``, or ``-``."""
    parts = []
    if spec.global_concurrency is not None:
        parts.append(f"max {spec.global_concurrency}")
    if spec.rate_limit is not None and spec.rate_period is not None:
        parts.append(format_rate(spec.rate_limit, spec.rate_period))
    return ", ".join(parts) or "-"


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
    limits = limits_text(spec)
    return (
        f"queue {spec.name} ({spec.policy}): {retries}, expire "
        f"{format_duration(spec.expire)}{grave}, priority {spec.priority}"
        + ("" if limits == "-" else f", limits {limits}")
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
        specs = {spec.name: spec for spec in engine.queues.list_queues()}
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
                    **{
                        field: getattr(specs[s.name], field)
                        for field in ("priority", "global_concurrency", "rate_limit", "rate_period")
                        if s.name in specs
                    },
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
        Col("limits", keep=6),
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
            limits_text(specs[s.name]) if s.name in specs else "-",
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
    priority: int | None = PriorityDefaultOption,
    priority_step: str | None = PriorityStepOption,
    global_concurrency: int | None = ConcurrencyOption,
    rate: str | None = RateOption,
    as_json: bool = JsonOption,
) -> None:
    """Create a queue (the defaults: standard, 2 retries from 5 s up to 5 min, expire 15 min,
    kept 7 days)."""
    spec = queue_spec(
        name,
        **_options(
            policy,
            retry_limit,
            retry_delay,
            retry_ceiling,
            expire,
            dead_letter,
            retention,
            _limits(priority, priority_step, global_concurrency, rate),
        ),
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
    priority: int | None = PriorityDefaultOption,
    priority_step: str | None = PriorityStepOption,
    global_concurrency: int | None = ConcurrencyOption,
    rate: str | None = RateOption,
    as_json: bool = JsonOption,
) -> None:
    """Change the options given; the others keep their values."""
    changes = _options(
        policy,
        retry_limit,
        retry_delay,
        retry_ceiling,
        expire,
        dead_letter,
        retention,
        _limits(priority, priority_step, global_concurrency, rate),
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
    at: str | None = typer.Option(
        None, "--at", metavar="TIME", help="Start it at a time (2026-12-24T08:00Z)."
    ),
    priority: int | None = typer.Option(
        None, "--priority", metavar="N", help="0 runs first, 9 last (the queue's default)."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Send a job; on an exclusive queue a key (or the queue) already pending returns that
    job."""
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        fail(f"--payload is not valid JSON ({exc.msg} at column {exc.colno})")
    start_after = _start_after(delay, at)
    with open_engine() as engine:
        job_id = engine.queues.send(
            queue, value, key=key, start_after=start_after, priority=priority
        )
        job = engine.queues.get_job(job_id)
    if as_json:
        emit_json(_job_json(job))
    else:
        due = "" if job.run_after <= job.created_at else f", due {when(job.run_after)}"
        stdout().print(
            f"job #{job.id} is {job.status} in {job.queue} (priority {job.priority}{due})"
        )


def _start_after(delay: str | None, at: str | None) -> timedelta | datetime | None:
    if delay is not None and at is not None:
        fail("give --delay or --at, not both")
    if delay is not None:
        try:
            return parse_duration(delay)
        except ValueError as exc:
            fail(f"--delay: {exc}")
    if at is None:
        return None
    try:
        moment = datetime.fromisoformat(at)
    except ValueError:
        fail(f"--at: {at!r} is not a time; write it like 2026-12-24T08:00Z")
    if moment.tzinfo is None:
        fail(f"--at: {at!r} has no time zone; add one, like 2026-12-24T08:00Z or +01:00")
    return moment


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
        Col("pri", keep=5, justify="right"),
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
            str(j.priority),
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
        ("priority", str(job.priority)),
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
