"""The suite's record check: every run.json a torchscalpel stage wrote under a test's folder must satisfy
``torchscalpel.record_check.check_invariants`` (issue 27). ``tests/conftest.py``'s autouse fixture calls
:func:`record_violations` after each test."""

from __future__ import annotations

from pathlib import Path

RECORD_CHECK_ENV = "SCALPEL_RECORD_CHECK"
"""``strict`` (default): a test whose tmp_path holds a run.json breaking a record invariant fails in teardown;
``warn``: a warning instead; ``off``: not checked."""

KNOWN_VIOLATIONS: tuple[tuple[str, str], ...] = (
    # (substring of the violation, the defect it stands for). Remove an entry when its fix lands.
)
"""Violations of defects being fixed elsewhere: reported as warnings, not failures, until their fixes land."""


def _written_by_torchscalpel(path: Path) -> bool:
    """A record a stage wrote: ``record.new_run_record`` stamps ``tool_version``. Records a test builds by hand
    (``RunRecord(...)`` fakes, corrupt files, newer majors for the error paths) have none and are not checked."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: a hostile 100k-deep file (issue 30)
        return False
    return isinstance(data, dict) and bool(data.get("tool_version"))


def record_violations(root: Path) -> tuple[list[str], list[str]]:
    """``(failures, known)``: every broken invariant of every run.json a torchscalpel stage wrote under ``root``,
    as ``path: sentence``; ``known`` holds those of :data:`KNOWN_VIOLATIONS`, each with its defect."""
    from torchscalpel.errors import ScalpelError
    from torchscalpel.record_check import check_invariants

    failures, known = [], []
    for path in sorted(root.rglob("run.json")):
        if not _written_by_torchscalpel(path):
            continue
        try:
            found = check_invariants(path)
        except ScalpelError as exc:  # RecordVersionError included: a record no reader can load
            found = [f"does not load: {exc}"]
        for v in found:
            defect = next((d for key, d in KNOWN_VIOLATIONS if key in v), None)
            (known if defect else failures).append(
                f"{path.relative_to(root)}: {v}" + (f" [known: {defect}]" if defect else "")
            )
    return failures, known
