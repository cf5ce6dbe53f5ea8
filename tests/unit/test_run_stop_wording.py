"""how_it_stopped: the one end-of-run wording of doctor, profile, memory and lr, one case per reason."""

from __future__ import annotations

from typing import Any

import pytest

from torchscalpel.record import RunRecord, StepRecord, new_run_record
from torchscalpel.runtime.run_notes import how_it_stopped


def _record(status: str, steps: int, stopped_by: dict[str, Any] | None, **extra: Any) -> RunRecord:
    config: dict[str, Any] = {"warmup": 2, "steps": 298}
    if stopped_by is not None:
        config["stopped_by"] = stopped_by
    record = new_run_record("t", status=status, config=config)  # type: ignore[arg-type]
    record.steps = [StepRecord(index=i, total_ms=1.0) for i in range(steps)]
    for key, value in extra.items():
        setattr(record, key, value)
    return record


@pytest.mark.parametrize(
    ("status", "steps", "stopped_by", "extra", "expected"),
    [
        # the doctor: the cap cut it at 228 of 300 and the page said "after the planned steps"
        (
            "stopped",
            228,
            {"kind": "time-cap", "cap_s": 120.0, "reason": "doctor time cap: 120 s reached"},
            {},
            "stopped by the 120 s time cap at step 228 of 300",
        ),
        (
            "stopped",
            300,
            {"kind": "steps", "reason": "stopped after 300 steps"},
            {},
            "ended after the 300 planned steps, as asked",
        ),
        (
            "stopped",
            41,
            {"kind": "divergence", "reason": "the smoothed loss diverged at lr 0.316"},
            {},
            "stopped at step 41 of 300: the smoothed loss diverged at lr 0.316",
        ),
        (
            "failed",
            7,
            {"kind": "memory-limit", "reason": "over 1 GiB"},
            {"exit_code": 1},
            "stopped by the memory limit at step 7 of 300",
        ),
        ("complete", 40, None, {}, "the script ran to its end after 40 step(s)"),
        ("failed", 3, None, {"exit_code": 2}, "the script failed at step 3 (exit code 2)"),
        ("interrupted", 12, None, {}, "stopped by Ctrl-C at step 12 of 300"),
        # the doctor's tail: the window, then the run went on unmeasured; what ended it is named
        (
            "complete",
            300,
            {"kind": "steps", "tail_s": 30.0, "tail_ran_s": 4.21, "tail_end": "script"},
            {},
            "measured 300 step(s), then ran on past the window for 4.2 s under the cheap checks only "
            "(saves, loads, exports; no timing), to the script's own end",
        ),
        (
            "stopped",
            300,
            {"kind": "steps", "tail_s": 30.0, "tail_ran_s": 30.02, "tail_end": "cap", "reason": "cap"},
            {},
            "measured 300 step(s), then ran on past the window for 30.0 s under the cheap checks only "
            "(saves, loads, exports; no timing) until the 30 s tail cap stopped it (--tail-cap)",
        ),
        (
            "failed",
            300,
            {"kind": "steps", "tail_s": 30.0, "tail_ran_s": 1.5, "tail_end": "script"},
            {"exit_code": 1},
            "measured 300 step(s), then ran on past the window for 1.5 s under the cheap checks only "
            "(saves, loads, exports; no timing); the script then failed (exit code 1)",
        ),
    ],
)
def test_each_reason_has_its_own_words(
    status: str, steps: int, stopped_by: dict[str, Any] | None, extra: dict[str, Any], expected: str
) -> None:
    assert how_it_stopped(_record(status, steps, stopped_by, **extra)) == expected


def test_profile_page_says_the_cap_not_the_planned_steps() -> None:
    from torchscalpel.report.profile_sections import _overview

    record = _record("stopped", 228, {"kind": "time-cap", "cap_s": 120.0, "reason": "cap"})
    section = _overview(record)
    assert section is not None
    assert "stopped by the 120 s time cap at step 228 of 300" in section.body
    assert "planned steps" not in section.body


def test_a_training_script_stopped_before_its_first_optimizer_step_is_not_called_inference() -> None:
    from torchscalpel.record import StepRecord
    from torchscalpel.runtime.run_notes import no_optimizer_note

    trained = [StepRecord(index=0, total_ms=5.0, forward_ms=2.0, backward_ms=3.0)]
    served = [StepRecord(index=i, total_ms=2.0, forward_ms=2.0) for i in range(3)]
    assert no_optimizer_note("forward", "complete", served) == (
        "no optimizer stepped: steps were delimited by forward calls (inference)"
    )
    for status, steps in (("stopped", served), ("failed", served), ("complete", trained)):
        note = no_optimizer_note("forward", status, steps)
        assert "inference" not in note and note.startswith("no optimizer stepped before the run ended")
