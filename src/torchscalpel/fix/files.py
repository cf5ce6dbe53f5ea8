"""The user's files as ``scalpel fix`` may touch them: which tree it edits, and how a file is read and
written back.

- The tree is decided from where fix runs: the git root above the current folder, or the folder itself
  outside a repository (:func:`user_tree`), never from a path in a record (a run folder may come from
  anyone). The file system's root and home folders are refused: a tree that wide is no project.
  Every file fix edits, and the script ``--verify`` runs, must lie under it (:func:`inside`).
- A file is read in the encoding it declares (PEP 263: a ``# -*- coding: latin-1 -*-`` line, a UTF-8
  byte-order mark; UTF-8 otherwise) with its line endings as they are (:func:`read_source`), and
  written back in the same encoding (:func:`encode_source`), so a patch changes only what it edits.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

from torchscalpel.errors import UsageError


def _home() -> Path | None:
    try:
        return Path.home().resolve()
    except (RuntimeError, KeyError):  # no HOME and no passwd entry
        return None


def _too_wide(root: Path) -> str:
    """Why ``root`` is no project tree ("" when it is one): the file system's root, a home folder,
    or a folder above one."""
    if root == Path(root.anchor):
        return "the file system's root"
    home = _home()
    if home is not None:
        if root == home or root in home.parents:
            return "a home folder" if root == home else "a folder that holds home folders"
        # another user's home (/home/alice beside /home/bob), unless homes sit right under the root
        if home.parent != Path(home.anchor) and root.parent == home.parent:
            return "a home folder"
    return ""


def user_tree(cwd: Path) -> Path:
    """The tree fix may edit: the git root above ``cwd`` (a ``.git`` folder, or the file a worktree
    has), else ``cwd`` itself; refused in one sentence when that is ``/`` or a home folder."""
    here = cwd.resolve()
    root = next((p for p in (here, *here.parents) if (p / ".git").exists()), here)
    why = _too_wide(root)
    if why:
        raise UsageError(
            f"scalpel fix edits only files under the folder it runs from (its git root), and that is {root}, "
            f"{why}; run it from your project's folder."
        )
    return root


def inside(root: Path, path: Path) -> Path:
    """``path`` resolved (links followed), refused in one sentence when it lies outside ``root``."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise UsageError(
            f"{path} is outside your tree ({root}); scalpel fix edits and runs only files under the folder "
            "it runs from (its git root), whatever a run record names, so nothing was changed."
        )
    return resolved


def read_source(path: Path) -> tuple[str, str]:
    """``path``'s text and the encoding it declares (PEP 263), line endings kept."""
    data = path.read_bytes()
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding), encoding
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"{path} cannot be read as Python source in the encoding it declares ({exc}); fix edits Python files only."
        ) from None


def encode_source(path: Path, text: str, encoding: str) -> bytes:
    """``text`` as ``path``'s bytes in its own ``encoding``; refused in one sentence when the edit put
    in a character that encoding cannot hold."""
    try:
        return text.encode(encoding)
    except UnicodeEncodeError:
        raise UsageError(
            f"the patch of {path} holds characters its declared encoding ({encoding}) cannot hold, so nothing was written."
        ) from None
