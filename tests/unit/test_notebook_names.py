"""Notebooks: a cell is named as Jupyter names it, a RunRecord prints as one line, and a seed set in an
earlier cell counts for the block's unseeded-run check."""

from __future__ import annotations

import sys
import types

import pytest

from torchscalpel.doctor.rules.rt_checkpoint import UnseededRun
from torchscalpel.findings import Location, location_text, notebook_cell
from torchscalpel.record import RunRecord, StepRecord
from torchscalpel.runtime.summary import summarize

CELL = "/tmp/ipykernel_21012/2765614298.py"


def test_a_kernel_cell_file_is_named_as_a_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    # no IPython in this process: the cell's file name is all there is
    assert str(Location(file=CELL, line=25)) == "cell 2765614298, line 25"
    assert notebook_cell("/home/me/train.py") is None
    assert str(Location(file="/home/me/train.py", line=3)) == "/home/me/train.py:3"


def test_the_running_kernel_gives_the_in_number(monkeypatch: pytest.MonkeyPatch) -> None:
    # IPython's compiler keeps file name -> execution count; Jupyter's tracebacks say "Cell In[7], line 25"
    shell = types.SimpleNamespace(compile=types.SimpleNamespace(_filename_map={CELL: 7}))
    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: shell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert location_text(CELL, 25) == "Cell In[7], line 25"
    assert location_text("/tmp/ipykernel_21012/99.py", 2) == "cell 99, line 2"  # a cell it does not know


def test_run_record_repr_is_one_short_line() -> None:
    r = RunRecord(name="inprocess", status="stopped")
    r.steps = [StepRecord(index=i, warmup=i < 2, total_ms=12.3, forward_ms=12.3) for i in range(400)]
    r.sections["trace"] = {"top_ops": [{"name": f"aten::op{i}", "self_us": 1.0} for i in range(500)]}
    r.summary = summarize(r)
    text = repr(r)
    assert "\n" not in text and len(text) < 160, text
    assert (
        text
        == "RunRecord(name='inprocess', status='stopped', steps=400 (398 measured), median step 12.30 ms)"
    )


def _unseeded(record: RunRecord) -> list[str]:
    rule = UnseededRun()
    rule.steps = 3
    return [f.rule for f in rule.findings(record)]


def test_a_seed_set_before_the_block_counts() -> None:
    unseeded = RunRecord()
    assert _unseeded(unseeded) == ["unseeded-run"]
    seeded_before = RunRecord(provenance={"seeds": {"before_block": {"torch_initial_seed": 0, "set": True}}})
    assert _unseeded(seeded_before) == []
    random_start = RunRecord(
        provenance={"seeds": {"before_block": {"torch_initial_seed": 13694398711321989256, "set": False}}}
    )
    assert _unseeded(random_start) == ["unseeded-run"]


def test_seed_state_reads_a_manual_seed() -> None:
    import torch

    from torchscalpel.runtime.provenance import torch_seed_state

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        assert torch_seed_state() == {"torch_initial_seed": 0, "set": True}
        torch.seed()  # a fresh random 64-bit seed: as at startup
        assert torch_seed_state()["set"] is (torch.initial_seed() < 2**32)
    finally:
        torch.random.set_rng_state(state)


@pytest.mark.parametrize("seed_first", [True, False], ids=["seeded-in-an-earlier-cell", "never-seeded"])
def test_in_process_doctor_counts_the_seed_of_an_earlier_cell(tmp_path, seed_first: bool) -> None:
    import torch

    import torchscalpel

    state = torch.random.get_rng_state()
    try:
        if seed_first:
            torch.manual_seed(0)  # "cell 1"
        else:
            torch.seed()  # as a fresh kernel starts: a random 64-bit seed
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with torchscalpel.doctor(steps=3, warmup=1, out=tmp_path / "doc", report=False, static=False) as run:
            for _ in range(6):  # "cell 2": trains without seeding
                opt.zero_grad()
                model(torch.randn(2, 4)).pow(2).mean().backward()
                opt.step()
    finally:
        torch.random.set_rng_state(state)
    assert run.record is not None
    assert run.record.provenance["seeds"]["before_block"]["set"] is seed_first
    assert ("unseeded-run" in {f.rule for f in run.findings}) is (not seed_first)
    assert repr(run.record).startswith(
        "RunRecord(name='doctor-inprocess', status='stopped', steps=4 (3 measured)"
    )


def test_a_report_of_a_cell_names_the_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchscalpel.report.html import record_page

    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    r = RunRecord(name="inprocess", status="stopped", target={"inprocess": f"{CELL}:4"})
    r.steps = [StepRecord(index=i, total_ms=5.0, forward_ms=5.0) for i in range(3)]
    r.summary = summarize(r)
    page = record_page(r)
    assert "cell 2765614298, line 4" in page and "ipykernel_21012" not in page
