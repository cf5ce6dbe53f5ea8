"""``scalpel tune --patch``, ``scalpel doctor --patch``, ``scalpel memory --patch``: the diff
``scalpel fix RUN_DIR`` would print, written as ``fix.patch`` in the stage's own run folder.

The stage's own work is done and its record saved before this runs; nothing here fails the stage: a
missing libcst, a script that changed during the run, a fix that cannot place anything are each one
line, and the stage's exit code stays its own.
"""

from __future__ import annotations

from pathlib import Path

from torchscalpel.errors import ScalpelError, UsageError

PATCH_FILE = "fix.patch"
INSTALL = "scalpel: --patch edits your code with libcst, which is not installed; run: pip install 'torchscalpel[fix]'"


def write_run_patch(run_dir: Path) -> list[str]:
    """Write ``run_dir/fix.patch`` (only when there is a diff) and return the lines to print: where it
    is and how many changes are ``not patched``, or why there is none."""
    try:
        import libcst  # noqa: F401
    except ImportError:
        return [INSTALL + "."]
    from torchscalpel.fix.options import FixOptions
    from torchscalpel.fix.stage import mark_result, plan_and_edit, render_patch, write_patch

    if not (run_dir / "run.json").is_file():
        return [f"scalpel: --patch: {run_dir} holds no run.json, so there is nothing to patch from."]
    try:
        result = plan_and_edit(FixOptions(run_dirs=(run_dir,)))
    except (UsageError, ScalpelError) as exc:
        return [f"scalpel: --patch: {exc}"]
    missed = sum(1 for i in result.items if i.status == "not patched")
    tail = f"; {missed} not patched (see 'scalpel fix {run_dir}')" if missed else ""
    if not result.changes:
        return [f"fix: no diff for your code{tail or ' (nothing fix edits)'}"]
    path = run_dir / PATCH_FILE
    write_patch(path, render_patch(result))
    mark_result(
        result
    )  # the patched file, once applied, is known to a later 'scalpel fix' as this patch's result
    return [f"fix: {path} ({len(result.changes)} file(s); apply with git apply{tail})"]
