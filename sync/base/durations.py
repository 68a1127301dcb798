"""Durations as people write them (``15m``, ``1h30m``, ``2d``): in command options and in
settings alike."""

from __future__ import annotations

import re
from datetime import timedelta

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> timedelta:
    """``15m``, ``1h``, ``1h30m``, ``45s``, ``1d`` (a bare number is seconds)."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        seconds = float(value)
    else:
        parts = _DURATION.findall(value)
        if not parts or _DURATION.sub("", value).strip():
            raise ValueError(f"{text!r} is not a duration; write it like 30s, 15m, 1h or 1h30m")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return timedelta(seconds=seconds)


def format_every(seconds: float | None) -> str:
    """An interval as :func:`parse_duration` reads it, largest units first: ``15m``,
    ``1h30m``, ``1d``, ``45s``."""
    if seconds is None:
        return "-"
    rest = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or f"{seconds:g}s"


def parse_rate(text: str) -> tuple[int, float]:
    """``10/s``, ``100/1m``, ``5/30s``: at most N per period, as (N, the period in seconds)."""
    count, slash, period = text.strip().lower().partition("/")
    if not slash or not count.strip().isdigit() or int(count) < 1:
        raise ValueError(f"{text!r} is not a rate; write it like 10/s, 100/1m or 5/30s")
    unit = period.strip()
    try:
        seconds = _UNITS[unit] if unit in _UNITS else parse_duration(unit).total_seconds()
    except ValueError:
        raise ValueError(f"{text!r} is not a rate; write it like 10/s, 100/1m or 5/30s") from None
    return int(count), seconds


def format_rate(count: int, seconds: float) -> str:
    """A rate as :func:`parse_rate` reads it: ``10/1s``, ``100/1m``."""
    return f"{count}/{format_every(seconds)}"
