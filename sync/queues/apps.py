"""The applications whose handlers a worker runs: each ``setup(queues)`` function declares its
queues and registers its handlers, found under the entry-point group
``connector_sync.handlers`` and named by ``worker --app MODULE:FUNCTION``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points

from sync.errors import InvalidInput
from sync.queues.port import Queues

HANDLERS_GROUP = "connector_sync.handlers"

Setup = Callable[[Queues], object]


def load_setup(reference: str) -> Setup:
    """``module:function`` as the function, or :class:`InvalidInput` in one line."""
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidInput(f"--app {reference!r} is not MODULE:FUNCTION, such as myapp.jobs:setup")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"--app {reference!r}: cannot import {module_name} ({exc})") from None
    setup = getattr(module, attr, None)
    if not callable(setup):
        raise InvalidInput(f"--app {reference!r}: {module_name} has no function {attr}")
    return setup


def install_handlers(queues: Queues, apps: Iterable[str] = ()) -> list[str]:
    """Let each application declare its queues and register its handlers on ``queues``: those
    installed under the entry-point group ``connector_sync.handlers`` (each names a
    ``setup(queues)`` function), then each ``module:function`` of ``apps``. The names of the
    applications set up."""
    done: list[str] = []
    for point in sorted(entry_points(group=HANDLERS_GROUP), key=lambda p: p.name):
        point.load()(queues)
        done.append(point.name)
    for reference in apps:
        load_setup(reference)(queues)
        done.append(reference)
    return done
