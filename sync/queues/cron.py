"""Pure decisions about cron schedules (UTC, minute resolution, standard five fields), computed
with croniter.

A schedule keeps the first tick it has not fired yet. When that tick is due, the schedule fires
once, for the latest tick at or before now, and its next tick becomes the first one after now:
a schedule that missed ticks while no worker ran sends one job, not a backlog. A fired tick is
identified by (queue, tick), and a uniqueness rule on that pair makes it fire exactly once
however many workers fire schedules at the same moment."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from croniter import CroniterBadDateError, croniter

from sync.errors import InvalidInput

_FIELDS = 5
_ALIASES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_HELP = "write five fields (minute hour day month weekday), such as '*/5 * * * *', or @hourly"
# croniter answers "at or before" only strictly before its start, and ticks are whole minutes.
_JUST_AFTER = timedelta(microseconds=1)


def parse_cron(expression: str) -> str:
    """``expression`` with its whitespace normalized, or :class:`InvalidInput` in one line."""
    text = " ".join(expression.split())
    if text.lower() in _ALIASES:
        return text.lower()
    if len(text.split(" ")) != _FIELDS:
        raise InvalidInput(f"cron expression {expression!r} is not valid: {_HELP}")
    if not croniter.is_valid(text):
        raise InvalidInput(f"cron expression {expression!r} is not valid: {_HELP}")
    try:
        croniter(text, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
    except CroniterBadDateError:
        raise InvalidInput(f"cron expression {expression!r} names no date that exists") from None
    return text


def next_tick(expression: str, after: datetime) -> datetime:
    """The first tick strictly after ``after``."""
    return _at(croniter(expression, _utc(after)).get_next(datetime))


def latest_tick(expression: str, at: datetime) -> datetime:
    """The latest tick at or before ``at``."""
    return _at(croniter(expression, _utc(at) + _JUST_AFTER).get_prev(datetime))


@dataclass(frozen=True)
class Firing:
    tick: datetime | None  # the tick to fire now, if any
    next_tick: datetime  # the schedule's first tick not fired, after this


def firing(expression: str, pending: datetime, now: datetime) -> Firing:
    """What a schedule whose first unfired tick is ``pending`` does at ``now``: nothing before
    that tick; from it on, fire once for the latest tick at or before now and wait for the first
    tick after now, however many ticks were missed in between."""
    if now < pending:
        return Firing(None, pending)
    return Firing(latest_tick(expression, now), next_tick(expression, now))


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("cron times are timezone-aware")
    return moment.astimezone(UTC)


def _at(tick: datetime) -> datetime:
    return tick.astimezone(UTC)
