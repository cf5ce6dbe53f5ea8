"""What a stage runs: a script path or a module, with the argv it receives, validated once.

Used by every stage that runs a user's script (profile, doctor, tune, plan, launch); the CLI
turns its flags into a :class:`Target` through :func:`resolve_script`.
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from torchscalpel.errors import UsageError


@dataclass(kw_only=True, slots=True)
class Target:
    """What to run: a script path or a module name, and the argv it receives."""

    script: Path | None = None
    module: str | None = None
    args: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """Short name for run folders: the script's stem or the module's last part."""
        if self.script is not None:
            return self.script.stem
        return (self.module or "run").rsplit(".", 1)[-1]

    def argv(self) -> list[str]:
        """``sys.argv`` as the script expects it (argv[0] is the script path or module name)."""
        head = str(self.script) if self.script is not None else (self.module or "")
        return [head, *self.args]

    def to_dict(self) -> dict[str, object]:
        """JSON form for the Run record."""
        return {
            "script": str(self.script) if self.script else None,
            "module": self.module,
            "args": list(self.args),
        }


def resolve_script(
    rest: list[str],
    module: str | None = None,
    *,
    default_script: Path | None = None,
    command: str = "profile",
) -> Target:
    """Validate the script (``rest[0]``, its arguments after) or module; raise :class:`UsageError` with one sentence
    (``command``: the verb the user typed, for the example in it)."""
    rest = list(rest)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if module:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            raise UsageError(f"Cannot find module {module!r}; check the name or the current folder.")
        return Target(module=module, args=rest)
    if not rest:
        if default_script is None:
            raise UsageError(
                f"Name the script to run after --, e.g. 'scalpel {command} -- train.py --lr 3e-4'."
            )
        return Target(script=default_script, args=[])
    script = Path(rest[0])
    if not script.exists():
        raise UsageError(
            f"Script {script} does not exist; check the path (it is read relative to {Path.cwd()})."
        )
    if script.is_dir():
        main = script / "__main__.py"
        if not main.exists():
            raise UsageError(f"{script} is a folder without __main__.py; name the training script inside it.")
        return Target(script=script, args=rest[1:])
    if script.suffix not in (".py", ".pyw") and not _looks_like_python(script):
        raise UsageError(f"{script} is not a Python script; pass the .py file that trains the model.")
    return Target(script=script, args=rest[1:])


def _looks_like_python(path: Path) -> bool:
    """True for extension-less files with a python shebang."""
    try:
        head = path.open("rb").readline(200)
    except OSError:
        return False
    return head.startswith(b"#!") and b"python" in head


def target_from_args(
    args: argparse.Namespace, *, default_script: Path | None = None, flags: str = ""
) -> Target:
    """The script or module a verb's parsed command line names (``-m MODULE`` or ``-- SCRIPT [ARGS]``),
    validated; :class:`UsageError` with one sentence otherwise. Without a script the sentence names the
    command the user typed, with ``flags`` (those it cannot run without), so that the example runs as
    written: ``e.g. 'scalpel batch --sizes 8,16,32 -- train.py'``."""
    command = getattr(args, "command", None) or "profile"
    return resolve_script(
        list(getattr(args, "target", None) or []),
        getattr(args, "module", None),
        default_script=default_script,
        command=f"{command} {flags}" if flags else command,
    )
