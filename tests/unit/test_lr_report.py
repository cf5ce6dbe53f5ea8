"""scalpel lr's renderers read sections["lr"] through LrSection: the terminal lines and the log-x chart."""

from __future__ import annotations

from torchscalpel.lrfind.observer import LrSweepObserver
from torchscalpel.lrfind.options import LrOptions
from torchscalpel.record import RunRecord
from torchscalpel.report.lr_sections import build
from torchscalpel.report.lr_terminal import summary_lines
from torchscalpel.sections import LrSection


class _Step:
    def __init__(self, index: int, loss: float) -> None:
        self.index, self.loss = index, loss


def _record(losses: list[float]) -> RunRecord:
    """The observer fed by hand: one optimizer step and one closed step per loss."""
    observer = LrSweepObserver(LrOptions(min_lr=1e-5, max_lr=1.0, steps=len(losses)))

    class _Opt:
        param_groups = [{"lr": 0.1, "params": []}]

    opt = _Opt()
    for i, loss in enumerate(losses):
        observer.on_optimizer_step_pre(opt)  # type: ignore[arg-type]
        observer.on_step_end(_Step(i, loss))  # type: ignore[arg-type]
        if observer.divergence:
            break
    record = RunRecord(name="lr")
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
    lines = summary_lines(lr)
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
    assert any("no suggestion" in line for line in summary_lines(lr))
    assert LrSection.from_dict(lr.to_dict()).to_dict() == lr.to_dict()
