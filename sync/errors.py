"""Errors a user or operator can cause. Each carries a message that says what to do; the CLI
prints it as one line and exits 2."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError


class SyncError(Exception):
    """Base of the engine's user-facing errors."""


class NotFound(SyncError):
    pass


class InvalidInput(SyncError):
    pass


class InvalidFields(InvalidInput):
    """Input refused by a model's validation (a connection's config or credentials): the
    one-line message, and each problem by the field it is about (``""``: the input as a whole),
    so a form can show each beside its field. Never with the value given."""

    def __init__(self, message: str, section: str, problems: Mapping[str, str]) -> None:
        super().__init__(message)
        self.section = section
        self.problems = dict(problems)


class Conflict(SyncError):
    pass


class SchemaBehind(SyncError):
    pass


class MigrationError(SyncError):
    pass


class DatabaseUnavailable(SyncError):
    pass


class SecretsError(SyncError):
    pass


class EndpointFailed(SyncError):
    """An outside service the engine calls for the request (the embeddings endpoint) failed."""


class LeaseLost(Exception):
    """A fenced write matched nothing: another worker owns the run now, or the lease expired."""


def describe_validation_error(exc: ValidationError, what: str = "config") -> str:
    """A pydantic error as one line naming each field and what is wrong with it (never the
    value given, which may be a secret)."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or what
        problems.append(f"{where}: {err['msg']}")
    verb = "are" if what.endswith("s") else "is"
    return f"the connection's {what} {verb} invalid: " + "; ".join(problems)


def field_problems(exc: ValidationError) -> dict[str, str]:
    """What is wrong, by top-level field (``""`` for the model as a whole): ``{"page_size":
    "Input should be less than or equal to 500"}``, an item of a list named by its position
    (``"item 2: ..."``). Never the value given."""
    problems: dict[str, list[str]] = {}
    for err in exc.errors():
        field, *inside = [str(p) for p in err["loc"]] or [""]
        where = ".".join(f"item {int(p) + 1}" if p.isdigit() else p for p in inside)
        problems.setdefault(field, []).append(f"{where}: {err['msg']}" if where else err["msg"])
    return {field: "; ".join(found) for field, found in problems.items()}
