"""Per-command option defaults from a config file: precedence built-in defaults < file < flags.

The file is ``./scalpel.toml`` (the one ``scalpel tune`` writes its ``[tune]`` knob table to, read by
``scalpel run``) or, when that has no ``[defaults]`` table, ``[tool.scalpel]`` in ``./pyproject.toml``.
Defaults live under ``[defaults]``, so they never collide with tune's tables::

    [defaults]              # every command below
    warmup = 3
    out_root = "runs"       # run folders go in runs/<time>-<name>/ when --out is not given

    [defaults.profile]      # one command: profile, doctor or tune
    steps = 50
    profile_steps = 5

In pyproject.toml the same tables are ``[tool.scalpel.defaults]`` and ``[tool.scalpel.defaults.profile]``.
The CLI lays these on the sub-parser with ``set_defaults`` before parsing, so a flag typed on the
command line still wins. See docs/config.md.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from torchscalpel.errors import UsageError
from torchscalpel.runtime.window import STEP_KINDS, check_warmup, parse_steps

if sys.version_info >= (3, 11):  # a version test, not try/except, is what type checkers follow
    import tomllib
else:  # Python 3.10: the same parser, packaged as tomli
    import tomli as tomllib

CONFIG_FILE = "scalpel.toml"
PYPROJECT_FILE = "pyproject.toml"
COMMANDS: tuple[str, ...] = ("profile", "doctor", "tune")
"""Commands that read defaults, each a ``[defaults.<command>]`` table."""
SCALPEL_TOML_KEYS = ("version", "tune", "defaults")
"""Top-level keys of scalpel.toml: tune's ``version`` and ``[tune]`` (tune/settings.py), and ours."""


@dataclass(kw_only=True, slots=True)
class Defaults:
    """Option defaults from one table; ``None`` leaves the command's own default."""

    warmup: int | None = None
    """``--warmup``: steps run before measuring (an integer >= 0)."""
    steps: int | str | None = None
    """``--steps``: a number >= 1, ``"all"`` or ``"auto"``."""
    step_kind: str | None = None
    """``--step-kind``: auto, optimizer, backward or forward."""
    step_timeout: float | None = None
    """``--step-timeout``: seconds (> 0) without a recognised step before the script is stopped."""
    profile_steps: int | None = None
    """``--profile-steps`` (profile only): steps inside the torch.profiler window (an integer >= 0)."""
    out_root: str | None = None
    """The folder that holds ``<time>-<name>/`` run folders when ``--out`` is not given (default scalpel-runs)."""

    def __post_init__(self) -> None:
        if self.warmup is not None:
            check_warmup(self.warmup)
        if self.steps is not None:
            if isinstance(self.steps, bool) or not isinstance(self.steps, int | str):
                raise ValueError(f'steps must be a number, "all" or "auto", not {self.steps!r}')
            try:
                parse_steps(self.steps)
            except ValueError:
                raise ValueError(
                    f'steps must be a number >= 1, "all" or "auto", not {self.steps!r}'
                ) from None
        if self.step_kind is not None and self.step_kind not in STEP_KINDS:
            raise ValueError(f"step_kind must be one of {', '.join(STEP_KINDS)}, not {self.step_kind!r}")
        if self.step_timeout is not None and not (
            isinstance(self.step_timeout, int | float)
            and not isinstance(self.step_timeout, bool)
            and self.step_timeout > 0
        ):
            raise ValueError(f"step_timeout must be a number of seconds > 0, not {self.step_timeout!r}")
        if self.profile_steps is not None and not (_is_int(self.profile_steps) and self.profile_steps >= 0):
            raise ValueError(f"profile_steps must be an integer >= 0, not {self.profile_steps!r}")
        if self.out_root is not None and not (isinstance(self.out_root, str) and self.out_root.strip()):
            raise ValueError(f"out_root must be a folder path (a non-empty string), not {self.out_root!r}")

    def set_keys(self) -> dict[str, Any]:
        """The keys this table sets, as the parser's destinations expect them."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name == "steps":
                value = str(value)  # --steps is parsed from text
            elif f.name == "step_timeout":
                value = float(value)
            elif f.name == "out_root":
                value = Path(value)
            out[f.name] = value
        return out


KEYS: tuple[str, ...] = tuple(f.name for f in fields(Defaults))
COMMAND_ONLY: dict[str, tuple[str, ...]] = {"profile_steps": ("profile",)}
"""Keys only some commands take: allowed in [defaults] (applied where they fit), refused in another command's table."""


