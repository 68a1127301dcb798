"""What a name may be, and what a workspace reference means: one rule for the Python API and the
command line.

A name (of a workspace, a connection, a worker) is 1 to 200 characters, with no control or
format characters (so no terminal escape sequence, newline or invisible direction mark can hide
in a listing) and no leading or trailing space. A workspace reference made only of the digits 0-9
is an id and nothing else; any other reference is a name. So a workspace name may not be made of
digits alone: ``13`` could otherwise name workspace 12.
"""

from __future__ import annotations

import re
import unicodedata

from sync.errors import InvalidInput

MAX_NAME_LENGTH = 200
_ID = re.compile(r"[0-9]+")
# Cc: control characters (escape, newline, NUL...); Cf: format characters (direction
# overrides, zero-width ones); Cs, Co: surrogates and private use; Zl, Zp: line separators.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})


def check_name(value: str, what: str) -> str:
    """``value`` if it is an acceptable name of a ``what``, else :class:`InvalidInput` saying
    what is wrong (without echoing the characters that are)."""
    if not value.strip():
        raise InvalidInput(f"a {what} needs a name")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidInput(
            f"a {what} name is at most {MAX_NAME_LENGTH} characters (this one has {len(value)})"
        )
    for position, char in enumerate(value, start=1):
        if unicodedata.category(char) in _FORBIDDEN_CATEGORIES:
            raise InvalidInput(
                f"a {what} name cannot contain control characters or escape sequences "
                f"(U+{ord(char):04X} at character {position})"
            )
    if value != value.strip():
        raise InvalidInput(f"a {what} name cannot start or end with a space")
    return value


def check_workspace_name(value: str) -> str:
    check_name(value, "workspace")
    if value.isdecimal():
        raise InvalidInput(
            f"a workspace name cannot be made of digits alone ({value!r}): a reference made of "
            "digits means a workspace id; add a letter, such as 'team-" + value + "'"
        )
    return value


def workspace_ref(ref: int | str) -> int | str:
    """A workspace reference as an id (an int, or a string of the digits 0-9) or a name."""
    if isinstance(ref, bool):
        raise InvalidInput("a workspace reference is an id or a name")
    if isinstance(ref, int):
        return ref
    return int(ref) if _ID.fullmatch(ref) else ref
