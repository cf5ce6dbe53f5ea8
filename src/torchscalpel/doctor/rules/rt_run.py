"""The run itself: a script that failed under the doctor gets its failure as the first finding.

Why a rule: the crash is often the most important thing the doctor saw (a checkpoint torch 2.6+
refuses under ``weights_only=True``, a DDP script run without a launcher, a typo before the first
step), and a list that says "No findings" under a crashed run reads as a clean bill of health.
The rule hears the exception from the runtime (``on_script_error``), keeps only text and the user's
``file:line`` (never the exception: it holds the script's frames), and names the fix where the
cause is known.
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
import traceback
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from torchscalpel.doctor.registry import make_finding
from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.runtime_rules import RuntimeRule
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.script import strip_ansi
from torchscalpel.runtime.userframes import first_user, is_user_file

DIST_CALLS = ("init_process_group", "init_device_mesh")
"""Calls that need a launcher's RANK/WORLD_SIZE/MASTER_ADDR (env:// rendezvous)."""
DIST_ERRORS = (
    "torch.distributed",
    "env://",
    "rendezvous",
    "process group",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "NCCL",
    "Gloo",
    "gloo",
)
"""Words of the errors torch.distributed's set-up raises without a launcher."""
_EVIDENCE_LINES = 6
_UNSAFE_GLOBAL = re.compile(r"GLOBAL ([\w.]+) was not an allowed global")


@dataclass(slots=True)
class Crash:
    """What the rule keeps of the exception: text and the place, nothing that holds the script's frames."""

    type_name: str
    message: str
    """The whole message, terminal colours removed."""
    location: Location | None = None
    source_line: str = ""
    """The user's line that raised (or the line a SyntaxError points at)."""
    exit_code: int | None = None
    """``sys.exit(code)``: the code; None for an exception."""


def crash_of(exc: BaseException) -> Crash:
    """The :class:`Crash` of ``exc``: type, message, and the innermost frame of the user's own code."""
    if isinstance(exc, SystemExit):
        crash = Crash("SystemExit", "", exit_code=exc.code if isinstance(exc.code, int) else 1)
    else:
        crash = Crash(type(exc).__name__, strip_ansi(str(exc)).strip())
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno and is_user_file(exc.filename):
        # A SyntaxError's place is the file being compiled, not a frame (the compiler is the runner's).
        crash.message = strip_ansi(exc.msg or "").strip()
        crash.location = Location(file=exc.filename, line=exc.lineno)
        crash.source_line = (exc.text or "").strip()
        return crash
    frames = list(reversed(traceback.extract_tb(exc.__traceback__)))  # innermost first
    frame = first_user(frames, lambda f: f.filename)
    if frame is not None and frame.lineno:
        crash.location = Location(file=frame.filename, line=frame.lineno)
        crash.source_line = (frame.line or "").strip()
    return crash


def _crash_from_record(error: str | None) -> Crash:
    """The failure as the record keeps it (``Type: message``, one line), for a run whose exception the
    rule did not hear (the in-process API, a ``--memory-limit`` stop): no place, no traceback."""
    text = strip_ansi(error or "unknown error")
    head, sep, rest = text.partition(": ")
    if sep and head.isidentifier():
        return Crash(head, rest)
    return Crash("", text)


def launcher_commands(script: str | None, args: Sequence[str], module: str | None = None) -> str:
    """The commands that give a distributed script the launcher it expects, its arguments kept
    verbatim (shell-quoted): ``scalpel launch``, torchrun, and the doctor's own multi-rank mode."""
    target = [script] if script else ["-m", module or "MODULE"]
    rest = shlex.join([*target, *args])
    return (
        f"# N: processes on this machine (one per GPU; any number on CPU, where gloo is used)\n"
        f"scalpel launch --nproc N -- {rest}\n"
        f"torchrun --nproc-per-node N {rest}\n"
        f"# diagnose it on N ranks:\n"
        f"scalpel doctor --nproc N -- {rest}"
    )


