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

import re
from collections.abc import Callable, Mapping
from typing import Any

from torchscalpel.errors import UsageError
from torchscalpel.record import RunRecord
from torchscalpel.sections import (
    DEVICE_TYPES,
    MAX_PATH,
    SitesSection,
    TuneSection,
    check_section,
    shown,
)
from torchscalpel.tune.settings import TuneSettings, is_module_name

SHA256 = re.compile(r"[0-9a-f]{64}")
_SITE_LISTS = ("optimizers", "dataloaders")
_SITE_ONES = ("model", "forward", "backward", "step", "block", "accelerator")


class RecordValueError(UsageError):
    """A record value fix would use that does not fit its declared type or allowed set; the message
    names the field (``sections.sites.forward.device must be ...``)."""


def _fail(field: str, expected: str, value: Any) -> RecordValueError:
    return RecordValueError(f"{field} must be {expected}, not {shown(value)}")


def _shared(record: RunRecord, key: str) -> None:
    """``sections[key]`` through the checks every reader shares (:func:`torchscalpel.sections.check_section`,
    which :func:`torchscalpel.record.load_record` runs too): a record built in memory gets them here."""
    if key in record.sections:
        problem = check_section(key, record.sections[key])
        if problem is not None:
            raise RecordValueError(problem)


def _int(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


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


def sites(record: RunRecord) -> SitesSection:
    """``sections["sites"]``: every site's file, line, ... checked as every reader checks them
    (:data:`torchscalpel.sections.SITE_FIELDS`), then what fix writes into code: each ``class`` a dotted name,
    each ``device`` a torch device type."""
    _shared(record, "sites")
    view = record.section(SitesSection)
    if view is None:
        return SitesSection()
    named: list[tuple[str, Any]] = [
        (f"sections.sites.{key}[{i}]", site)
        for key in _SITE_LISTS
        for i, site in enumerate(getattr(view, key))
    ]
    named += [(f"sections.sites.{key}", getattr(view, key)) for key in _SITE_ONES]
    for field, site in named:
        cls = (site or {}).get("class")
        if cls is not None and not (cls == "" or is_module_name(cls)):
            raise _fail(f"{field}.class", "a class name", cls)
        device = (site or {}).get("device")
        if device is not None and device not in DEVICE_TYPES:
            raise _fail(f"{field}.device", "a torch device type (cpu, cuda, ...)", device)
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
    _shared(record, "tune")  # the winner's times and pairs, the trials, code_lines, facts.repeated
    for i, block in enumerate((tune.facts or {}).get("repeated") or []):
        cls = block.get("cls")
        if cls is not None and not (isinstance(cls, str) and cls.isidentifier()):
            raise _fail(f"sections.tune.facts.repeated[{i}].cls", "a class name", cls)


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
    # The out-of-memory's request, plan batch and ladder (rungs, their config's micro-batches) are declared once
    # in torchscalpel.sections, for the renderers and for fix.
    _shared(record, "memory")


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
        field = f"provenance.code.modules[{shown(key)}]"
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
