"""``scalpel fix`` options: a frozen, validated dataclass (the CLI parses, this checks)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchscalpel.errors import UsageError
from torchscalpel.options import StageOptions

VERIFY_PAIRS = 3
"""Interleaved (original, patched) profile pairs ``--verify`` measures for a tune edit (tune confirms with 3)."""
VERIFY_STEPS = 20
"""Measured steps of each verification profile: short, the effect not the whole run."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FixOptions(StageOptions):
    """What ``scalpel fix`` reads and does."""

    run_dirs: tuple[Path, ...]
    """Run folders (or their run.json) of tune / doctor / memory runs of one script."""
    apply: bool = False
    """Write the patched files in place (all or none)."""
    patch: Path | None = None
    """Also write the diff to this file."""
    verify: bool = False
    """Apply the patch to a copy of the script's folder and re-run it (see :mod:`torchscalpel.fix.verify`)."""
    force: bool = False
    """``--apply`` on a git tree with uncommitted changes."""
    pairs: int = VERIFY_PAIRS
    steps: int = VERIFY_STEPS
    cwd: Path | None = None
    """The folder fix runs from (None: the current one): its git root, or the folder itself, is the only
    tree fix edits (:func:`torchscalpel.fix.files.user_tree`), whatever the records name."""

    def __post_init__(self) -> None:
        if not self.run_dirs:
            raise UsageError("scalpel fix needs at least one RUN_DIR (a tune, doctor or memory run folder).")
        for run in self.run_dirs:
            if not (run / "run.json").is_file() and not (run.is_file() and run.name.endswith(".json")):
                raise UsageError(
                    f"{run} is not a run folder (no run.json in it); pass a 'scalpel tune', 'scalpel doctor' or 'scalpel memory' output folder."
                )
        if self.pairs < 1:
            raise UsageError("--pairs must be at least 1.")
        if self.steps < 1:
            raise UsageError("--steps must be at least 1.")
        if self.patch is not None and self.patch.is_dir():
            raise UsageError(f"--patch {self.patch} is a folder; give a file name such as fix.patch.")

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> FixOptions:
        """What ``scalpel fix``'s parsed flags ask for."""
        return cls(
            run_dirs=tuple(args.runs),
            apply=args.apply,
            patch=args.patch,
            verify=args.verify,
            force=args.force,
            pairs=args.pairs,
            steps=args.steps,
            **fields,
        )