def needs_launcher(script: str | None, error: str | None) -> bool:
    """True when ``error`` is torch.distributed's set-up failing and the script calls it itself:
    the script expects a launcher (torchrun) to set RANK/WORLD_SIZE/MASTER_ADDR."""
    if not error or not script or not Path(script).is_file():
        return False
    text = Path(script).read_text(encoding="utf-8", errors="replace")
    return any(s in text for s in DIST_CALLS) and any(s in error for s in DIST_ERRORS)


@dataclass(slots=True)
class Known:
    """A failure whose cause is known: what to say instead of the error's first line, the evidence
    lines of the error worth keeping (None: all of them), and the fix."""

    what: str
    advice: str
    fix: str
    keep: tuple[str, ...] | None = None
    evidence: tuple[str, ...] = ()
    """Facts the rule found itself (not lines of the error), after the error's lines."""


def _weights_only(crash: Crash) -> Known | None:
    """torch.load refusing a pickled object under ``weights_only=True`` (the default since torch 2.6)."""
    text = crash.message.replace("Weights only", "weights_only")
    if crash.type_name != "UnpicklingError" or "weights_only" not in text:
        return None
    names = list(dict.fromkeys(_UNSAFE_GLOBAL.findall(crash.message)))
    # In the script, ``__main__.Vocab`` is just ``Vocab``.
    shown = [n.removeprefix("__main__.") for n in names] or ["TheClass"]
    call = _load_call(crash.source_line)
    unsafe = f"{call[0]}, weights_only=False{call[1]}" if call else "torch.load(path, weights_only=False)"
    refused = f"the pickled {', '.join(names)}" if names else "a pickled object"
    return Known(
        what=f"torch.load refused {refused}: weights_only=True is its default since torch 2.6",
        advice=(
            "Allowlist exactly the classes the file holds, or, only for a checkpoint you trust, load with "
            "weights_only=False (unpickling can run arbitrary code)."
        ),
        fix=(
            f"# keep the safe load: allowlist the classes the file holds (import them first)\n"
            f"torch.serialization.add_safe_globals([{', '.join(shown)}])\n"
            f"# or, only for a checkpoint you trust:\n{unsafe}\n"
            "# best: save tensors and plain data only (state_dict(), lists, dicts) and keep weights_only=True"
        ),
        keep=("WeightsUnpickler error",),
    )


def _load_call(line: str) -> tuple[str, str] | None:
    """``line`` split where ``, weights_only=False`` goes into its ``torch.load(...)`` call (None when
    the line is not one parseable statement holding such a call)."""
    try:
        tree = ast.parse(line)
    except SyntaxError:
        return None
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and ast.unparse(n.func).endswith("load")
        and n.end_lineno == 1
        and n.end_col_offset is not None
    ]
    calls.sort(key=lambda n: "torch" not in ast.unparse(n.func))  # torch.load first, then a bare load
    for node in calls:
        if any(k.arg == "weights_only" for k in node.keywords):
            return None  # the call already says; the generic fix is clearer than an edited line
        end_col = cast(int, node.end_col_offset)  # calls without an end column were filtered out above
        end = len(line.encode()[: end_col - 1].decode(errors="ignore"))  # before the ")"
        return line[:end], line[end:]
    return None


def _missing_module(crash: Crash) -> Known | None:
    """An import the doctor's Python cannot satisfy (often: scalpel run from another environment)."""
    if crash.type_name != "ModuleNotFoundError":
        return None
    match = re.search(r"No module named '([\w.]+)'", crash.message)
    if match is None:
        return None
    top = match.group(1).split(".")[0]
    return Known(
        what=crash.message.splitlines()[0],
        advice=f"The doctor runs the script with {sys.executable}, where '{top}' cannot be imported.",
        fix=(
            f"# install the package that provides '{top}' (its PyPI name may differ) into this environment:\n"
            f"{shlex.quote(sys.executable)} -m pip install <package providing {top}>\n"
            "# or run scalpel from the environment the script normally uses"
        ),
    )


