"""Credentials at rest: Fernet tokens (AES-128-CBC + HMAC), with key rotation through
MultiFernet. Keys come from ``CONNECTOR_SYNC_SECRET_KEYS`` (comma-separated, the first one
encrypts); without it, a key file under ``$CONNECTOR_SYNC_HOME`` is created on first use."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from sync.base.settings import Settings
from sync.errors import SecretsError

log = logging.getLogger(__name__)


class SecretBox:
    def __init__(self, keys: list[str]) -> None:
        if not keys:
            raise SecretsError("no secret key configured; set CONNECTOR_SYNC_SECRET_KEYS")
        try:
            self._fernet = MultiFernet([Fernet(k.strip().encode()) for k in keys])
        except ValueError:
            raise SecretsError(
                "CONNECTOR_SYNC_SECRET_KEYS holds a malformed key; each key is 32 url-safe "
                "base64 bytes, as printed by `python -c 'from cryptography.fernet import "
                "Fernet; print(Fernet.generate_key().decode())'`"
            ) from None

    @classmethod
    def from_settings(cls, settings: Settings) -> SecretBox:
        keys = configured_keys(settings)
        return cls(keys if keys is not None else [_key_file(settings.home)])

    def encrypt(self, credentials: Mapping[str, Any]) -> bytes:
        return self._fernet.encrypt(json.dumps(dict(credentials)).encode())

    def decrypt(self, token: bytes) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self._fernet.decrypt(bytes(token)))
        except InvalidToken:
            raise SecretsError(
                "stored credentials cannot be decrypted with the configured keys; add the key "
                "they were encrypted with to CONNECTOR_SYNC_SECRET_KEYS"
            ) from None
        return data

    def rotate(self, token: bytes) -> bytes:
        """Re-encrypt ``token`` under the first (newest) key."""
        return self._fernet.rotate(bytes(token))


def configured_keys(settings: Settings) -> list[str] | None:
    """The keys of CONNECTOR_SYNC_SECRET_KEYS, the one that encrypts first; None when unset."""
    if settings.secret_keys is None:
        return None
    return [k.strip() for k in settings.secret_keys.get_secret_value().split(",") if k.strip()]


def key_file(home: Path) -> Path:
    """Where one machine keeps its key when CONNECTOR_SYNC_SECRET_KEYS is unset."""
    return home / "secret.key"


def _key_file(home: Path) -> str:
    path = key_file(home)
    if path.exists():
        return path.read_text().strip()
    home.mkdir(parents=True, exist_ok=True)
    key = Fernet.generate_key().decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    log.warning(
        "created a credentials key at %s; set CONNECTOR_SYNC_SECRET_KEYS on servers so every "
        "machine shares one key",
        path,
    )
    return key
