"""A job's payload is JSON: what a send gives is checked and kept as Postgres's jsonb keeps it,
so the in-memory implementation hands a handler exactly what the Postgres one would."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from sync.errors import InvalidInput

_KINDS = "objects with string keys, lists, strings, numbers, booleans and None"


def json_payload(queue: str, payload: object) -> Any:
    """``payload`` as jsonb keeps it (tuples become lists, numbers as :func:`_jsonb_number`
    reads them), or :class:`InvalidInput` in one line saying what is not JSON."""
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"the payload of a job for queue {queue!r} is not JSON ({exc}); send {_KINDS}"
        ) from None
    problem = _unstorable(payload)
    if problem:
        raise InvalidInput(f"the payload of a job for queue {queue!r} {problem}; send {_KINDS}")
    return json.loads(text, parse_float=_jsonb_number)


def _jsonb_number(text: str) -> float | int:
    """A JSON number with a fraction or an exponent as it comes back from jsonb, which stores
    it as numeric and writes it without an exponent: 1e20 comes back as an int, -0.0 as 0.0."""
    written = format(Decimal(text), "f")
    if "." not in written:
        return int(written)
    return float(written) + 0.0  # numeric has no negative zero; -0.0 + 0.0 is 0.0


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