def _super_init(crash: Crash) -> Known | None:
    """An nn.Module subclass assigning a layer before (or without) ``super().__init__()``."""
    match = re.search(r"cannot assign (module|parameter) before Module.__init__\(\) call", crash.message)
    if crash.type_name != "AttributeError" or match is None:
        return None
    return Known(
        what=crash.message.splitlines()[0],
        advice=(
            f"The class assigns a {match.group(1)} to self before nn.Module.__init__ ran: call "
            "super().__init__() first in __init__."
        ),
        fix="def __init__(self, ...):\n    super().__init__()      # first line\n    self.layer = nn.Linear(...)",
    )


def _launcher(crash: Crash, record: Any) -> Known | None:
    """A distributed script run without the launcher its set-up expects."""
    target = getattr(record, "target", {}) or {}
    if not needs_launcher(target.get("script"), f"{crash.message} {record.error or ''}"):
        return None
    return Known(
        what=crash.message.splitlines()[0] if crash.message else record.error or "",
        advice=(
            "It sets up torch.distributed, which needs the variables a launcher sets (RANK, WORLD_SIZE, "
            "MASTER_ADDR): run it under one, as it is meant to run."
        ),
        fix=launcher_commands(target.get("script"), target.get("args") or (), target.get("module")),
    )


_INPLACE = re.compile(
    r"modified by an inplace operation: \[([\w.]+) \[([\d, ]*)\]\]"
    r"(?:, which is output (\d+) of (\w+),)? is at version (\d+); expected version (\d+)"
)
_INPLACE_CALL = re.compile(r"\.(?!_)\w+_\(|inplace\s*=\s*True")


def _op_name(node: str) -> str:
    """``ReluBackward0`` / ``Relu`` -> ``relu``; ``AddmmBackward0`` -> ``addmm``."""
    return re.sub(r"Backward\d*$", "", node).lower()


def stale_saved_tensor(roots: Sequence[Any], limit: int = 5000) -> str | None:
    """``ReluBackward0 (its saved result)``: the first autograd node under ``roots`` whose saved tensor was
    modified in place (reading it raises the same error as backward). Walked after the failure only."""
    stack = [getattr(t, "grad_fn", None) for t in roots]
    seen: set[int] = set()
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                getattr(node, attr)
            except RuntimeError as exc:
                if "inplace operation" in str(exc):
                    return f"{type(node).__name__} (its saved {attr.removeprefix('_saved_')})"
            except Exception:
                continue
        stack.extend(n for n, _ in node.next_functions)
    return None


def inplace_lines(classes: Sequence[type]) -> list[str]:
    """``file:line: text`` of the in-place writes in the ``forward`` of user classes (``x += y``,
    ``x[i] = v``, ``x.add_(...)``, ``inplace=True``): where a saved tensor can be overwritten."""
    import inspect

    out: list[str] = []
    for cls in classes:
        fwd = getattr(cls, "forward", None)
        try:
            file = inspect.getsourcefile(fwd)  # type: ignore[arg-type]
            lines, start = inspect.getsourcelines(fwd)  # type: ignore[arg-type]
        except (OSError, TypeError):
            continue
        if not file or not is_user_file(file):
            continue
        for offset, line in enumerate(lines):
            text = line.split("#", 1)[0]
            if (
                re.search(r"[^=!<>]([-+*/@]|//)=[^=]", text)
                or re.search(r"\]\s*=[^=]", text)
                or _INPLACE_CALL.search(text)
            ):
                out.append(f"{fmt_loc(Location(file=file, line=start + offset))}: {line.strip()}")
    return list(dict.fromkeys(out))


