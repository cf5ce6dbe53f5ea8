"""Small file helpers shared by every stage that writes results."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from pathlib import Path


def atomic_write_text(path: Path, text: str, *, mode: int = 0o644) -> Path:
    """Write ``text`` to ``path`` via a temp file in the same folder and a rename.

    A crash mid-write never leaves half a file in place of a good one; the temp file is removed
    on failure. ``mode`` is set explicitly because ``mkstemp`` creates files private to the user.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks (checkpoint manifests and export bundles)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def default_run_dir(name: str, root: Path | None = None) -> Path:
    """``scalpel-runs/<YYYYmmdd-HHMMSS>-<name>/`` (a numeric suffix if it already exists)."""
    base = root or Path("scalpel-runs")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name) or "run"
    candidate = base / f"{stamp}-{safe}"
    n = 1
    while candidate.exists():
        n += 1
        candidate = base / f"{stamp}-{safe}-{n}"
    return candidate
