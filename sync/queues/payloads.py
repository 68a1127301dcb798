"""A job's payload is JSON: what a send gives is checked and stored as JSON keeps it, so the
in-memory implementation hands a handler exactly what Postgres's jsonb would."""

from __future__ import annotations

import json
from typing import Any

from sync.errors import InvalidInput

_KINDS = "objects with string keys, lists, strings, numbers, booleans and None"


def json_payload(queue: str, payload: object) -> Any:
    """``payload`` as JSON keeps it (tuples become lists), or :class:`InvalidInput` in one line
    saying what is not JSON."""
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"the payload of a job for queue {queue!r} is not JSON ({exc}); send {_KINDS}"
        ) from None
    problem = _unstorable(payload)
    if problem:
        raise InvalidInput(f"the payload of a job for queue {queue!r} {problem}; send {_KINDS}")
    return json.loads(text)


def _unstorable(value: object) -> str | None:
    """What JSON would silently change (a key that is not a string) or Postgres refuses (NUL
    characters, unpaired surrogates), if anything."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if not isinstance(key, str):
                return f"has a key that is not a string ({key!r})"
            problem = _unstorable(key) or _unstorable(inner)
            if problem:
                return problem
    elif isinstance(value, list | tuple):
        for inner in value:
            problem = _unstorable(inner)
            if problem:
                return problem
    elif isinstance(value, str):
        if "\x00" in value:
            return "holds a NUL character"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "holds text that is not valid Unicode"
    return None
