"""Commit protocol for checkpoint folders: SHA-256 manifest, commit marker, atomic rename, fsync.

A checkpoint is written into ``.tmp-step-N/``; only after every file is on disk does rank 0 write
``MANIFEST.json`` (size and SHA-256 of each file) and then ``COMMIT`` (the step and the manifest's
own hash), fsync the folder, rename it to ``step-N`` (atomic on POSIX) and fsync the parent. A
crash at any point leaves either no ``step-N`` or a complete one, so :func:`latest` never sees
half a checkpoint. Folder names are ``step-`` plus the step zero-padded to 9 digits.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import re
import shutil
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torchscalpel.errors import ScalpelError
from torchscalpel.fileio import sha256_file

MANIFEST = "MANIFEST.json"
COMMIT = "COMMIT"
LOCK = ".writer.lock"
FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^step-(\d{9,})$")


class CheckpointError(ScalpelError):
    """A checkpoint that is incomplete, tampered with, or does not match what is being resumed."""


def step_dir(root: Path, step: int) -> Path:
    """``root/step-000000042`` for step 42."""
    return root / f"step-{step:09d}"


def tmp_dir(root: Path, step: int) -> Path:
    """Where step ``step`` is written before it is committed."""
    return root / f".tmp-step-{step:09d}"


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's entry list is what makes a rename durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it before returning."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _payload_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST, COMMIT))


def read_key(path: str | Path) -> bytes:
    """The HMAC key in file ``path`` (``sign_key=``): its bytes, at least 16 of them."""
    try:
        key = Path(path).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"Cannot read the signing key {path} ({exc.strerror or exc}).") from None
    if len(key.strip()) < 16:
        raise CheckpointError(
            f"The signing key {path} holds {len(key.strip())} bytes; use at least 16 random bytes "
            "(e.g. head -c 32 /dev/urandom > KEY)."
        )
    return key


def _signature(key: bytes, manifest_bytes: bytes) -> str:
    return hmac.new(key, manifest_bytes, hashlib.sha256).hexdigest()


def commit(tmp: Path, final: Path, step: int, *, key: bytes | None = None) -> None:
    """Manifest, commit marker, atomic rename, parent fsync. Refuses to replace ``final``.

    With ``key``, ``COMMIT`` also holds the HMAC-SHA256 of the manifest (tamper evidence).
    """
    if final.exists():
        raise CheckpointError(f"{final} already exists; checkpoints are never overwritten (save a new step).")
    files = {
        str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in _payload_files(tmp)
    }
    manifest = json.dumps(
        {"format": FORMAT_VERSION, "step": step, "files": files}, indent=1, sort_keys=True
    ).encode()
    write_durable(tmp / MANIFEST, manifest)
    marker = {"step": step, "manifest_sha256": hashlib.sha256(manifest).hexdigest()}
    if key is not None:
        marker["hmac_sha256"] = _signature(key, manifest)
    write_durable(tmp / COMMIT, json.dumps(marker).encode())
    for sub in sorted(
        {p.parent for p in _payload_files(tmp)} | {tmp}, key=lambda p: len(p.parts), reverse=True
    ):
        fsync_path(sub)
    os.rename(tmp, final)
    fsync_path(final.parent)


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a folder is not a usable checkpoint: ``incomplete`` (crash) or ``tampered`` (bytes differ)."""

    kind: str
    message: str


