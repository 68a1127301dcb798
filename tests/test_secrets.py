"""Credentials at rest: encrypted, decryptable through key rotation, and re-encryptable."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.fernet import Fernet

from sync import Engine
from sync.base.secrets import SecretBox
from sync.errors import SecretsError
from tests.conftest import make_settings


def test_rotation_keeps_old_credentials_readable_then_moves_them_to_the_new_key(
    schema: str, admin: Any
) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    with Engine(make_settings(schema, secret_keys=old)) as engine:
        engine.migrate()
        ws = engine.create_workspace("acme")
        for name in ("a", "b", "c"):
            engine.create_connection(
                ws.id,
                name,
                "memory",
                config={"dataset": "x"},
                credentials={"token": f"token-{name}-123456"},
            )
    stored = admin.execute("SELECT credentials FROM connections ORDER BY id").fetchall()
    assert all(b"token-" not in bytes(r["credentials"]) for r in stored)

    with Engine(make_settings(schema, secret_keys=f"{new},{old}")) as engine:
        assert engine.rotate_secret_keys(batch=2) == 3
    only_new = SecretBox([new])
    rows = admin.execute("SELECT credentials FROM connections ORDER BY id").fetchall()
    assert [only_new.decrypt(r["credentials"])["token"] for r in rows] == [
        "token-a-123456",
        "token-b-123456",
        "token-c-123456",
    ]
    with pytest.raises(SecretsError, match="cannot be decrypted with the configured keys"):
        SecretBox([old]).decrypt(rows[0]["credentials"])


def test_a_malformed_key_is_a_clear_error() -> None:
    with pytest.raises(SecretsError, match="malformed key"):
        SecretBox(["not-a-fernet-key"])
