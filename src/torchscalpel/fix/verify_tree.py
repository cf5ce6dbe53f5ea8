"""The copies of the script's folder that ``scalpel fix --verify`` runs in, and what a run wrote there.

A training script writes into its own folder (checkpoints, logs) and may read it back on its next
start: a :class:`Tree` remembers each file's size and modification time as copied, names what a run
created or changed (:meth:`Tree.written`), and puts the copy back as it was made (:meth:`Tree.reset`:
what a run created is removed, what it changed is copied again), so that every measured run starts as
the first one did and only the second start of the plain-python check sees the first one's files.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

IGNORED_NAMES = (".git", "__pycache__", "scalpel-runs", "*.pyc", ".venv", "venv", "node_modules")
"""Not copied with the script's folder, nor counted as written by a run: history, caches, runs and
environments (large, not the code, and not what a script reads back)."""
IGNORED = shutil.ignore_patterns(*IGNORED_NAMES)

_Listing = dict[str, tuple[int, int]]

MAX_CHECKPOINTS_SCANNED = 200
"""torch zip files looked into for pickled objects (a bound: a folder of thousands of checkpoints
has its first ones looked at)."""
_ZIP_MAGIC = b"PK\x03\x04"


def _ignored(name: str) -> bool:
    return name in IGNORED_NAMES or name.endswith(".pyc")


def _listing(root: Path) -> tuple[_Listing, set[str]]:
    """Every file's (size, mtime in ns) and every folder, by path relative to ``root``."""
    files: _Listing = {}
    dirs: set[str] = set()
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if not _ignored(d)]
        rel = Path(folder).relative_to(root)
        dirs.update((rel / d).as_posix() for d in subdirs)
        for name in names:
            if _ignored(name):
                continue
            try:
                st = (Path(folder) / name).lstat()
            except OSError:
                continue
            files[(rel / name).as_posix()] = (st.st_size, st.st_mtime_ns)
    return files, dirs


@dataclass(slots=True)
class Tree:
    """A copy of the user's folder (with the patch written in, for the patched copy)."""

    path: Path
    source: Path
    """The user's folder it was copied from (read only)."""
    overrides: dict[str, bytes] = field(default_factory=dict)
    """Relative path -> the patched file's bytes (in the encoding it declares) written over the copy."""
    files: _Listing = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)

    @classmethod
    def copy(
        cls,
        source: Path,
        dest: Path,
        overrides: dict[str, bytes] | None = None,
        leave_out: Sequence[str] = (),
    ) -> Tree:
        """``source`` copied to ``dest`` (caches and environments left out, and the relative paths in
        ``leave_out``), ``overrides`` written in."""
        shutil.copytree(source, dest, ignore=IGNORED)
        tree = cls(dest, source, dict(overrides or {}))
        for rel in leave_out:
            (dest / rel).unlink(missing_ok=True)
        for rel, data in tree.overrides.items():
            (dest / rel).write_bytes(data)
        tree.files, tree.dirs = _listing(dest)
        return tree

    def written(self) -> list[str]:
        """Files a run created or changed since the copy was made (or last reset), sorted."""
        now, _ = _listing(self.path)
        return sorted(rel for rel, stat in now.items() if self.files.get(rel) != stat)

    def reset(self) -> None:
        """The copy as it was made: what runs created removed, what they changed or removed copied again."""
        now, dirs = _listing(self.path)
        for rel in sorted(dirs - self.dirs, key=len):
            shutil.rmtree(self.path / rel, ignore_errors=True)
        for rel in now:
            if rel not in self.files:
                (self.path / rel).unlink(missing_ok=True)
        for rel, stat in self.files.items():
            if now.get(rel) == stat:
                continue
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if rel in self.overrides:
                target.write_bytes(self.overrides[rel])
            else:
                shutil.copy2(self.source / rel, target)
            st = target.lstat()
            self.files[rel] = (st.st_size, st.st_mtime_ns)


def pickled_checkpoints(root: Path) -> list[str]:
    """Relative paths of the torch checkpoints under ``root`` that hold pickled objects (a whole
    module, a class of the script), found without unpickling them
    (``torch.serialization.get_unsafe_globals_in_checkpoint``): the files a ``whole-model-save`` patch
    changes the format of, which the patched script's ``weights_only=True`` load cannot read."""
    from torch.serialization import get_unsafe_globals_in_checkpoint

    found: list[str] = []
    seen = 0
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not _ignored(d))
        for name in sorted(names):
            path = Path(folder) / name
            try:
                with path.open("rb") as f:
                    if f.read(4) != _ZIP_MAGIC:
                        continue
            except OSError:
                continue
            seen += 1
            if seen > MAX_CHECKPOINTS_SCANNED:
                return found
            try:
                unsafe = get_unsafe_globals_in_checkpoint(str(path))
            except Exception:
                continue
            if unsafe:
                found.append(path.relative_to(root).as_posix())
    return found
