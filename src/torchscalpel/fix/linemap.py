"""Where a line of the code a run measured is in the file after ``scalpel fix`` patched it.

The runs record lines of the original file; after ``--apply`` (or ``git apply`` of fix's diff) the
same statements sit lower wherever a line was added above them. ``fix.json`` keeps, for each file
fix changed, where each original line went (:func:`line_map`), and a later ``scalpel fix`` on the
patched file carries every edit's lines through that map (:func:`remap`) before the edit looks at its
line: so an edit finds its own earlier result at the line and says ``already``, instead of reading a
neighbour.

A line inside a changed region goes to the most similar line of the region's new text, in order
(``opt.step()`` to ``scaler.step(opt)``, ``loss.backward()`` to ``scaler.scale(loss).backward()``, the
forward to itself inside the ``with torch.autocast(...)`` block that now holds it); a deleted line to
the line after the region.
"""

from __future__ import annotations

import dataclasses
import difflib

from torchscalpel.fix.cst import Edit

LineMap = list[int]
"""For each line of the original file (index 0 is line 1), its 1-based line in the patched file."""


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a.strip(), b.strip(), autojunk=False).ratio()


def line_map(before: str, after: str) -> LineMap:
    """Where each line of ``before`` is in ``after`` (see the module doc)."""
    old, new = before.splitlines(), after.splitlines()
    out: LineMap = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out += [j1 + k + 1 for k in range(i2 - i1)]
        elif tag == "delete" or j2 == j1:
            out += [j1 + 1] * (i2 - i1)
        elif tag == "replace":
            at = j1  # in order: each line at or after the one before it
            for i in range(i1, i2):
                left = i2 - i - 1  # keep one new line for each old line still to place, when there are enough
                last = max(at, j2 - 1 - left) if j2 - j1 >= i2 - i1 else j2 - 1
                best = max(range(at, last + 1), key=lambda j: _similarity(old[i], new[j]))
                out.append(best + 1)
                at = best
    return out


def map_line(table: LineMap, line: int) -> int:
    """The 1-based ``line`` of the original file, in the patched one (0 stays 0: no line)."""
    if line <= 0 or not table:
        return line
    if line <= len(table):
        return table[line - 1]
    return line + table[-1] - len(table)


def remap(edit: Edit, ops: LineMap) -> Edit:
    """``edit`` with its lines (``line``, ``end_line``, ``anchors``) carried into the patched file."""
    return dataclasses.replace(
        edit,
        line=map_line(ops, edit.line),
        end_line=map_line(ops, edit.end_line),
        anchors=tuple((role, map_line(ops, n)) for role, n in edit.anchors),
    )