def _manifest_problem(manifest: object) -> str | None:
    """What is wrong with the shape of a parsed manifest, or None."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return "has no files table"
    fmt = manifest.get("format", 0)
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        return f"has a format of {fmt!r}, not an integer"
    for name, info in manifest["files"].items():
        parts = Path(name).parts
        if not parts or Path(name).is_absolute() or ".." in parts:
            return f"lists {name!r}, which is not a file inside the checkpoint"
        if not isinstance(info, dict):
            return f"entry {name!r} is not a table"
        size, digest = info.get("size"), info.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return f"entry {name!r} has no valid size"
        if not isinstance(digest, str) or len(digest) != 64:
            return f"entry {name!r} has no valid sha256"
    return None


def check(folder: Path, *, full: bool = True, key: bytes | None = None) -> Problem | None:
    """None when ``folder`` is a complete checkpoint whose files match the manifest.

    ``full=False`` checks presence and sizes only (cheap, for listing); ``full=True`` also
    re-hashes every file. With ``key`` the manifest must carry a matching HMAC-SHA256 in ``COMMIT``.
    """
    marker_path, manifest_path = folder / COMMIT, folder / MANIFEST
    if not marker_path.is_file() or not manifest_path.is_file():
        return Problem("incomplete", f"{folder} has no {COMMIT} marker or {MANIFEST}; it was never committed")
    manifest_bytes = manifest_path.read_bytes()
    try:
        marker = json.loads(marker_path.read_bytes())
        manifest = json.loads(manifest_bytes)
    except (ValueError, RecursionError):
        return Problem("tampered", f"{folder}/{MANIFEST} or {COMMIT} is not valid JSON")
    if not isinstance(marker, dict) or not isinstance(marker.get("manifest_sha256"), str):
        return Problem("tampered", f"{folder}/{COMMIT} is not a commit marker (no manifest_sha256)")
    if marker["manifest_sha256"] != hashlib.sha256(manifest_bytes).hexdigest():
        return Problem("tampered", f"{folder}/{MANIFEST} does not match the hash in {COMMIT}")
    if key is not None:
        signature = marker.get("hmac_sha256")
        if not isinstance(signature, str):
            return Problem("unsigned", f"{folder}/{COMMIT} carries no signature, and a signing key was given")
        if not hmac.compare_digest(signature, _signature(key, manifest_bytes)):
            return Problem(
                "tampered", f"{folder}/{MANIFEST} does not match its signature under the given key"
            )
    bad = _manifest_problem(manifest)
    if bad is not None:
        return Problem("tampered", f"{folder}/{MANIFEST} {bad}")
    files = manifest["files"]
    if manifest.get("format", 0) > FORMAT_VERSION:
        return Problem(
            "tampered", f"{folder} was written by a newer torchscalpel (format {manifest['format']})"
        )
    present = {str(p.relative_to(folder)) for p in _payload_files(folder)}
    extra = present - set(files)
    if extra:
        return Problem("tampered", f"{folder} holds files the manifest does not list: {sorted(extra)[0]}")
    for name, info in files.items():
        path = folder / name
        if not path.is_file():
            return Problem("tampered", f"{path} is listed in the manifest but missing")
        if path.stat().st_size != info["size"]:
            return Problem(
                "tampered", f"{path} has {path.stat().st_size} bytes, the manifest says {info['size']}"
            )
        if full and sha256_file(path) != info["sha256"]:
            return Problem("tampered", f"{path} does not match its SHA-256 in the manifest")
    return None


def is_step_folder(folder: Path) -> bool:
    """True for a folder that carries (or should carry) this module's manifest: it has ``COMMIT`` or
    ``MANIFEST.json``, or is named ``step-N`` the way :func:`step_dir` names it."""
    return (folder / COMMIT).exists() or (folder / MANIFEST).exists() or bool(_STEP_RE.match(folder.name))


def verify(folder: Path, *, action: str = "load", key: bytes | None = None) -> None:
    """Raise :class:`CheckpointError` unless every file of ``folder`` matches its manifest (full hash).

    The one verification every reader (``Checkpointer.load``, ``consolidate``, ``scalpel export``)
    runs before it parses any file of the checkpoint.
    """
    problem = check(folder, full=True, key=key)
    if problem is not None:
        raise CheckpointError(f"Refusing to {action} {folder}: {problem.message}.")


def newest_verified(root: Path, key: bytes | None = None) -> tuple[Path | None, list[str]]:
    """The newest ``step-N`` under ``root`` whose files all match its manifest (full hash), and one
    line per newer step that was passed over and why."""
    skipped: list[str] = []
    for _, folder in committed_steps(root):
        problem = check(folder, full=True, key=key)
        if problem is None:
            return folder, skipped
        skipped.append(f"{folder.name}: {problem.message}")
    return None, skipped


def committed_steps(root: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` for every ``step-N`` folder under ``root``, newest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_RE.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found, reverse=True)


def scan(root: Path) -> tuple[Path | None, list[tuple[Path, Problem]]]:
    """The newest committed, complete checkpoint under ``root`` (presence and sizes checked), and
    every newer ``step-N`` folder passed over with the reason."""
    broken: list[tuple[Path, Problem]] = []
    for _, folder in committed_steps(root):
        problem = check(folder, full=False)
        if problem is None:
            return folder, broken
        broken.append((folder, problem))
    return None, broken


def latest(root: Path) -> Path | None:
    """The newest committed, complete checkpoint under ``root`` (presence and sizes checked).

    Folders that fail the cheap check are skipped (they cannot come from a crash, but a copy
    interrupted half-way can produce them); the caller re-hashes the one it loads. The
    ``Checkpointer`` also warns about them and moves them aside (:func:`move_aside`).
    """
    return scan(root)[0]


def move_aside(folder: Path) -> Path:
    """Rename a broken ``step-N`` to ``step-N.broken-<UTC time>`` (kept for inspection, no longer a
    step: :func:`committed_steps` and :func:`prune` ignore it) so that step can be saved again."""
    import time

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = folder.with_name(f"{folder.name}.broken-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{folder.name}.broken-{stamp}-{n}")
    os.rename(folder, target)
    fsync_path(folder.parent)
    return target


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` committed checkpoints and stale temp folders; return them."""
    removed = []
    for _, folder in committed_steps(root)[keep:]:
        # Rename first so a crash mid-delete never leaves a half-deleted folder named step-N.
        doomed = folder.with_name(".del-" + folder.name)
        os.rename(folder, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(folder)
    for stale in root.glob(".del-step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return removed


_HELD: dict[tuple[int, int], list[int]] = {}  # (device, inode) of a lock file -> [fd, holders here]
_HELD_GUARD = threading.Lock()


def _forget_locks_in_child() -> None:
    # A forked child (a DataLoader worker) shares the lock's open file; closing its copy keeps the
    # lock with the parent only, so a killed rank's lingering workers never block its relaunch.
    for fd, _ in _HELD.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)


def lock_root(root: Path) -> Callable[[], None]:
    """Take the writer lock of checkpoint folder ``root`` (``fcntl.flock`` on ``root/.writer.lock``);
    return the function that releases it.

    The OS drops the lock when the process exits or is killed, so a crashed run never leaves the
    folder locked. Several Checkpointers of one process share the lock (the same run re-creating
    its Checkpointer); another process gets :class:`CheckpointError`.
    """
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    info = os.fstat(fd)
    key = (info.st_dev, info.st_ino)
    with _HELD_GUARD:
        if key in _HELD:
            os.close(fd)
            _HELD[key][1] += 1
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise CheckpointError(
                    f"{root} is being written by another process ({holder}); two runs saving into one checkpoint "
                    "folder corrupt each other's steps, so give this run its own folder or stop the other one."
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
            _HELD[key] = [fd, 1]
    released = False

    def release() -> None:
        nonlocal released
        with _HELD_GUARD:
            if released:
                return
            released = True
            entry = _HELD.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del _HELD[key]
                fcntl.flock(entry[0], fcntl.LOCK_UN)
                os.close(entry[0])

    return release
