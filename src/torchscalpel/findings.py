"""The finding format shared by every check (doctor rules, env checks, distributed rank rules): a
contract for JSON and SARIF. It lives at the package root, below every stage, so the stages that
produce findings (``envcheck/``, ``distributed/``) need not import ``doctor/``.

A finding carries a stable ``rule`` slug, a ``severity``, a one-line ``message``, ``evidence``
(numbers from this run, locations) and a ``fix`` (a code snippet or instruction).
"""

from __future__ import annotations

import enum
import os
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


class Severity(enum.IntEnum):
    """Ordered severities: ``--fail-on LEVEL`` compares with ``>=``."""

    INFO = 0
    WARNING = 1
    ERROR = 2

    @classmethod
    def parse(cls, text: str) -> Severity:
        """Parse ``info`` / ``warning`` / ``error`` (case-insensitive)."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r}; use info, warning or error") from None

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(kw_only=True, slots=True)
class Location:
    """A place in source code: file path and 1-based line (and optional column)."""

    file: str
    line: int
    column: int | None = None

    def __str__(self) -> str:
        return location_text(self.file, self.line)


_KERNEL_CELL = re.compile(r"ipykernel_\d+[/\\](\d+)\.py$")
"""The file ipykernel compiles a notebook cell into: ``/tmp/ipykernel_<pid>/<hash>.py``."""


def notebook_cell(path: str) -> str | None:
    """``Cell In[7]`` for a notebook cell's file, as Jupyter's own tracebacks name it (the execution
    count from the running IPython's compiler); ``cell 2765614298`` (the file's name) when no IPython in
    this process knows it; None for any other file."""
    found = _KERNEL_CELL.search(path)
    if found is None:
        return None
    ipython = sys.modules.get("IPython")  # only when the kernel loaded it: never imported here
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    numbers = getattr(getattr(shell, "compile", None), "_filename_map", None)  # IPython >= 8
    count = numbers.get(path) if isinstance(numbers, dict) else None
    return f"Cell In[{count}]" if isinstance(count, int) else f"cell {found.group(1)}"


def location_text(path: str, line: int) -> str:
    """``file:line``, or ``Cell In[7], line 25`` for a notebook cell (:func:`notebook_cell`)."""
    cell = notebook_cell(path)
    return f"{cell}, line {line}" if cell else f"{path}:{line}"


def short_path(path: str) -> str:
    """``path`` relative to the current folder when it lies under it (for terminals; JSON keeps it whole)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


@dataclass(kw_only=True, slots=True)
class Finding:
    """One problem found, with what proves it and how to fix it."""

    rule: str
    """Stable slug, e.g. ``module-in-plain-container``; a contract for JSON consumers."""
    severity: Severity
    message: str
    """One line saying what is wrong."""
    evidence: list[str] = field(default_factory=list)
    """Measured numbers, names and locations that show the problem is real."""
    fix: str = ""
    """A code snippet or a concrete instruction."""
    location: Location | None = None
    source: str = "runtime"
    """``static``, ``runtime`` or ``env``: which kind of check produced it."""
    rank: int | None = None
    """The rank that saw it, in multi-rank runs."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``severity`` as its lower-case name."""
        data = asdict(self)
        data["severity"] = str(self.severity)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """Inverse of :meth:`to_dict`."""
        loc = data.get("location")
        return cls(
            rule=data["rule"],
            severity=Severity.parse(data["severity"]),
            message=data["message"],
            evidence=list(data.get("evidence", [])),
            fix=data.get("fix", ""),
            location=Location(**loc) if loc else None,
            source=data.get("source", "runtime"),
            rank=data.get("rank"),
        )


def counts(findings: Sequence[Finding]) -> dict[str, int]:
    """Number of findings per severity name (all three keys present)."""
    c = Counter(str(f.severity) for f in findings)
    return {name: c.get(name, 0) for name in ("error", "warning", "info")}


def without_launcher_repeats(across: Sequence[Any], per_rank: Sequence[Any]) -> list[Any]:
    """``per_rank`` less the findings whose rule the launcher already raised in ``across``.

    Under ``scalpel launch --doctor`` / ``doctor --nproc`` a rule such as ``ddp-accumulation-without-no-sync``
    is judged twice: once by the launcher over every rank's facts, once by each rank's own doctor. The
    launcher's finding names the ranks it holds for, so the rank's copy only repeats it (issue 32). Works on
    :class:`Finding` objects and on their dict form alike, and keeps the order of ``per_rank``.
    """

    def rule(f: Any) -> str:
        return str(f.get("rule", "")) if isinstance(f, dict) else str(f.rule)

    judged = {rule(f) for f in across}
    return [f for f in per_rank if rule(f) not in judged]
