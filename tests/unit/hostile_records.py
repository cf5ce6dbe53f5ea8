"""Generator of hostile ``run.json`` files (issue 30, item 4): each one is a small valid record with one
field made wrong, huge or deep, written as raw JSON text (so that values Python's json would refuse to
write, like a 5000-digit integer, can be written too).

``REFUSED`` must be refused by :func:`torchscalpel.record.load_record` in one sentence naming the field;
``LOADED`` hold large but legal records that must load and render at a bounded size.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def valid_record(steps: int = 6) -> dict[str, Any]:
    """A small record as ``scalpel profile`` writes it (two warm-up steps, then measured ones)."""
    return {
        "schema_version": "1.3",
        "name": "base",
        "created": "2026-12-02T03:00:00+0000",
        "tool_version": "",  # hand-made: the suite's record guard checks only what a stage wrote
        "command": ["scalpel", "profile"],
        "target": {"script": "train.py", "args": []},
        "status": "complete",
        "exit_code": 0,
        "error": None,
        "notes": [],
        "environment": {},
        "config": {"warmup": 2, "steps": steps},
        "step_kind": "optimizer",
        "steps": [_step(i, warmup=i < 2) for i in range(steps)],
        "summary": {},
        "modules": [],
        "profiler": {},
        "findings": [],
        "sections": {},
        "artifacts": {},
    }


def _step(i: int, *, warmup: bool = False) -> dict[str, Any]:
    return {
        "index": i,
        "warmup": warmup,
        "start_ms": 10.0 * i,
        "total_ms": 10.0,
        "data_ms": 1.0,
        "forward_ms": 3.0,
        "backward_ms": 4.0,
        "optimizer_ms": 1.0,
        "other_ms": 1.0,
        "loss": 1.0 / (i + 1),
        "micro_batches": 1,
        "forward_calls": 1,
        "samples": 8,
    }


def _with(**fields: Any) -> Callable[[], str]:
    def make() -> str:
        data = valid_record()
        data.update(fields)
        return json.dumps(data)

    return make


def _step_field(key: str, value: Any) -> Callable[[], str]:
    def make() -> str:
        data = valid_record()
        data["steps"][3][key] = value
        return json.dumps(data)

    return make


def _raw(key: str, text: str) -> Callable[[], str]:
    """The valid record with ``key``'s value replaced by raw JSON text (json.dumps cannot write it)."""

    def make() -> str:
        data = valid_record()
        data[key] = "@@@"
        return json.dumps(data).replace('"@@@"', text)

    return make


def _raw_step(key: str, text: str) -> Callable[[], str]:
    def make() -> str:
        data = valid_record()
        data["steps"][3][key] = "@@@"
        return json.dumps(data).replace('"@@@"', text)

    return make


# (case id, text maker, a word the refusal must contain: the field it names)
REFUSED: list[tuple[str, Callable[[], str], str]] = [
    ("5000-digit int", _raw("exit_code", "9" * 5000), "digit"),
    ("4000-digit int", _raw("exit_code", "9" * 4000), "exit_code"),
    ("config a string", _with(config="fast"), "config"),
    ("config a list", _with(config=[1, 2]), "config"),
    ("steps an object", _with(steps={"0": {}}), "steps"),
    ("steps a string", _with(steps="many"), "steps"),
    ("steps holding a number", _with(steps=[1, 2]), "steps[0]"),
    ("target a list", _with(target=["train.py"]), "target"),
    ("target a number", _with(target=3), "target"),
    ("provenance a string", _with(provenance="git"), "provenance"),
    ("provenance a list", _with(provenance=[]), "provenance"),
    ("name a number", _with(name=5), "name"),
    ("notes 100k deep", _raw("notes", "[" * 100_000 + "]" * 100_000), "deeper"),
    ("notes 500 deep", _raw("notes", "[" * 500 + "]" * 500), "deeper"),
    ("notes holding objects", _with(notes=[{"a": 1}]), "notes[0]"),
    ("1e308 step time", _step_field("total_ms", 1e308), "total_ms"),
    ("1e308 phase time", _step_field("forward_ms", 1e308), "forward_ms"),
    ("NaN step time", _raw_step("total_ms", "NaN"), "total_ms"),
    ("Infinity step time", _raw_step("data_ms", "Infinity"), "data_ms"),
    ("string step time", _step_field("total_ms", "10ms"), "total_ms"),
    ("string loss", _step_field("loss", "low"), "loss"),
    ("bool step index", _step_field("index", True), "index"),
    ("string samples", _step_field("samples", "8"), "samples"),
    ("2 Mi-character name", _with(name="n" * (2 << 20)), "name"),
    ("2 Mi-character note", _with(notes=["x" * (2 << 20)]), "notes[0]"),
    ("artifacts holding a list", _with(artifacts={"trace": ["a"]}), "artifacts"),
    ("a JSON list", lambda: "[1, 2, 3]", "JSON object"),
    ("not JSON", lambda: "name: base\n", "not valid JSON"),
]

LONG_NAME = 1 << 20
"""The longest legal name (:data:`torchscalpel.record_schema.MAX_STRING`): loads, and must be rendered truncated."""
MANY_STEPS = 60_000
"""Steps in the long-run record: loads, and must be drawn downsampled."""


def long_name_record() -> str:
    data = valid_record()
    data["name"] = "N" * LONG_NAME
    return json.dumps(data)


def many_steps_record(steps: int = MANY_STEPS) -> str:
    return json.dumps(valid_record(steps))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
