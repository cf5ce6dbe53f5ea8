"""The values ``scalpel fix`` reads from a run record, checked before any edit is planned.

A run folder travels (CI artifacts, a colleague's run, an issue's attachment), so its run.json is data
even when torchscalpel wrote it: fix turns some of its values into code (tune's settings, the device a
forward ran on, a block's class name) and reads others as paths and lines (recorded sites, findings'
locations, the script). Every such value is checked here against its declared type and allowed set:
tune's settings through :class:`~torchscalpel.tune.settings.TuneSettings` (the same checks as
``scalpel.toml``), the rest against the shapes :mod:`torchscalpel.runtime.sites`, doctor and memory
write. :func:`check_record` runs every check once when fix loads a record
(:func:`torchscalpel.fix.stage.load_checked`); :func:`tune_settings` and :func:`sites` are the typed
readers the planners (:mod:`torchscalpel.fix.locate`) take their values from.

A value that does not fit raises :class:`RecordValueError` naming the field. Paths are only type-checked
here: which files fix may edit or run is decided from where it runs (:mod:`torchscalpel.fix.files`),
never from a record.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from torchscalpel.errors import UsageError
from torchscalpel.record import RunRecord
from torchscalpel.sections import SitesSection, TuneSection
from torchscalpel.tune.settings import TuneSettings, is_module_name

DEVICE_TYPES = frozenset(
    {"cpu", "cuda", "xpu", "mps", "hpu", "mtia", "maia", "xla", "ipu", "meta", "privateuseone"}
)
"""torch device types a recorded forward may have run on (``torch.autocast``'s ``device_type``)."""
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_PATH = 4096
"""Longest path a record may name (Linux's PATH_MAX)."""
_SITE_LISTS = ("optimizers", "dataloaders")
_SITE_ONES = ("model", "forward", "backward", "step", "block", "accelerator")


class RecordValueError(UsageError):
    """A record value fix would use that does not fit its declared type or allowed set; the message
    names the field (``sections.sites.forward.device must be ...``)."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _fail(field: str, expected: str, value: Any) -> RecordValueError:
    return RecordValueError(f"{field} must be {expected}, not {_shown(value)}")


def _int(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _number(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    )


def _path(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_PATH and "\0" not in value


def _check(data: Mapping[str, Any], field: str, checks: dict[str, tuple[Callable[[Any], bool], str]]) -> None:
    """Each key of ``checks`` present (and not null) in ``data`` must pass its test."""
    for key, (test, expected) in checks.items():
        value = data.get(key)
        if value is not None and not test(value):
            raise _fail(f"{field}.{key}", expected, value)


def _object(value: Any, field: str) -> Mapping[str, Any]:
    """``value`` as a JSON object ({} for null)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(field, "an object", value)
    return value


def _list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(field, "a list", value)
    return value


def _objects(value: Any, field: str) -> list[Mapping[str, Any]]:
    """A list of JSON objects (null items too are refused: readers call ``.get`` on each)."""
    items = _list(value, field)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _fail(f"{field}[{i}]", "an object", item)
    return items


_SITE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "file": (_path, "a file path"),
    "line": (lambda v: _int(v, 1), "a line number (an integer >= 1)"),
    "class": (lambda v: v == "" or is_module_name(v), "a class name"),
    "library": (lambda v: isinstance(v, str), "a package name"),
    "used": (lambda v: isinstance(v, bool), "true or false"),
    "autocast": (lambda v: isinstance(v, bool), "true or false"),
    "device": (lambda v: isinstance(v, str) and v in DEVICE_TYPES, "a torch device type (cpu, cuda, ...)"),
    "input_dims": (
        lambda v: isinstance(v, list) and all(d is None or _int(d) for d in v),
        "a list of tensor dimensions",
    ),
}


def _site(value: Any, field: str) -> None:
    _check(_object(value, field), field, _SITE_CHECKS)


def sites(record: RunRecord) -> SitesSection:
    """``sections["sites"]``, every site's file, line, class, device, ... checked (see :data:`_SITE_CHECKS`)."""
    view = record.section(SitesSection)
    if view is None:
        if "sites" in record.sections:
            raise _fail("sections.sites", "an object", record.sections["sites"])
        return SitesSection()
    for key in _SITE_LISTS:
        for i, site in enumerate(_objects(getattr(view, key), f"sections.sites.{key}")):
            _site(site, f"sections.sites.{key}[{i}]")
    for key in _SITE_ONES:
        _site(getattr(view, key), f"sections.sites.{key}")
    return view


def tune_settings(record: RunRecord) -> TuneSettings | None:
    """Tune's kept settings as :class:`TuneSettings` (its checks: enums, ints in range, known knob
    names), None when the record has no tune section."""
    tune = record.section(TuneSection)
    if tune is None:
        return None
    return settings_of(tune.settings, "sections.tune.settings")