@dataclass(kw_only=True, slots=True)
class CommandDefaults:
    """What a config file sets for one command, and where it came from."""

    source: Path | None = None
    """The file read, or ``None`` when there is none (or it sets nothing)."""
    values: dict[str, Any]
    """Parser destination -> default (``warmup``, ``steps``, ``step_kind``, ``step_timeout``, ``profile_steps``)."""
    out_root: Path | None = None
    """Where run folders go when ``--out`` is not given."""


def load_defaults(command: str, cwd: Path | None = None) -> CommandDefaults:
    """The defaults ``command`` takes from ``cwd``'s scalpel.toml or pyproject.toml (``[defaults]`` merged
    with ``[defaults.<command>]``, the command's own table winning). Raises :class:`UsageError` with one
    sentence naming the file and the key on any problem."""
    folder = Path.cwd() if cwd is None else cwd
    found = find_defaults_table(folder)
    if found is None:
        return CommandDefaults(values={})
    path, prefix, table = found
    shared = _check_table(path, prefix, table, command=None)
    own = {
        c: _check_table(path, f"{prefix}.{c}", table.get(c, {}), command=c) for c in COMMANDS
    }  # all checked
    merged = {**shared, **own.get(command, {})}
    applicable = {k: v for k, v in merged.items() if command in COMMAND_ONLY.get(k, (command,))}
    out_root = applicable.pop("out_root", None)
    return CommandDefaults(source=path, values=applicable, out_root=out_root)


def find_defaults_table(folder: Path) -> tuple[Path, str, dict[str, Any]] | None:
    """``(file, table name, table)`` of the defaults in ``folder``, or None when neither file has any."""
    toml_path = folder / CONFIG_FILE
    if toml_path.is_file():
        data = _read_toml(toml_path)
        unknown = sorted(set(data) - set(SCALPEL_TOML_KEYS))
        if unknown:
            hint = (
                f"; per-command defaults go in [defaults.{unknown[0]}]"
                if unknown[0] in COMMANDS
                else f"; it holds {', '.join(f'[{k}]' for k in SCALPEL_TOML_KEYS[1:])} and a version"
            )
            raise UsageError(f"{toml_path}: unknown key {unknown[0]!r}{hint}.")
        if "defaults" in data:
            return toml_path, "defaults", _table(toml_path, "defaults", data["defaults"])
    py_path = folder / PYPROJECT_FILE
    if py_path.is_file():
        tool = _read_toml(py_path).get("tool", {})
        ours = tool.get("scalpel") if isinstance(tool, dict) else None
        if ours is not None:
            ours = _table(py_path, "tool.scalpel", ours)
            unknown = sorted(set(ours) - {"defaults"})
            if unknown:
                raise UsageError(
                    f"{py_path}: unknown key {unknown[0]!r} in [tool.scalpel]; "
                    "defaults go in [tool.scalpel.defaults] (see docs/config.md)."
                )
            if "defaults" in ours:
                return (
                    py_path,
                    "tool.scalpel.defaults",
                    _table(py_path, "tool.scalpel.defaults", ours["defaults"]),
                )
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML ({exc}); fix the file.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Cannot read {path}: {exc}.") from None


def _table(path: Path, name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"{path}: {name} must be a table ([{name}]), not a {type(value).__name__}.")
    return value


def _check_table(path: Path, name: str, table: Any, *, command: str | None) -> dict[str, Any]:
    """The keys ``table`` sets, checked; ``command`` None is the shared [defaults] table (with command subtables)."""
    table = _table(path, name, table)
    values: dict[str, Any] = {}
    for key, value in table.items():
        if command is None and key in COMMANDS:
            continue  # a command's own table, checked by its caller when that command runs
        if command is None and isinstance(value, dict):
            raise UsageError(
                f"{path}: unknown table [{name}.{key}]; per-command tables are "
                f"{', '.join(f'[{name}.{c}]' for c in COMMANDS)}."
            )
        if key not in KEYS:
            raise UsageError(f"{path}: unknown key {key!r} in [{name}]; known keys: {', '.join(KEYS)}.")
        if command is not None and command not in COMMAND_ONLY.get(key, (command,)):
            raise UsageError(
                f"{path}: {key!r} in [{name}] does not apply to scalpel {command} "
                f"(only {', '.join(COMMAND_ONLY[key])})."
            )
        values[key] = value
    try:
        return Defaults(**values).set_keys()
    except ValueError as exc:
        raise UsageError(f"{path}: in [{name}], {exc}.") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