def _inplace(crash: Crash, stale: str | None, candidates: Sequence[str]) -> Known | None:
    """Autograd's version-counter check: a tensor saved for backward was modified in place after it was saved."""
    match = _INPLACE.search(crash.message)
    if crash.type_name != "RuntimeError" or match is None:
        return None
    kind, shape, out_index, node, version, expected = match.groups()
    dtype = kind.rsplit(".", 1)[-1].replace("Tensor", "").lower() or "tensor"
    made_by = f", output {out_index} of {_op_name(node)}" if node else ""
    what = (
        f"a {dtype} tensor [{shape}]{made_by} that autograd saved for backward was modified in place "
        f"(version {version}, saved at version {expected})"
    )
    keep: list[str] = []
    if stale:
        keep.append(f"backward needed it for {stale}")
    if candidates:
        keep.append("in-place writes in the model's forward: " + "; ".join(candidates[:5]))
    where = f"the output of {_op_name(node)}" if node else "that tensor"
    return Known(
        what=what,
        advice=(
            f"An in-place operation (x += y, x[i] = v, x.relu_(), ReLU(inplace=True)) overwrote {where} "
            "between the forward that saved it and this backward; make that operation out-of-place."
        ),
        fix=(
            "h = h + 1.0              # not: h += 1.0  (or h.add_(1.0))\n"
            "h = torch.relu(h)        # not: torch.relu_(h) / nn.ReLU(inplace=True) on a tensor used again\n"
            "h = h.clone(); h[mask] = 0   # copy before writing into a tensor autograd saved\n"
            "# to see the forward line of the op that needed it:\n"
            "torch.autograd.set_detect_anomaly(True)"
        ),
        evidence=tuple(keep),
    )


class ScriptFailed(RuntimeRule):
    """The script raised (or exited non-zero) under the doctor: its error, where, and the fix when known."""

    info = RuleInfo(
        slug="script-failed",
        severity=Severity.ERROR,
        category="run",
        summary="the script failed under the doctor: the error, the user's line, and the fix when known",
        kinds=("runtime",),
    )

    def __init__(self) -> None:
        super().__init__()
        self.crash: Crash | None = None
        self._roots: list[weakref.ref[Any]] = []
        self.stale: str | None = None
        self.candidates: list[str] = []

    def on_backward_pre(self, tensors: Any) -> None:
        # weak: the graph of the last backward, read only if that backward fails on an in-place write
        self._roots = [weakref.ref(t) for t in tensors if isinstance(t, torch.Tensor)]

    def on_script_error(self, exc: BaseException) -> None:
        self.crash = crash_of(exc)
        if _INPLACE.search(self.crash.message):
            roots = [t for t in (r() for r in self._roots) if t is not None]
            self.stale = stale_saved_tensor(roots)
            models = getattr(self.session, "root_modules", None) or []
            self.candidates = inplace_lines(
                list(dict.fromkeys(type(m) for root in list(models) for m in root.modules()))
            )
        self._roots = []

    def findings(self, record: Any) -> Iterator[Finding]:
        if getattr(record, "status", None) != "failed":
            return
        crash = self.crash or _crash_from_record(record.error)
        known = (
            _weights_only(crash)
            or _missing_module(crash)
            or _launcher(crash, record)
            or _inplace(crash, self.stale, self.candidates)
            or _super_init(crash)
        )
        steps = len(record.steps)
        when = "before its first step" if not steps else f"after {steps} step(s)"
        lines = [line.strip() for line in crash.message.splitlines() if line.strip()]
        who = "The block" if (getattr(record, "target", {}) or {}).get("inprocess") else "The script"
        if crash.exit_code is not None:
            message = f"{who} exited with code {crash.exit_code} {when}."
        else:
            what = known.what if known is not None else (lines[0] if lines else "")
            raised = f"raised {crash.type_name}" if crash.type_name else "failed"
            message = f"{who} {raised} {when}" + (f": {what}" if what else "")
            message = message.rstrip(". ") + "."
        evidence = []
        if crash.location is not None:
            evidence.append(
                f"at {fmt_loc(crash.location)}" + (f": {crash.source_line}" if crash.source_line else "")
            )
        rest = lines[1:]
        if known is not None and known.keep is not None:
            rest = [line for line in lines if any(k in line for k in known.keep)]
        evidence += rest[:_EVIDENCE_LINES]
        if known is not None:
            evidence += known.evidence
        if steps:
            evidence.append("findings that need the steps after the failure could not be checked")
        if known is not None:
            message += " " + known.advice
        yield make_finding(
            "script-failed",
            message,
            evidence=evidence,
            fix=known.fix if known else "",
            location=crash.location,
        )
