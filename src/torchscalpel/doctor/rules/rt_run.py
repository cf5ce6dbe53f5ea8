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
import os
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


def _load_call(line: str, keyword: str = "weights_only") -> tuple[str, str] | None:
    """``line`` split where ``, <keyword>=...`` goes into its ``torch.load(...)`` call (None when the line
    is not one parseable statement holding such a call, or the call already passes ``keyword``)."""
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
        if any(k.arg == keyword for k in node.keywords):
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


_DEVICE_ERRORS = (
    # CUDA kernels, torch >= 2.5: "... but got mat1 is on cpu, different from other tensors on cuda:0 (...)"
    re.compile(
        r"Expected all tensors to be on the same device, but got (\w+) is on ([\w:]+), different from other tensors on ([\w:]+)"
    ),
    # older CUDA wording: "... but found at least two devices, cuda:0 and cpu! (when checking argument for argument mat1 ...)"
    re.compile(
        r"Expected all tensors to be on the same device, but found at least two devices, ([\w:]+) and ([\w:]+)!"
    ),
    # the meta / CPU kernels' check: "Tensor on device meta is not on the expected device cpu!"
    re.compile(r"Tensor on device ([\w:]+) is not on the expected device ([\w:]+)!"),
)


def _device_pair(message: str) -> tuple[str, str, str] | None:
    """``(argument or "", its device, the other device)`` of a device-mismatch error; None for another error."""
    for number, pattern in enumerate(_DEVICE_ERRORS):
        match = pattern.search(message)
        if match is None:
            continue
        if number == 0:
            return match.group(1), match.group(2), match.group(3)
        argument = re.search(r"for argument (\w+)", message)
        return (argument.group(1) if argument else ""), match.group(1), match.group(2)
    return None


def _call_arguments(line: str) -> list[str]:
    """The plain names passed to the calls of ``line`` (``model(x, mask=m)`` -> ``["x", "m"]``), the
    tensors that may still sit on the other device; [] when the line does not parse."""
    try:
        tree = ast.parse(line.strip().removesuffix(":"))
    except SyntaxError:
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            values = [*node.args, *(k.value for k in node.keywords)]
            names += [v.id for v in values if isinstance(v, ast.Name)]
    return list(dict.fromkeys(names))


def _defines_device(location: Location | None) -> bool:
    """Whether the failing file assigns a ``device`` variable (the fix then uses it instead of a new one)."""
    if location is None or not Path(location.file).is_file():
        return False
    text = Path(location.file).read_text(encoding="utf-8", errors="replace")
    return re.search(r"^\s*device\s*=", text, re.MULTILINE) is not None


def _device_mismatch(crash: Crash, model_devices: Sequence[str]) -> Known | None:
    """Two tensors of one op on different devices: the model moved with ``.to(device)``, a batch not (or the
    reverse)."""
    pair = _device_pair(crash.message)
    if crash.type_name != "RuntimeError" or pair is None:
        return None
    argument, first, second = pair
    devices = sorted({first, second})
    model_at = list(dict.fromkeys(model_devices))
    # the tensors of the failing line that are not the model: the usual culprit is the batch
    names = _call_arguments(crash.source_line)
    target = model_at[0] if len(model_at) == 1 else next((d for d in devices if d != "cpu"), devices[-1])
    evidence = [
        f"the op got tensors on {devices[0]} and {devices[1]}"
        + (f" (argument {argument})" if argument else "")
    ]
    if model_at:
        evidence.append(f"the model's parameters are on {', '.join(model_at)}")
        others = [d for d in devices if d not in model_at]
        if names and others:
            evidence.append(
                f"the tensors this line passes, {', '.join(names)}: the one on {others[0]} is among them"
            )
    moves = (
        "\n".join(f"{n} = {n}.to(device)" for n in names) or "x = x.to(device)   # each input of the model"
    )
    return Known(
        what=f"an operation got tensors on two devices, {devices[0]} and {devices[1]}",
        advice=(
            f"Every tensor an op reads must be on one device: move the inputs of this line to the model's device "
            f"({target}) before the call, and create tensors inside forward on the input's device."
        ),
        fix=(
            (
                f"# device: the script's own variable, where the model is ({target})\n"
                if _defines_device(crash.location)
                else f"device = torch.device({target!r})   # where the model is: next(model.parameters()).device\n"
            )
            + f"model = model.to(device)\n{moves}\n"
            "# tensors made inside forward: torch.zeros(..., device=x.device), or register them as buffers"
        ),
        evidence=tuple(evidence),
    )


