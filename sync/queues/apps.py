"""The applications whose handlers a worker runs: each ``setup(queues)`` function declares its
queues and registers its handlers, found under the entry-point group
``connector_sync.handlers`` and named by ``worker --app MODULE:FUNCTION``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from sync.errors import InvalidInput
from sync.queues.port import Queues

HANDLERS_GROUP = "connector_sync.handlers"

Setup = Callable[[Queues], object]


def load_setup(reference: str) -> Setup:
    """The function an ``--app`` names, or :class:`InvalidInput` in one line: ``module:function``
    (found on ``sys.path``, which includes the current directory, as uvicorn and celery look),
    or ``path/to/file.py:function`` (its directory joins ``sys.path``, for its own imports)."""
    target, sep, attr = reference.rpartition(":")
    if not sep or not target or not attr:
        raise InvalidInput(
            f"--app {reference!r} is not MODULE:FUNCTION or FILE.py:FUNCTION, such as "
            "myapp.jobs:setup or myapp/jobs.py:setup"
        )
    if target.endswith(".py") or os.sep in target or "/" in target:
        module = _module_from_file(reference, Path(target))
    else:
        if "" not in sys.path:  # "": the current directory, as `python -m` puts it there
            _on_path(Path.cwd())
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise InvalidInput(
                f"--app {reference!r}: cannot import {target} ({exc}); run the worker from the "
                "directory that holds it, add that directory to PYTHONPATH, or name its file "
                "(path/to/jobs.py:setup)"
            ) from None
    setup = getattr(module, attr, None)
    if not callable(setup):
        raise InvalidInput(f"--app {reference!r}: {target} has no function {attr}")
    return setup


def _module_from_file(reference: str, path: Path) -> ModuleType:
    """The module of a file, imported under its own name (so its pickles, dataclasses and
    logging name it), with its directory on ``sys.path``."""
    path = path.expanduser().resolve()
    if not path.is_file():
        raise InvalidInput(f"--app {reference!r}: there is no file {path}")
    _on_path(path.parent)
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InvalidInput(f"--app {reference!r}: {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        del sys.modules[name]
        raise InvalidInput(f"--app {reference!r}: {path} cannot be imported ({exc})") from None
    return module


def _on_path(directory: Path) -> None:
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))


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
