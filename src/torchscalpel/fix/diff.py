"""The unified diff ``scalpel fix`` writes: ``git apply`` / ``patch -p1`` format, paths relative to the
user's tree, opened by a comment block a reviewer reads first (both tools skip text before the first
``---`` header)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path


def file_diff(rel: str, before: str, after: str) -> str:
    """The unified diff of one file, ``a/REL`` -> ``b/REL`` (3 lines of context)."""
    if before == after:
        return ""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
    )
    out = []
    for line in lines:
        out.append(line)
        if not line.endswith("\n"):  # a file without a final newline
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def header(lines: Sequence[str]) -> str:
    """The comment block: each line as ``# ...`` (never starting like a diff header)."""
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


def patch_text(head: Sequence[str], changes: dict[Path, tuple[str, str]], root: Path) -> str:
    """Header, then each changed file's diff in path order (``changes``: path -> (before, after))."""
    body = "".join(
        file_diff(path.relative_to(root).as_posix(), before, after)
        for path, (before, after) in sorted(changes.items())
    )
    return header(head) + ("\n" + body if body else "")