def _receiver(line: str, method: str) -> str:
    """``loss`` of ``loss.backward()`` in ``line`` (the expression before ``.method(``); "" if none."""
    match = re.search(rf"([\w.\[\]'\"]+)\.{method}\(", line)
    return match.group(1) if match else ""


def _non_scalar_backward(crash: Crash, shape: tuple[int, ...] | None) -> Known | None:
    """``backward()`` without a gradient on a tensor with more than one element."""
    if (
        crash.type_name != "RuntimeError"
        or "grad can be implicitly created only for scalar outputs" not in crash.message
    ):
        return None
    name = _receiver(crash.source_line, "backward") or "loss"
    shown = f"[{', '.join(map(str, shape))}]" if shape is not None else "with more than one element"
    return Known(
        what=f"backward() was called on {name}, a tensor of shape {shown}, not a scalar",
        advice=(
            "backward() without an argument needs a single number: reduce the loss (a criterion with "
            "reduction='none' or a per-sample loss) to its mean or sum, or pass the gradient of each element."
        ),
        fix=(
            f"{name}.mean().backward()      # or {name}.sum().backward()\n"
            f"# or keep per-element weights: {name}.backward(gradient=torch.ones_like({name}))"
        ),
        evidence=(f"{name} has shape {shown}",) if shape is not None else (),
    )


_GRAD_OF = re.compile(r"([\w.\[\]]+)\.grad\b(?!_)")


def grad_owner_is_leaf(exc: BaseException, crash: Crash) -> bool | None:
    """Whether the tensor whose ``.grad`` the failing line reads (``normed`` of ``normed.grad.abs()``) is a
    leaf, read from the failing frame's variables; None when the line reads no ``.grad`` of a plain
    (dotted) name or the name does not resolve to a tensor there. Read at the failure: the frame is alive."""
    match = _GRAD_OF.search(crash.source_line)
    if match is None or crash.location is None or not re.fullmatch(r"[A-Za-z_]\w*(\.\w+)*", match.group(1)):
        return None
    tb = exc.__traceback__
    frame = None
    while tb is not None:  # outermost to innermost: keep the last frame at the crash's place
        if tb.tb_frame.f_code.co_filename == crash.location.file and tb.tb_lineno == crash.location.line:
            frame = tb.tb_frame
        tb = tb.tb_next
    if frame is None:
        return None
    head, *attrs = match.group(1).split(".")
    scope = {**frame.f_globals, **frame.f_locals}
    if head not in scope:
        return None
    value = scope[head]
    for attr in attrs:
        try:
            value = getattr(value, attr)
        except Exception:  # a property that raises: cannot tell
            return None
    return bool(value.is_leaf) if isinstance(value, torch.Tensor) else None