def settings_of(value: Any, field: str) -> TuneSettings:
    """One configuration of tune's settings read from a record (the kept one, or a trial's) as
    :class:`TuneSettings`, refused in one sentence naming ``field`` when it does not check."""
    if not isinstance(value, dict):
        raise _fail(field, "an object", value)
    try:
        return TuneSettings.from_dict(value)
    except ValueError as exc:
        text = str(exc)
        joiner = ": " if text.startswith("unknown") else "."
        raise RecordValueError(f"{field}{joiner}{text}") from None


def _check_tune(record: RunRecord) -> None:
    tune = record.section(TuneSection)
    if tune is None:
        return
    tune_settings(record)
    winner = _object(tune.winner, "sections.tune.winner")
    _check(
        winner,
        "sections.tune.winner",
        {
            "verdict": (lambda v: isinstance(v, str), "a string"),
            "median_ms": (_number, "a time in ms"),
            "baseline_ms": (_number, "a time in ms"),
            "confirm_pairs": (
                lambda v: (
                    isinstance(v, list)
                    and all(isinstance(p, list) and len(p) == 2 and all(_number(x) for x in p) for p in v)
                ),
                "a list of [baseline ms, candidate ms] pairs",
            ),
        },
    )
    facts = _object(tune.facts, "sections.tune.facts")
    for i, block in enumerate(_objects(facts.get("repeated"), "sections.tune.facts.repeated")):
        _check(
            block,
            f"sections.tune.facts.repeated[{i}]",
            {"cls": (lambda v: isinstance(v, str) and v.isidentifier(), "a class name")},
        )
    lines = _list(tune.code_lines, "sections.tune.code_lines")
    if not all(isinstance(line, str) for line in lines):
        raise _fail("sections.tune.code_lines", "a list of strings", lines)


def _check_findings(record: RunRecord) -> None:
    for i, finding in enumerate(record.findings):
        field = f"findings[{i}]"
        _check(finding, field, {"rule": (lambda v: isinstance(v, str), "a rule slug")})
        _check(
            _object(finding.get("location"), f"{field}.location"),
            f"{field}.location",
            {"file": (_path, "a file path"), "line": (_int, "a line number (an integer >= 0)")},
        )
        _list(finding.get("evidence"), f"{field}.evidence")


def _check_memory(record: RunRecord) -> None:
    memory = record.sections.get("memory")
    if memory is None:
        return
    memory = _object(memory, "sections.memory")
    _object(memory.get("top_cause"), "sections.memory.top_cause")
    oom = _object(memory.get("oom"), "sections.memory.oom")
    byte_count = (_int, "a byte count (an integer >= 0)")
    _check(oom, "sections.memory.oom", {"limit": byte_count, "live": byte_count})
    _check(
        _object(oom.get("request"), "sections.memory.oom.request"),
        "sections.memory.oom.request",
        {
            "bytes": byte_count,
            "step": (_int, "a step index"),
            "phase": (lambda v: isinstance(v, str), "a string"),
        },
    )
    _check(
        _object(oom.get("plan"), "sections.memory.oom.plan"),
        "sections.memory.oom.plan",
        {"batch": (_int, "a batch size (an integer >= 0)")},
    )
    for i, rung in enumerate(_objects(oom.get("ladder"), "sections.memory.oom.ladder")):
        field = f"sections.memory.oom.ladder[{i}]"
        _check(
            rung,
            field,
            {
                "kind": (lambda v: isinstance(v, str), "a rung name"),
                "fits": (lambda v: isinstance(v, bool), "true or false"),
                "action": (lambda v: isinstance(v, str), "a string"),
                "peak": byte_count,
                "saves": byte_count,
            },
        )
        _check(
            _object(rung.get("config"), f"{field}.config"),
            f"{field}.config",
            {"microbatches": (_int, "a micro-batch count (an integer >= 0)")},
        )


def _check_provenance(record: RunRecord) -> None:
    provenance = record.provenance or {}
    _check(
        _object(provenance.get("git"), "provenance.git"), "provenance.git", {"root": (_path, "a folder path")}
    )
    code = _object(provenance.get("code"), "provenance.code")
    sha = (lambda v: isinstance(v, str) and bool(SHA256.fullmatch(v)), "a sha256 (64 hex digits)")
    name = (_path, "a file path")
    _check(
        _object(code.get("script"), "provenance.code.script"),
        "provenance.code.script",
        {"path": name, "sha256": sha},
    )
    for key, entry in _object(code.get("modules"), "provenance.code.modules").items():
        field = f"provenance.code.modules[{_shown(key)}]"
        _check(_object(entry, field), field, {"path": name, "sha256": sha})
    target = record.target or {}
    _check(target, "target", {"script": (_path, "a file path")})
    args = _list(target.get("args"), "target.args")
    if not all(isinstance(a, str) for a in args):
        raise _fail("target.args", "a list of strings", args)


def check_record(record: RunRecord) -> None:
    """Every value fix reads from ``record``, checked against its type and allowed set; raises
    :class:`RecordValueError` naming the first field that does not fit."""
    _check_tune(record)
    sites(record)
    _check_findings(record)
    _check_memory(record)
    _check_provenance(record)
