"""scalpel lr's renderers read sections["lr"] through LrSection: the terminal lines and the log-x chart."""

from __future__ import annotations

import re

import torchscalpel.report.lr_terminal as lr_terminal
from torchscalpel.lrfind.observer import LrSweepObserver
from torchscalpel.lrfind.options import LrOptions
from torchscalpel.record import RunRecord
from torchscalpel.record_check import check_invariants
from torchscalpel.report.lr_sections import build
from torchscalpel.report.lr_terminal import DISCARD, DISCARD_UNSUGGESTED
from torchscalpel.sections import LrSection


class _Step:
    def __init__(self, index: int, loss: float) -> None:
        self.index, self.loss = index, loss


def _record(losses: list[float], steps: int | None = None, *, flags: tuple[str, ...] = ()) -> RunRecord:
    """The observer fed by hand: one optimizer step and one closed step per loss (``steps``: the sweep's
    length, ``len(losses)`` by default: a script that ends first gives fewer)."""
    options = LrOptions(min_lr=1e-5, max_lr=1.0, steps=steps or max(len(losses), 8))
    observer = LrSweepObserver(options, step_flags=flags)

    class _Opt:
        param_groups = [{"lr": 0.1, "params": []}]

    opt = _Opt()
    for i, loss in enumerate(losses):
        observer.on_optimizer_step_pre(opt)  # type: ignore[arg-type]
        observer.on_step_end(_Step(i, loss))  # type: ignore[arg-type]
        if observer.divergence:
            break
    record = RunRecord(name="lr", status="complete")
    observer.on_finish(record)
    return record


def test_the_observer_sets_the_sweep_and_stops_at_divergence() -> None:
    losses = [2.0 - 0.03 * i for i in range(30)] + [50.0] * 10
    record = _record(losses)
    lr = record.section(LrSection)
    assert lr is not None
    assert lr.divergence is not None and lr.divergence["step"] >= 30
    assert len(lr.points) == lr.divergence["step"] + 1  # nothing recorded after the stop
    assert lr.suggestion is not None and lr.points[0]["lr"] == 1e-5
    lines = lr_terminal.render(lr)
    assert any(line.startswith("suggested lr: ") for line in lines)
    assert any(line.startswith("diverged at lr ") for line in lines)
    assert "discard them" in lines[-1]
    # the smoothed minimum (skipping the divergence point) is the last point of the descent, step 29
    assert lr.min_over_10 is not None and lr.min_over_10["step"] == 29
    assert lr.min_over_10["lr"] == lr.points[29]["lr"] / 10 == lr.min_over_10["min_lr"] / 10
    assert f"minimum / 10: {lr.min_over_10['lr']:.3g} (" in "\n".join(lines)


def test_the_chart_is_log_x_with_both_marks() -> None:
    record = _record([2.0 - 0.03 * i for i in range(30)] + [50.0] * 10)
    (section,) = build(record)
    assert 'data-chart="lr-range-test"' in section.body
    assert ">1e-5<" in section.body and ">1e-1<" in section.body  # decade ticks up to the divergence
    assert section.body.count('class="mark"') == 2


def test_no_suggestion_says_why() -> None:
    lr = LrSection.from_dict(_record([1.0 + 0.01 * i for i in range(20)]).sections["lr"])
    assert lr.suggestion is None
    assert any("no suggestion" in line for line in lr_terminal.render(lr))
    assert LrSection.from_dict(lr.to_dict()).to_dict() == lr.to_dict()


def test_a_short_sweep_suggests_nothing_and_says_how_far_it_got() -> None:
    """A loss that falls the whole way, but the script ends after 20 of the sweep's 100 steps (mnist for one
    epoch): neither suggestion is read off the start of the curve; the reason, the lr reached and how to get
    the steps are printed and recorded, and the chart marks no suggestion."""
    record = _record([2.0 - 0.05 * i for i in range(20)], steps=100, flags=("--epochs",))
    lr = record.section(LrSection)
    assert lr is not None
    assert lr.suggestion is None and lr.min_over_10 is None
    assert lr.steps_run == 20 and lr.reached_lr == lr.points[-1]["lr"] and 0.18 < lr.range_share < 0.2
    assert lr.not_measured is not None and lr.not_measured.startswith(
        "the script ended after 20 of the sweep's 100 steps, at lr"
    )
    assert lr.to_measure is not None and "its --epochs argument" in lr.to_measure
    assert "scalpel lr --steps 20 " in lr.to_measure
    lines = lr_terminal.render(lr)
    text = "\n".join(lines)
    assert f"suggested lr: not measured: {lr.not_measured}" in lines
    assert "minimum / 10: not measured: the same reason" in lines
    assert lr.to_measure in lines
    assert "(19% of the range on a log scale) in 20 of the sweep's 100 steps" in lines[0]
    assert "train afresh" not in text and lines[-1] == DISCARD_UNSUGGESTED
    (section,) = build(record)
    assert 'class="mark"' not in section.body and not re.search(r"suggested \d", section.body)
    assert check_invariants(record) == []
    # the invariant every record keeps: a suggestion beside such a sweep is a broken record
    forged = RunRecord(name="lr", status="complete")
    forged.sections["lr"] = {
        **record.sections["lr"],
        "suggestion": {"lr": 1e-4, "step": 10},
        "not_measured": None,
    }
    (violation,) = check_invariants(forged)
    assert "suggestion from a sweep of 20 of its 100 steps that did not diverge" in violation


def test_a_full_sweep_that_never_diverges_still_suggests() -> None:
    losses = [2.0 - 1.5 * (i / 40) ** 2 if i < 40 else 0.5 + 0.001 * i for i in range(60)]
    lr = record_lr = _record(losses).section(LrSection)
    assert record_lr is not None and lr is not None
    assert lr.divergence is None and lr.steps_run == 60 and lr.range_share == 1.0
    assert lr.not_measured is None and lr.suggestion is not None and lr.min_over_10 is not None
    assert lr_terminal.render(lr)[-1] == DISCARD


def test_no_optimizer_step_says_nothing_was_measured() -> None:
    """A script that never steps an optimizer: no "train afresh with the suggested lr" when none was
    suggested, but what happened and what to change."""
    lr = _record([]).section(LrSection)
    assert lr is not None and lr.suggestion is None and lr.steps_run == 0
    lines = lr_terminal.render(lr)
    assert lines[0] == "swept no lr: none of the sweep's 8 steps (1e-05 -> 1) ran"
    assert lines[1].startswith("suggested lr: not measured: the script never called an optimizer's step()")
    assert "optimizer.step() in the loop" in lines[1]
    assert not any("train afresh" in line or "discard" in line for line in lines)
    failed = RunRecord(name="lr", status="failed", exit_code=1, error="ValueError: bad data")
    LrSweepObserver(LrOptions()).on_finish(failed)
    assert LrSection.from_dict(failed.sections["lr"]).not_measured == (
        "the script failed (exit code 1: ValueError: bad data) before its first optimizer step: the sweep never started"
    )
