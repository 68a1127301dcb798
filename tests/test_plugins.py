"""Connectors arrive by decorator or by the `connector_sync.connectors` entry-point group; a
provider name claimed twice is an error naming both."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import connectors
from connectors import registry
from connectors.registry import DuplicateProvider

PLUGIN = """
from connectors import Connector, Table


class FromEntryPoint(Connector):
    provider = "from_entry_point"
    tables = (Table("things"),)


class Impostor(Connector):
    provider = "memory"
"""


def install_plugin(root: Path, entry_points: str) -> None:
    """A distribution on sys.path, as `pip install` would leave it."""
    (root / "cs_test_plugin.py").write_text(PLUGIN)
    info = root / "cs_test_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cs-test-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[connector_sync.connectors]\n{entry_points}\n")


@pytest.fixture
def plugin_path(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    registry._entry_points_loaded = False
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("cs_test_plugin", None)
    registry.unregister("from_entry_point")
    registry._entry_points_loaded = False


def test_an_entry_point_registers_a_connector(plugin_path: Path) -> None:
    install_plugin(plugin_path, "from_entry_point = cs_test_plugin:FromEntryPoint")
    cls = connectors.get("from_entry_point")
    assert cls.__name__ == "FromEntryPoint" and "from_entry_point" in connectors.providers()


def test_a_provider_claimed_twice_names_both_sources(plugin_path: Path) -> None:
    install_plugin(plugin_path, "memory = cs_test_plugin:Impostor")
    with pytest.raises(DuplicateProvider) as raised:
        connectors.providers()
    message = str(raised.value)
    assert "provider 'memory' is registered twice" in message
    assert "tests.fakes.MemoryConnector" in message
    assert "entry point 'memory' (cs_test_plugin:Impostor)" in message
    with pytest.raises(DuplicateProvider):  # and again, until someone fixes it
        connectors.get("memory")


def test_a_plugin_that_fails_to_import_is_skipped_with_a_warning(
    plugin_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    install_plugin(plugin_path, "broken = cs_test_plugin_missing:Nothing")
    assert "memory" in connectors.providers()
    assert "connector plugin 'broken'" in caplog.text and "failed to load" in caplog.text