def _non_leaf_grad(crash: Crash, is_leaf: bool | None) -> Known | None:
    """``.grad`` of a tensor autograd computed (not a leaf): None, and the next use of it fails on None.
    Only when the failing frame showed the tensor is not a leaf: a leaf's ``.grad`` is None for other
    reasons (frozen, unused in the loss, no backward yet) that ``retain_grad`` does not fix."""
    if crash.type_name not in ("AttributeError", "TypeError") or "NoneType" not in crash.message:
        return None
    match = _GRAD_OF.search(crash.source_line)
    if match is None or is_leaf is not False:
        return None
    name = match.group(1)
    return Known(
        what=f"{name}.grad is None: {name} is not a leaf tensor (autograd computed it), so backward does not keep its gradient",
        advice=(
            f"Only leaf tensors (parameters, tensors created with requires_grad=True) get .grad; call "
            f"{name}.retain_grad() before backward to keep the gradient of this intermediate tensor, or read the "
            "leaf's .grad instead."
        ),
        fix=(
            f"{name}.retain_grad()        # right after {name} is computed, before the backward\n"
            f"...backward()\nprint({name}.grad)\n"
            "# or make it the leaf: detach it and ask for its gradient\n"
            f"{name} = {name}.detach().requires_grad_()"
        ),
    )


def _freed_graph(crash: Crash) -> Known | None:
    """A second backward through a graph whose saved tensors the first backward freed."""
    if (
        crash.type_name != "RuntimeError"
        or "Trying to backward through the graph a second time" not in crash.message
    ):
        return None
    name = _receiver(crash.source_line, "backward") or "loss"
    return Known(
        what="backward went through a graph a second time, after the first backward freed it",
        advice=(
            f"{name} depends on a graph an earlier backward already used; usually a hidden state (RNN, "
            "running sum) carried from one iteration to the next without .detach(). Detach the carried "
            "state each iteration; use retain_graph=True only if two backwards through one graph are meant."
        ),
        fix=(
            "hidden = hidden.detach()        # at the start of each iteration: cut the graph of the last one\n"
            "# (an LSTM's tuple: hidden = tuple(h.detach() for h in hidden))\n"
            f"# only if both backwards are meant: {name}.backward(retain_graph=True)"
        ),
    )


def _cuda_checkpoint_on_cpu(crash: Crash) -> Known | None:
    """A checkpoint saved from CUDA tensors loaded where CUDA is not available."""
    if "Attempting to deserialize object on a CUDA device" not in crash.message:
        return None
    call = _load_call(crash.source_line, "map_location")
    line = f'{call[0]}, map_location="cpu"{call[1]}' if call else 'torch.load(path, map_location="cpu")'
    return Known(
        what="the checkpoint holds CUDA tensors and this machine has no CUDA (torch.cuda.is_available() is False)",
        advice='Map its storages to the CPU when loading: map_location="cpu" (or the device you train on).',
        fix=f"{line}\n# on any machine: torch.load(path, map_location=device), then model.to(device)",
        keep=(),
    )


_LAUNCHER_ENV = ("RANK", "WORLD_SIZE")


def _init_order(crash: Crash, record: Any) -> Known | None:
    """A torch.distributed call (``get_rank()``, ``barrier()``) before ``init_process_group``."""
    if "Default process group has not been initialized" not in crash.message:
        return None
    launched = all(os.environ.get(k) for k in _LAUNCHER_ENV)
    target = getattr(record, "target", {}) or {}
    at = f" ({fmt_loc(crash.location)}: {crash.source_line})" if crash.location and crash.source_line else ""
    fix = (
        'dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")   # first\n'
        f"{crash.source_line or 'rank = dist.get_rank()'}\n"
        "# or: from torchscalpel.distributed import setup; ctx = setup()   # then ctx.rank, ctx.world_size"
    )
    if not launched:
        fix += (
            "\n# and run it under a launcher, which sets RANK/WORLD_SIZE/MASTER_ADDR:\n"
            + launcher_commands(target.get("script"), target.get("args") or (), target.get("module"))
        )
    return Known(
        what="a torch.distributed call ran before init_process_group" + at,
        advice=(
            "Call torch.distributed.init_process_group() before any other torch.distributed call (get_rank, "
            "get_world_size, barrier)"
            + ("." if launched else "; RANK/WORLD_SIZE are unset too: run it under a launcher.")
        ),
        fix=fix,
        evidence=(
            "launcher variables RANK/WORLD_SIZE are set: the launcher is there, the init call is missing or late"
            if launched
            else "RANK/WORLD_SIZE are unset: no launcher",
        ),
    )


