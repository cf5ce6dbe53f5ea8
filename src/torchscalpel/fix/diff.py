"""The unified diff ``scalpel fix`` writes: ``git apply`` / ``patch -p1`` format, paths relative to the
user's tree, opened by a comment block a reviewer reads first (both tools skip text before the first
``---`` header).

A file that declares another encoding than UTF-8 (PEP 263) has its hunks in its own bytes, as ``git diff``
writes them: those bytes are carried in the text as ``surrogateescape`` characters, so the patch text
encoded as UTF-8 with ``errors="surrogateescape"`` is the patch ``git apply`` applies to that file."""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path


def _in_encoding(line: str, encoding: str) -> str:
    """``line`` as the bytes ``encoding`` gives it, carried as UTF-8 text with surrogate escapes."""
    return line.encode(encoding).decode("utf-8", "surrogateescape")


def file_diff(rel: str, before: str, after: str, encoding: str = "utf-8") -> str:
    """The unified diff of one file, ``a/REL`` -> ``b/REL`` (3 lines of context)."""
    if before == after:
        return ""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
    )
    out = []
    plain = encoding.replace("_", "-").lower() in ("utf-8", "utf8", "utf-8-sig")
    for line in lines:
        if not plain and not line.startswith(("--- a/", "+++ b/")):
            line = _in_encoding(line, encoding)
        out.append(line)
        if not line.endswith("\n"):  # a file without a final newline
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def printable(text: str) -> str:
    """``text`` with control characters (a line break, an escape sequence) shown as ``?``: the header
    quotes a record's strings (its name, command, machine), and a record is data that must not add a
    line to the patch, a hunk ``git apply`` would apply, or a terminal control sequence."""
    return "".join("?" if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in text)


def header(lines: Sequence[str]) -> str:
    """The comment block: each line as ``# ...`` (never starting like a diff header)."""
    return "".join(f"# {printable(line)}".rstrip() + "\n" for line in lines)


def patch_text(
    head: Sequence[str],
    changes: dict[Path, tuple[str, str]],
    root: Path,
    encodings: Mapping[Path, str] | None = None,
) -> str:
    """Header, then each changed file's diff in path order (``changes``: path -> (before, after);
    ``encodings``: each file's declared encoding, UTF-8 when absent)."""
    body = "".join(
        file_diff(path.relative_to(root).as_posix(), before, after, (encodings or {}).get(path, "utf-8"))
        for path, (before, after) in sorted(changes.items())
    )
    return header(head) + ("\n" + body if body else "")
