"""Turn :class:`TuneSettings` into setup hooks, code lines and a numerics class.

The same function serves a tune trial (setup hooks handed to the runtime) and ``scalpel run``
(the hooks applied around a plain run of the script), so what was measured is what runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torchscalpel.tune.knobs import EXACT, NUMERICS_ORDER, ApplyLog, SetupHook, Undo, all_knobs
from torchscalpel.tune.settings import TuneSettings


def setup_hooks(settings: TuneSettings, log: ApplyLog) -> list[SetupHook]:
    """One setup hook per knob that ``settings`` sets, in registry order."""
    hooks = []
    for knob in all_knobs():
        hook = knob.setup_hook(settings, log)
        if hook is not None:
            hooks.append(hook)
    return hooks


@contextmanager
def applied(settings: TuneSettings, log: ApplyLog | None = None) -> Iterator[ApplyLog]:
    """Apply ``settings`` for the duration of the block (undone in reverse order, even on error)."""
    log = log if log is not None else ApplyLog()
    undos: list[Undo] = []
    try:
        for hook in setup_hooks(settings, log):
            undos.append(hook())
        yield log
    finally:
        for undo in reversed(undos):
            undo()


def numerics_class(settings: TuneSettings) -> str:
    """The loosest numerics class among the knobs ``settings`` sets (``exact`` for the baseline)."""
    worst = EXACT
    for knob in all_knobs():
        if knob.is_set(settings) and NUMERICS_ORDER.index(knob.numerics) > NUMERICS_ORDER.index(worst):
            worst = knob.numerics
    return worst


def knob_families(settings: TuneSettings) -> list[str]:
    """Names of the knob families ``settings`` sets."""
    return [knob.name for knob in all_knobs() if knob.is_set(settings)]


def code_lines(settings: TuneSettings) -> list[str]:
    """The equivalent edits, for users who prefer to change their script by hand."""
    lines: list[str] = []
    for knob in all_knobs():
        if knob.is_set(settings):
            lines.append(f"# {knob.description}")
            lines.extend(knob.code_lines(settings))
    return lines
