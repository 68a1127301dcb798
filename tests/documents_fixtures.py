"""Documents built in code for the document tests: PDFs (fpdf2), ZIP archives (zipfile)."""

from __future__ import annotations

import io
import stat
import zipfile
from collections.abc import Sequence

from fpdf import FPDF
from PIL import Image


def pdf(pages: Sequence[str | None], *, user_password: str | None = None) -> bytes:
    """A PDF with one page per item: a text page for a string, an image-only page (a "scan",
    no text layer) for None."""
    doc = FPDF()
    doc.set_font("helvetica", size=12)
    for text in pages:
        doc.add_page()
        if text is None:
            picture = Image.new("RGB", (60, 40), (200, 30, 30))
            doc.image(picture, x=10, y=10, w=60)
        else:
            doc.multi_cell(0, 8, text)
    if user_password is not None:
        doc.set_encryption(owner_password="owner-secret", user_password=user_password)
    return bytes(doc.output())


def zip_bytes(
    members: Sequence[tuple[str, bytes]],
    *,
    compression: int = zipfile.ZIP_DEFLATED,
    encrypted: Sequence[str] = (),
    symlinks: Sequence[str] = (),
) -> bytes:
    """A ZIP of ``(name, content)`` members. Names in ``encrypted`` are flagged encrypted,
    names in ``symlinks`` are Unix symbolic links (their content is the link target)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compression) as archive:
        for name, content in members:
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = compression
            info.create_system = 3
            mode = stat.S_IFLNK | 0o777 if name in symlinks else stat.S_IFREG | 0o644
            info.external_attr = mode << 16
            archive.writestr(info, content)
    data = bytearray(out.getvalue())
    for name in encrypted:
        _flag_encrypted(data, name.encode())
    return bytes(data)


def _flag_encrypted(data: bytearray, name: bytes) -> None:
    """Set bit 0 of the general purpose flags ("encrypted", APPNOTE 4.4.4) of member ``name``
    in its local header and its central directory entry, as an encrypting archiver does.
    (zipfile cannot encrypt; every reader decides from this bit.)"""
    for signature, flags_at, name_length_at, name_at in (
        (b"PK\x03\x04", 6, 26, 30),
        (b"PK\x01\x02", 8, 28, 46),
    ):
        start = 0
        while (start := data.find(signature, start)) >= 0:
            length = int.from_bytes(
                data[start + name_length_at : start + name_length_at + 2], "little"
            )
            if data[start + name_at : start + name_at + length] == name:
                data[start + flags_at] |= 0x1
            start += 4