_EXPLANATION = re.compile(r"Explanation: (.+)")


def _traced_at(message: str) -> tuple[str, str, str] | None:
    """(``file:line``, function, source line) of the code dynamo could not trace: the innermost frame it lists
    under "from user code:" in its message."""
    block = message.split("from user code:", 1)
    if len(block) < 2:
        return None
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)\n\s*(.*)', block[1])
    if not frames:
        return None
    file, line, function, text = frames[-1]
    return fmt_loc(Location(file=file, line=int(line))), function, text.strip()


def _compile_error(crash: Crash) -> Known | None:
    """torch.compile's own errors (the compile troubleshooting table), each mapped to the fix for the user's code."""
    kind, message = crash.type_name, crash.message
    at = _traced_at(message)
    where = f" at {at[0]} ({at[2]})" if at else ""
    function = at[1] if at else "the_function"
    explained = _EXPLANATION.search(message)
    if kind == "Unsupported" or "Dynamo does not know how to" in message:
        return Known(
            what="torch.compile(fullgraph=True) met code it cannot trace" + where,
            advice=(
                (explained.group(1).strip().rstrip(".") + ". " if explained else "")
                + f"Keep that code out of the graph: mark {function}() with torch.compiler.disable (it runs "
                "eagerly and the graph breaks around its call), or drop fullgraph=True to let torch.compile "
                "break the graph there itself."
            ),
            fix=(
                f"@torch.compiler.disable   # on {function}(): runs eagerly, the rest stays compiled\n"
                f"def {function}(...):\n    ...\n"
                "# or: model = torch.compile(model)   # without fullgraph=True: a graph break, not an error"
            ),
            keep=(),
            evidence=(f"untraceable code at {at[0]}: {at[2]}",) if at else (),
        )
    if kind == "UserError" and "data-dependent" in message:
        return Known(
            what="torch.compile met a Python branch on a tensor's value" + where,
            advice=(
                "A compiled graph cannot branch on data it has not computed yet (an .item() or bool(tensor) "
                "in an if). Express the branch as tensor code (torch.where), or keep the value check outside "
                "the compiled function."
            ),
            fix=(
                "out = torch.where(x.sum() > 0, x + 1, x)   # both sides computed, one kept: no Python branch\n"
                "# or: torch._dynamo.config.capture_scalar_outputs = True   # .item() as a graph value"
            ),
            keep=(),
            evidence=(f"the branch at {at[0]}: {at[2]}",) if at else (),
        )
    if kind == "TorchRuntimeError":
        return Known(
            what="the compiled code fails while torch.compile traces it with fake tensors" + where,
            advice=(
                "This is the script's own error, raised while tracing (shapes, dtypes or devices that do not "
                "match); without torch.compile it raises the same error at the same line, with an eager "
                "traceback that is easier to read."
            ),
            fix=(
                'torch.compiler.set_stance("force_eager")   # before the first call: run eagerly to see the error\n'
                "# or remove torch.compile(...) and run the script once"
            ),
            keep=("got RuntimeError", "got ValueError", "got TypeError"),
        )
    if kind == "BackendCompilerFailed":
        no_cxx = "C++ compiler" in message or "InvalidCxxCompiler" in message
        return Known(
            what="torch.compile's backend failed to compile the traced graph",
            advice=(
                "Inductor needs a working C++ compiler on CPU (and Triton on GPU): install one (gcc) or set CXX."
                if no_cxx
                else "The tracing worked and the code generator failed: a torch bug, not the script's. Find "
                'which stage fails by compiling with backend="aot_eager" (no code generation); meanwhile run '
                "that module eagerly."
            ),
            fix=(
                "apt-get install g++   # or: export CXX=/path/to/c++"
                if no_cxx
                else 'model = torch.compile(model, backend="aot_eager")   # passes: the fault is inductor\'s\n'
                "torch._dynamo.config.suppress_errors = True   # or: fall back to eager where compile fails"
            ),
            keep=("raised",),
        )
    if kind == "FailOnRecompileLimitHit" or "recompile_limit" in message:
        return Known(
            what="a compiled function recompiled more times than torch._dynamo.config.recompile_limit",
            advice=(
                "Each new input shape or Python value it specialised on compiled it again. Mark the changing "
                "dimension dynamic (a last smaller batch: drop_last=True on the DataLoader), or pass the changing "
                "Python number as a tensor; TORCH_LOGS=recompiles names each guard that failed."
            ),
            fix=(
                "model = torch.compile(model, dynamic=True)   # or torch._dynamo.mark_dynamic(x, 0) before the call\n"
                "loader = DataLoader(ds, batch_size=B, drop_last=True)   # when only the last batch differs"
            ),
            keep=(),
        )
    return None


