"""``scalpel batch`` says "does not fit" only of a run that crossed a limit (issue 41): each size's outcome
(measured / does not fit / failed / not measured) and how the terminal table and the HTML section word it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import torchscalpel.report.batch_terminal as batch_terminal
from torchscalpel.record import RunRecord
from torchscalpel.report.batch_sections import build
from torchscalpel.report.batch_terminal import row_outcome
from torchscalpel.sections import BatchSection
from torchscalpel.tune.batch_finder import ForcedBatch, outcome, scaling_advice


def _outcome(**kwargs: Any) -> tuple[str, str]:
    run: dict[str, Any] = {
        "size": 300,
        "exit_code": 0,
        "error": None,
        "notes": [],
        "measured_steps": 0,
        "steps_seen": 2,
        "samples": 256,
        "warmup": 2,
        "steps": 5,
    }
    run.update(kwargs)
    return outcome(**run)


def test_a_size_above_the_data_is_not_measured_even_when_steps_ran() -> None:
    assert _outcome() == ("not measured", "the script's data has 256 samples, fewer than 300")
    # drop_last=False with many epochs: steps were timed, but every batch held 256 rows, not 300
    assert _outcome(measured_steps=4, steps_seen=6)[0] == "not measured"


def test_only_an_out_of_memory_does_not_fit() -> None:
    oom = _outcome(exit_code=1, error="OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert oom[0] == "does not fit" and "Tried to allocate" in oom[1]
    assert _outcome(exit_code=1, error="MemoryError")[0] == "does not fit"
    failed = _outcome(exit_code=1, error="ValueError: bad shape", samples=None)
    assert failed == ("failed", "ValueError: bad shape")
    assert _outcome(exit_code=3, samples=None) == ("failed", "exit code 3")


def test_a_script_that_ended_early_says_how_far_it_got() -> None:
    assert _outcome(samples=None) == (
        "not measured",
        "the script ended after 2 step(s), before 2 warm-up and 5 measured step(s)",
    )
    assert _outcome(samples=None, steps_seen=0, notes=["the script never completed a step"]) == (
        "not measured",
        "the script never completed a step",
    )
    assert _outcome(samples=1000, measured_steps=5, steps_seen=7) == ("measured", "")


def test_the_forced_loader_records_the_datasets_length() -> None:
    forced = ForcedBatch(300)
    undo = forced()
    try:
        DataLoader(TensorDataset(torch.zeros(256, 2)), batch_size=32)
        DataLoader(TensorDataset(torch.zeros(10, 2)), batch_size=32)  # a later loader: not the training data
    finally:
        undo()
    assert forced.samples == 256 and forced.original == 32

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    forced = ForcedBatch(8)
    undo = forced()
    try:
        DataLoader(Stream(), batch_size=4)
    finally:
        undo()
    assert forced.samples is None


def test_no_advice_when_no_size_was_measured_says_that() -> None:
    assert scaling_advice("SGD", 32, None).startswith("not measured: no batch size was measured")


def _section(rows: list[dict[str, Any]]) -> BatchSection:
    return BatchSection(sizes=[r["batch_size"] for r in rows], steps=5, warmup=2, rows=rows, advice="x")


ROWS = [
    {
        "batch_size": 300,
        "fits": False,
        "outcome": "not measured",
        "why": "the script's data has 256 samples, fewer than 300",
    },
    {
        "batch_size": 512,
        "fits": False,
        "outcome": "does not fit",
        "why": "OutOfMemoryError: CUDA out of memory",
    },
    {"batch_size": 64, "fits": False, "outcome": "failed", "why": "ValueError: bad"},
]


def test_the_terminal_and_the_page_word_each_outcome() -> None:
    lines = batch_terminal.render(_section(ROWS))
    assert "    300  not measured: the script's data has 256 samples, fewer than 300" in lines
    assert "    512  does not fit: OutOfMemoryError: CUDA out of memory" in lines
    assert "     64  failed: ValueError: bad" in lines
    record = RunRecord(name="b")
    record.sections["batch"] = {"sizes": [300, 512, 64], "steps": 5, "warmup": 2, "rows": ROWS, "advice": "x"}
    (section,) = build(record)
    assert (
        section.body.count("does not fit") == 1
        and "not measured" in section.body
        and "failed" in section.body
    )


@pytest.mark.parametrize(
    ("row", "said"),
    [
        ({"batch_size": 300, "fits": False, "why": "exit code 0"}, "not measured"),
        ({"batch_size": 512, "fits": False, "why": "RuntimeError: CUDA out of memory"}, "does not fit"),
        ({"batch_size": 8, "fits": True, "samples_per_s": 10.0}, "measured"),
        ({"batch_size": 8, "fits": False, "outcome": "nonsense", "why": "x"}, "not measured"),
    ],
)
def test_a_record_written_before_outcomes_says_does_not_fit_only_of_out_of_memory(
    row: dict[str, Any], said: str
) -> None:
    assert row_outcome(row) == said
