"""Say, before the ranks start, that a launch will resume from an existing checkpoint (or start over).

A script that resumes with :meth:`Checkpointer.load` does so silently: a relaunch in a folder that
still holds last week's ``ckpt/`` continues last week's run. ``scalpel launch`` looks for
checkpoint folders among the folders in the current directory and the folders named in the
script's arguments, and prints ``resuming from ckpt/step-000000010; pass --fresh to start over``.
``--fresh`` moves each such folder aside (``ckpt.before-fresh-<UTC time>``, never deleted) so the
script finds nothing to resume.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from torchscalpel.distributed import manifest


@dataclass(slots=True, frozen=True)
class Resume:
    """A checkpoint folder and the committed step the script would resume from."""

    root: Path
    step: Path


def candidates(cwd: Path, script_args: list[str]) -> list[Path]:
    """Folders that may be the script's checkpoint folder: those in ``cwd`` and those its arguments name."""
    found: dict[Path, None] = {}
    try:
        for entry in sorted(cwd.iterdir()):
            if entry.is_dir() and not entry.name.startswith(".") and ".before-fresh-" not in entry.name:
                found[entry] = None
    except OSError:
        pass
    for arg in script_args:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if value and not value.startswith("-"):
            path = Path(value) if os.path.isabs(value) else cwd / value
            if path.is_dir():
                found[path] = None
    return list(found)


def find_resumes(cwd: Path, script_args: list[str]) -> list[Resume]:
    """Every candidate folder holding a committed checkpoint, with its newest step."""
    out = []
    for root in candidates(cwd, script_args):
        if not any(root.glob("step-*")):
            continue
        newest = manifest.latest(root)
        if newest is not None:
            out.append(Resume(root, newest))
    return out


def _show(path: Path, cwd: Path) -> str:
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def announce(resumes: list[Resume], cwd: Path) -> list[str]:
    """The lines printed before the launch."""
    return [
        f"scalpel launch: resuming from {_show(r.step, cwd)}; pass --fresh to start over" for r in resumes
    ]


def start_fresh(resumes: list[Resume], cwd: Path) -> list[str]:
    """Move each checkpoint folder aside; the lines saying where each went."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    lines = []
    for r in resumes:
        aside = r.root.with_name(f"{r.root.name}.before-fresh-{stamp}")
        r.root.rename(aside)
        lines.append(
            f"scalpel launch: --fresh: moved {_show(r.root, cwd)} aside to {_show(aside, cwd)} "
            f"(it held {r.step.name}); the run starts over"
        )
    return lines
