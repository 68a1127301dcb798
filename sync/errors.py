"""Errors a user or operator can cause. Each carries a message that says what to do; the CLI
prints it as one line and exits 2."""

from __future__ import annotations

from pydantic import ValidationError


class SyncError(Exception):
    """Base of the engine's user-facing errors."""


class NotFound(SyncError):
    pass


class InvalidInput(SyncError):
    pass


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


class LeaseLost(Exception):
    """A fenced write matched nothing: another worker owns the run now, or the lease expired."""


def describe_validation_error(exc: ValidationError) -> str:
    """A pydantic error as one line naming each field and what is wrong with it."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "config"
        problems.append(f"{where}: {err['msg']}")
    return "the connection's config is invalid: " + "; ".join(problems)
