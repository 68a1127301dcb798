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
