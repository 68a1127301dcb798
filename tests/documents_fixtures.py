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
    """A ZIP of ``(name, content)`` members. Names in ``encrypted`` carry the encryption flag,
    names in ``symlinks`` are Unix symbolic links (their content is the link target)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compression) as archive:
        for name, content in members:
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = compression
            info.create_system = 3
            mode = stat.S_IFLNK | 0o777 if name in symlinks else stat.S_IFREG | 0o644
            info.external_attr = mode << 16
            if name in encrypted:
                info.flag_bits |= 0x1
            archive.writestr(info, content)
    return out.getvalue()
