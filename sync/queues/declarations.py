"""Queue declarations: a queue's name, policy, retries, expiry, dead-letter queue and retention,
validated, in code (:func:`queue_spec`) or in a TOML file (:func:`read_queue_file`). Every
mistake is one line that names the queue and the field."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from sync.errors import InvalidInput
from sync.queues.models import QueuePolicy

QUEUE_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,99}$"
QueueName = Annotated[str, StringConstraints(pattern=QUEUE_NAME_PATTERN)]
NAME_RULE = "lower-case letters, digits, '.', '_' and '-', starting with a letter or digit"

DAY = 86400.0
# Job priorities: 0 runs first (and is the default), 9 last.
MIN_PRIORITY = 0
MAX_PRIORITY = 9


class QueueSpec(BaseModel):
    """A queue, as declared. Durations are seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: QueueName
    policy: QueuePolicy = QueuePolicy.STANDARD
    retry_limit: int = Field(default=2, ge=0, le=1000, description="Retries after the first try.")
    retry_delay: float = Field(default=5.0, gt=0, le=30 * DAY, description="The first retry's.")
    retry_ceiling: float = Field(default=300.0, gt=0, le=30 * DAY, description="Longest delay.")
    expire: float = Field(default=900.0, gt=0, le=7 * DAY, description="Longest attempt.")
    dead_letter: QueueName | None = Field(default=None, description="Where dead jobs wait.")
    retention: float = Field(
        default=7 * DAY, gt=0, le=3650 * DAY, description="How long finished jobs stay."
    )
    priority: int = Field(
        default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY, description="Jobs sent without one get it."
    )
    priority_step: float = Field(
        default=60.0, gt=0, le=DAY, description="Seconds of waiting one priority level is worth."
    )
    global_concurrency: int | None = Field(
        default=None, ge=1, le=100_000, description="Most active jobs across the fleet."
    )
    rate_limit: int | None = Field(
        default=None, ge=1, le=100_000, description="Most starts per rate_period, fleet-wide."
    )
    rate_period: float | None = Field(default=None, gt=0, le=DAY, description="Its period.")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.retry_ceiling < self.retry_delay:
            raise ValueError(
                f"retry_ceiling ({self.retry_ceiling:g} s) must be at least retry_delay "
                f"({self.retry_delay:g} s)"
            )
        if self.dead_letter == self.name:
            raise ValueError("dead_letter must name another queue (or be left out)")
        if (self.rate_limit is None) != (self.rate_period is None):
            raise ValueError("rate_limit and rate_period go together (a rate is N per period)")
        return self

    @property
    def attempts_allowed(self) -> int:
        """The first try and its retries."""
        return self.retry_limit + 1


def queue_spec(name: str, **options: Any) -> QueueSpec:
    """A validated declaration, or :class:`InvalidInput` in one line naming what is wrong."""
    try:
        return QueueSpec(name=name, **options)
    except ValidationError as exc:
        raise InvalidInput(f"queue {name!r}: {describe(exc)}") from None


def describe(exc: ValidationError) -> str:
    """A pydantic error as one line: each field and what is wrong with it."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "string_pattern_mismatch":
            message = f"must be {NAME_RULE} (at most 100)"
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


def read_queue_file(path: Path) -> list[QueueSpec]:
    """The queues a TOML file declares, one ``[[queue]]`` table each::

        [[queue]]
        name = "knowledge.sync"
        policy = "exclusive"
        dead_letter = "knowledge.dead"

    in an order in which each dead-letter queue comes before the queues that name it."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: not valid TOML ({exc})") from None
    return parse_queue_declarations(data, source=str(path))


def parse_queue_declarations(data: Mapping[str, Any], *, source: str) -> list[QueueSpec]:
    """Declarations from parsed configuration (``{"queue": [{...}, ...]}``), ordered so that each
    dead-letter queue is declared before the queues that name it."""
    unknown = sorted(set(data) - {"queue"})
    if unknown:
        raise InvalidInput(f"{source}: unknown key {unknown[0]!r}; declare queues as [[queue]]")
    entries = data.get("queue", [])
    if not isinstance(entries, list):
        raise InvalidInput(f"{source}: 'queue' must be a list of tables, written [[queue]]")
    specs: list[QueueSpec] = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise InvalidInput(f'{source}: queue {number} has no name; give it name = "..."')
        try:
            specs.append(QueueSpec(**entry))
        except ValidationError as exc:
            raise InvalidInput(f"{source}: queue {entry['name']!r}: {describe(exc)}") from None
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise InvalidInput(f"{source}: queue {twice!r} is declared twice")
    return dead_letters_first(specs)


def dead_letters_first(specs: Iterable[QueueSpec]) -> list[QueueSpec]:
    """``specs`` reordered (stably) so that a queue's dead-letter queue, when it is among them,
    comes before it. Queues that are each other's dead-letter queue cannot be declared in any
    order, and are refused."""
    by_name = {spec.name: spec for spec in specs}
    ordered: list[QueueSpec] = []
    placed: set[str] = set()

    def place(spec: QueueSpec, chain: tuple[str, ...]) -> None:
        if spec.name in placed:
            return
        if spec.name in chain:
            loop = " -> ".join((*chain[chain.index(spec.name) :], spec.name))
            raise InvalidInput(
                f"dead-letter queues form a loop ({loop}); a dead-letter queue needs none"
            )
        target = by_name.get(spec.dead_letter) if spec.dead_letter else None
        if target is not None:
            place(target, (*chain, spec.name))
        ordered.append(spec)
        placed.add(spec.name)

    for spec in by_name.values():
        place(spec, ())
    return ordered
