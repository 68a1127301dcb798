"""``connector-sync new-connector NAME``: a connector plugin package to start from, written from
the templates beside this module: its ``pyproject.toml`` (with the entry point that makes
connector-sync find it), the connector (one table, paged by ``Link`` headers, resumable), a fake
of the provider's API (respx) and tests with the shipped test kit, which pass as written."""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_TEMPLATES = Path(__file__).resolve().parent / "template"
# Template file -> the file it becomes ($module: the connector's module).
_FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "connector.py.tmpl": "$module.py",
    "fake_api.py.tmpl": "fake_api.py",
    "conftest.py.tmpl": "conftest.py",
    "test_connector.py.tmpl": "tests/test_$module.py",
    "README.md.tmpl": "README.md",
}


class ScaffoldError(ValueError):
    """A name or directory the scaffold cannot use."""


def write_package(name: str, directory: Path) -> list[Path]:
    """Write the package of provider ``name`` into ``directory`` (new, or empty); the paths
    written."""
    if not _NAME.match(name):
        raise ScaffoldError(
            f"{name!r} is not a provider name: lower case letters, digits and underscores, "
            "starting with a letter"
        )
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ScaffoldError(f"{directory} exists and is not an empty directory; choose another")
    values = {
        "name": name,
        "module": f"{name}_connector",
        "distribution": f"{name.replace('_', '-')}-connector",
        "cls": "".join(part.title() for part in name.split("_")) + "Connector",
        "title": name.replace("_", " ").title(),
    }
    written = []
    for template, target in _FILES.items():
        path = directory / Template(target).substitute(values)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template((_TEMPLATES / template).read_text()).substitute(values))
        written.append(path)
    return written
