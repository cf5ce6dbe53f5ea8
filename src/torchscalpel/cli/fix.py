"""``scalpel fix RUN_DIR [RUN_DIR ...]``: the change tune and doctor runs measured, as a diff of your code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

# Not imported from fix.options: that loads the fix package, and every scalpel command builds this parser.
VERIFY_PAIRS, VERIFY_STEPS = 3, 20


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``fix`` sub-command."""
    p = subparsers.add_parser(
        "fix",
        help="turn what tune, doctor and memory runs measured into a patch of your own script (diff, --apply, --verify)",
        description="Read tune, doctor and memory run folders and print one unified diff of your own files: tune's kept "
        "settings, doctor's mechanical fixes and the memory ladder's first fitting code change, edited at the lines the run recorded (comments and layout kept). "
        "A change fix cannot place safely is listed as 'not patched' with the snippet to apply by hand. Nothing "
        "is written to your files without --apply.",
    )
    p.add_argument(
        "runs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="tune, doctor or memory run folders (or run.json files)",
    )
    p.add_argument(
        "--apply", action="store_true", help="write the patched files in place (all of them or none)"
    )
    p.add_argument(
        "--patch", type=Path, metavar="FILE", help="also write the diff to FILE (git apply / patch -p1)"
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="apply the patch to a copy of the script's folder and re-run it: plain python, doctor for doctor "
        "fixes, interleaved original/patched plain-python runs judged against the spread tune confirmed for tune "
        "settings, scalpel memory under the same limit for memory fixes",
    )
    p.add_argument(
        "--force", action="store_true", help="--apply even when the git tree has uncommitted changes"
    )
    p.add_argument(
        "--pairs",
        type=int,
        default=VERIFY_PAIRS,
        metavar="N",
        help=f"--verify of tune settings: interleaved (original, patched) plain-python runs (default {VERIFY_PAIRS})",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=VERIFY_STEPS,
        metavar="N",
        help=f"--verify of tune settings: optimizer steps timed in each run, after 3 warm-up steps (default {VERIFY_STEPS})",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Flags -> :class:`FixOptions` -> :func:`torchscalpel.stages.fix.run` -> the diff and the summary."""
    import torchscalpel.report.fix_terminal as fix_terminal
    from torchscalpel.fix.options import FixOptions
    from torchscalpel.stages import fix as stage

    result = stage.run(FixOptions.from_args(args))
    if result.patch:
        # A latin-1 file's hunks are in its own bytes (surrogate escapes in the text), as git diff prints them.
        buffer = getattr(sys.stdout, "buffer", None)
        if buffer is None:  # a text-only stream (an embedding program's): the text as it is
            sys.stdout.write(result.patch)
        else:
            sys.stdout.flush()
            buffer.write(result.patch.encode("utf-8", "surrogateescape"))
            buffer.flush()
    from torchscalpel.report.fix_sections import write_pages

    pages = write_pages([run_dir for run_dir, _ in result.records]) if result.changes else []
    for line in fix_terminal.render(result) + [
        # the path ends the line: a path past the edge is kept whole, prose after it would be cut by the wrap
        f"page (the diff, what was measured, verified or not): {p}"
        for p in pages[:1]
    ]:
        print(line, file=sys.stderr if result.patch else sys.stdout)
    if result.verification is not None and not result.verification.ok:
        return 1
    return 0
