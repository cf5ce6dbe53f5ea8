"""Small file helpers shared by every stage that writes results."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from pathlib import Path

STDOUT_NAME = "-"
"""The path that means standard output, for every ``--json`` (``--json -``)."""

_result_stream = (
    None  # where "-" writes: the real stdout, saved by the entry point before it points sys.stdout at stderr
)


def is_stdout(path: object) -> bool:
    """True when ``path`` is ``-`` (standard output)."""
    return str(path) == STDOUT_NAME


def claim_stdout() -> None:
    """Reserve standard output for a ``-`` result: scalpel's own (and the script's) printing goes to
    stderr from here on, so ``--json - | jq`` reads pure JSON."""
    import sys

    global _result_stream
    if _result_stream is None:
        _result_stream = sys.stdout
        sys.stdout = sys.stderr


def release_stdout() -> None:
    """Undo :func:`claim_stdout` (the entry point calls it when the command ends)."""
    import sys

    global _result_stream
    if _result_stream is not None:
        sys.stdout, _result_stream = _result_stream, None


def _write_stdout(text: str) -> None:
    import sys

    stream = _result_stream or sys.stdout
    stream.write(text if text.endswith("\n") else text + "\n")
    stream.flush()


def atomic_write_text(path: Path, text: str, *, mode: int = 0o644, errors: str | None = None) -> Path:
    """Write ``text`` to ``path`` via a temp file in the same folder and a rename.

    A crash mid-write never leaves half a file in place of a good one; the temp file is removed
    on failure. ``mode`` is set explicitly because ``mkstemp`` creates files private to the user.
    An existing path that is not a regular file (``/dev/stdout``, ``/dev/full``, a pipe) is written
    to in place: a rename would replace the device node itself (as root, ``/dev/full`` became a file).
    ``-`` writes to standard output (:func:`is_stdout`).

    Text UTF-8 cannot hold (a lone surrogate from a record's strings, e.g. ``\\ud800``) is written as a
    backslash escape (:data:`TEXT_ERRORS`), never a UnicodeEncodeError, unless ``errors`` names another
    UTF-8 encoder handler (``surrogateescape`` writes text that carries undecoded bytes, such as a latin-1
    file's diff, as those bytes). An OSError keeps its type and carries ``path`` as its ``filename`` (a
    failed ``write`` on a device has none of its own), so that the entry point's one sentence names the file.
    """
    if is_stdout(path):
        _write_stdout(text)
        return Path(path)
    path = Path(path)
    try:
        if path.exists() and not path.is_file() and not path.is_dir():
            with path.open("w", encoding="utf-8", errors=errors or TEXT_ERRORS) as fh:
                fh.write(text)
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _named(exc, path) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors=errors or TEXT_ERRORS) as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)  # nothing half-written is left behind
        if isinstance(exc, OSError):
            raise _named(exc, path) from None
        raise
    return path


TEXT_ERRORS = "backslashreplace"
"""How every text file scalpel writes handles what UTF-8 cannot encode (lone surrogates): escaped."""


def _named(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path``: a failed ``write`` on a device names no file (ENOSPC on /dev/full) and a
    failed rename names the temporary file, neither of which the user typed."""
    exc.filename, exc.filename2 = str(path), None
    return exc


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks (checkpoint manifests and export bundles)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def user_cache_dir() -> Path:
    """torchscalpel's folder in the user's cache: ``$TORCHSCALPEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/torchscalpel``,
    else ``~/.cache/torchscalpel``. It holds what outlives one run folder (the compiled snapshot scanner, the batch
    history of each script's launches); the folder is the user's own, so what is read back from it is theirs."""
    if os.environ.get("TORCHSCALPEL_CACHE_DIR"):
        return Path(os.environ["TORCHSCALPEL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torchscalpel"


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


def _nearest_existing(path: Path) -> Path:
    return next((p for p in [path, *path.parents] if p.exists()), Path("/"))


def _probe_folder(folder: Path) -> str | None:
    """None when a file can be made in ``folder`` (tried, then removed); else why not (a phrase)."""
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:
        probe = tempfile.mkdtemp(dir=folder, prefix=".scalpel-probe-")
        os.rmdir(probe)
    except OSError as exc:
        return f"{folder} is not writable ({exc.strerror or exc})"
    return None


def check_output_dir(path: Path, flag: str = "--out") -> None:
    """Raise :class:`UsageError` (one sentence) unless ``path`` is, or can be created as, a writable folder.

    Run before any work, so ``--out`` under ``/proc`` or onto an existing file is refused at once.
    """
    from torchscalpel.errors import UsageError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is an existing file, not a folder; name a new or existing folder.")
    why = _probe_folder(path if path.exists() else _nearest_existing(path.parent))
    if why is not None:
        raise UsageError(f"Cannot write {flag} {path}: {why}; choose another folder.")


def check_output_file(path: Path, flag: str) -> None:
    """Raise :class:`UsageError` (one sentence) unless ``path`` can be written as a file (checked before work)."""
    from torchscalpel.errors import UsageError

    if is_stdout(path):
        return
    path = Path(path)
    if path.is_dir():
        suffix = {"--sarif": ".sarif", "--html": ".html", "--patch": ".patch"}.get(flag, ".json")
        raise UsageError(f"{flag} {path} is a folder; name a file, e.g. {path / ('result' + suffix)}.")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise UsageError(f"Cannot write {flag} {path}: it is not writable; choose another path.")
        return
    if not path.parent.exists():
        raise UsageError(
            f"{flag} {path}: folder {path.parent} does not exist; create it or choose another path."
        )
    why = _probe_folder(path.parent)
    if why is not None:
        raise UsageError(f"Cannot write {flag} {path}: {why}; choose another path.")


def write_output_text(path: Path, text: str, *, flag: str) -> Path:
    """Write a result file the user named; any OS failure (a full disk, ``/dev/full``, a folder) is a
    :class:`UsageError` sentence. A regular file is replaced atomically; a device or pipe is written to."""
    from torchscalpel.errors import UsageError

    if is_stdout(path):
        _write_stdout(text)
        return Path(path)
    path = Path(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "it is a folder")
        return atomic_write_text(path, text)
    except OSError as exc:
        raise UsageError(
            f"Could not write {flag} {path}: {exc.strerror or exc}; choose another path."
        ) from None


def finite_json(obj):
    """``obj`` with every NaN / infinite float (numpy ones included) replaced by None, numpy scalars as
    Python numbers: what ``json.dumps(..., allow_nan=False)`` accepts, so no bare ``NaN`` is ever written."""
    import math

    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_json(v) for v in obj]
    if isinstance(obj, bool | int | str) or obj is None:
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    item = getattr(obj, "item", None)  # numpy scalars and 0-d arrays
    if callable(item):
        try:
            return finite_json(item())
        except (TypeError, ValueError):
            return obj
    return obj