SCRIPT_FAILED = RuleInfo(
    slug="script-failed",
    severity=Severity.ERROR,
    category="run",
    summary="the script failed under the doctor: the error, the user's line, and the fix when known",
    kinds=("runtime",),
)


class ScriptFailed(RuntimeRule):
    """The script raised (or exited non-zero) under the doctor: its error, where, and the fix when known."""

    info = SCRIPT_FAILED

    def __init__(self) -> None:
        super().__init__()
        self.crash: Crash | None = None
        self._roots: list[weakref.ref[Any]] = []
        self.stale: str | None = None
        self.candidates: list[str] = []
        self.shape: tuple[int, ...] | None = None
        self.model_devices: list[str] = []
        self.grad_is_leaf: bool | None = None

    def on_backward_pre(self, tensors: Any) -> None:
        # weak: the graph of the last backward, read only if that backward fails on an in-place write
        self._roots = [weakref.ref(t) for t in tensors if isinstance(t, torch.Tensor)]

    def on_script_error(self, exc: BaseException) -> None:
        self.crash = crash_of(exc)
        if self.crash.type_name in ("AttributeError", "TypeError") and "NoneType" in self.crash.message:
            self.grad_is_leaf = grad_owner_is_leaf(exc, self.crash)
        if _INPLACE.search(self.crash.message):
            roots = [t for t in (r() for r in self._roots) if t is not None]
            self.stale = stale_saved_tensor(roots)
            models = getattr(self.session, "root_modules", None) or []
            self.candidates = inplace_lines(
                list(dict.fromkeys(type(m) for root in list(models) for m in root.modules()))
            )
        elif "grad can be implicitly created only for scalar outputs" in self.crash.message:
            roots = [t for t in (r() for r in self._roots) if t is not None]
            self.shape = tuple(roots[0].shape) if roots else None
        elif _device_pair(self.crash.message) is not None:
            # the model's device, read from its parameters now (the model may be gone by findings time)
            for root in list(getattr(self.session, "root_modules", None) or []):
                param = next(root.parameters(), None)
                if param is not None:
                    self.model_devices.append(str(param.device))
        self._roots = []

    def findings(self, record: Any) -> Iterator[Finding]:
        if getattr(record, "status", None) != "failed":
            return
        crash = self.crash or _crash_from_record(record.error)
        known = (
            _weights_only(crash)
            or _missing_module(crash)
            or _init_order(crash, record)
            or _launcher(crash, record)
            or _inplace(crash, self.stale, self.candidates)
            or _super_init(crash)
            or _device_mismatch(crash, self.model_devices)
            or _non_scalar_backward(crash, self.shape)
            or _non_leaf_grad(crash, self.grad_is_leaf)
            or _freed_graph(crash)
            or _cuda_checkpoint_on_cpu(crash)
            or _compile_error(crash)
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
        yield SCRIPT_FAILED.finding(
            message,
            evidence=evidence,
            fix=known.fix if known else "",
            location=crash.location,
        )
