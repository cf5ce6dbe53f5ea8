"""The schema check of a run record's JSON, before anything reads it: each top-level field's type, each
step's fields (types, finite times), and bounds over the whole document (nesting depth, string length,
integer size), one sentence naming the first field that does not fit. :func:`torchscalpel.record.load_record`
calls it; it imports nothing of the package, so any floor may."""

from __future__ import annotations

import math
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting a record may hold; the deepest a stage writes is under 10 (sections' tables)."""
MAX_STRING = 1 << 20
"""Longest string (characters) a record may hold: 1 Mi; names, notes and errors are one line."""
MAX_INT = 1 << 64
"""Largest integer magnitude a record may hold (bytes, FLOPs and counters all fit in 64 bits)."""
MAX_MS = 1e12
"""Largest step or phase time, in ms (about 31 years): beyond it sums and means overflow."""

_TOP_TYPES: dict[str, tuple[type, ...]] = {
    "schema_version": (str,),
    "name": (str,),
    "created": (str,),
    "tool_version": (str,),
    "command": (list,),
    "target": (dict,),
    "status": (str,),
    "exit_code": (int, type(None)),
    "error": (str, type(None)),
    "notes": (list,),
    "environment": (dict,),
    "config": (dict,),
    "step_kind": (str,),
    "steps": (list,),
    "summary": (dict,),
    "modules": (list,),
    "profiler": (dict,),
    "findings": (list,),
    "sections": (dict,),
    "provenance": (dict,),
    "artifacts": (dict,),
}
"""The JSON type of each top-level field of :class:`RunRecord` (``extra`` keys are free)."""
_LIST_ITEM_TYPES: dict[str, tuple[type, ...]] = {
    "command": (str,),
    "notes": (str,),
    "steps": (dict,),
    "modules": (dict,),
    "findings": (dict,),
}
_STEP_MS = (
    "start_ms",
    "total_ms",
    "data_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "other_ms",
    "eval_ms",
)
_STEP_BOOLS = ("warmup", "skipped_update", "profiled", "flops_counted")
_STEP_INTS = ("micro_batches", "forward_calls", "closure_evals", "recomputed_forwards")
_STEP_OPTIONAL_INTS = ("samples", "cuda_allocated_peak", "cuda_reserved_peak", "rss")
_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    list: "a list",
    dict: "an object",
    bool: "true or false",
    type(None): "null",
}


def _json_type(value: Any) -> str:
    for kind, name in _TYPE_NAMES.items():
        if type(value) is kind:
            return name
    return type(value).__name__


def _expects(kinds: tuple[type, ...]) -> str:
    return " or ".join(_TYPE_NAMES[k] for k in kinds)


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    # bool is a subclass of int in Python, not in JSON: `true` is no exit code or step count
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds)


def validate_record_data(data: dict[str, Any]) -> str | None:
    """The first way ``data`` (a decoded ``run.json``) does not fit the record schema, as a clause naming
    the field (``"steps[3].total_ms is 1e+308, beyond 1e+12 ms"``), or None when it fits.

    Checks each top-level field's JSON type, each step's fields' types (times finite and within
    :data:`MAX_MS`), and, over the whole document in one pass with an explicit stack (linear, no
    recursion), nesting depth, string lengths and integer sizes. Keys a newer minor version added
    are kept unchecked except for those bounds."""
    problem = _check_bounds(data)
    if problem is not None:
        return problem
    for key, kinds in _TOP_TYPES.items():
        if key in data and not _is(data[key], kinds):
            return f"{key} is {_json_type(data[key])}, not {_expects(kinds)}"
    for key, kinds in _LIST_ITEM_TYPES.items():
        for i, item in enumerate(data.get(key, [])):
            if not _is(item, kinds):
                return f"{key}[{i}] is {_json_type(item)}, not {_expects(kinds)}"
    artifacts = data.get("artifacts", {})
    for role, where in artifacts.items():
        if not isinstance(where, str):
            return f"artifacts[{role!r}] is {_json_type(where)}, not a string"
    for i, step in enumerate(data.get("steps", [])):
        problem = _check_step(step)
        if problem is not None:
            return f"steps[{i}].{problem}"
    return None


def _check_step(step: dict[str, Any]) -> str | None:

    if "index" not in step:
        return "index is missing"
    if not _is(step["index"], (int,)):
        return f"index is {_json_type(step['index'])}, not an integer"
    for key in _STEP_MS:
        if key in step:
            value = step[key]
            if not _is(value, (int, float)):
                return f"{key} is {_json_type(value)}, not a number"
            if not math.isfinite(value) or abs(value) > MAX_MS:
                return f"{key} is {value:g}, not a finite time within {MAX_MS:g} ms"
    for key in _STEP_BOOLS:
        if key in step and not _is(step[key], (bool,)):
            return f"{key} is {_json_type(step[key])}, not true or false"
    for key in _STEP_INTS:
        if key in step and not _is(step[key], (int,)):
            return f"{key} is {_json_type(step[key])}, not an integer"
    for key in _STEP_OPTIONAL_INTS:
        if key in step and not _is(step[key], (int, type(None))):
            return f"{key} is {_json_type(step[key])}, not an integer or null"
    if "loss" in step and not _is(step["loss"], (int, float, type(None))):
        return f"loss is {_json_type(step['loss'])}, not a number or null"
    return None


def _check_bounds(data: dict[str, Any]) -> str | None:
    """Depth, string length and integer size over the whole document, iteratively (a value's path is
    kept as a chain of (parent, key) pairs and spelled out only for the one that is refused)."""
    stack: list[tuple[Any, Any, int]] = [(data, None, 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, str):
            if len(value) > MAX_STRING:
                return (
                    f"{_path(where)} is a string of {len(value):,} characters, over the {MAX_STRING:,} limit"
                )
        elif isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > MAX_INT:
                return f"{_path(where)} is an integer beyond 64 bits"
        elif isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                return f"{_path(where)} nests deeper than {MAX_DEPTH} levels"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and len(key) > MAX_STRING:
                    return f"a key under {_path(where)} has {len(key):,} characters, over the {MAX_STRING:,} limit"
                stack.append((item, (where, key), depth + 1))
    return None


def _path(where: Any) -> str:
    """``steps[3].total_ms`` from the (parent, key) chain :func:`_check_bounds` keeps."""
    parts: list[str] = []
    while where is not None:
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{str(key)[:40]}")
    text = "".join(reversed(parts)).lstrip(".") or "the record"
    return text if len(text) <= 80 else f"{text[:40]}...{text[-36:]}"  # a 60-deep path, shortened
