"""scalpel fix's plan from a record: edits at the recorded sites, framework idioms, honest refusals;
its options and the missing-libcst message."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from torchscalpel.errors import UsageError
from torchscalpel.fix.doctor_plan import doctor_plan
from torchscalpel.fix.locate import tune_plan
from torchscalpel.fix.options import FixOptions
from torchscalpel.fix.planned import framework_of
from torchscalpel.record import new_run_record
from torchscalpel.sections import SitesSection


def _record(settings: dict[str, object], sites: dict[str, object]) -> object:
    record = new_run_record("tune", status="complete")
    record.provenance = {"code": {"script": {"path": "train.py", "sha256": "0" * 64}}}
    record.sections["tune"] = {"settings": settings}
    record.sections["sites"] = sites
    return record


def _site(line: int, cls: str = "", library: str | None = None, used: bool = True) -> dict[str, object]:
    return {"file": "/p/train.py", "line": line, "class": cls, "library": library, "used": used}


def test_each_tune_setting_becomes_an_edit_at_its_recorded_line() -> None:
    record = _record(
        {"optimizer": "fused", "matmul_precision": "high", "amp": "bf16", "dataloader": {"num_workers": 2}},
        {
            "optimizers": [_site(20, "AdamW")],
            "dataloaders": [_site(12, "DataLoader", used=False), _site(14, "DataLoader")],
            "forward": {**_site(30, "Net"), "device": "cpu"},
            "backward": _site(32),
            "model": _site(18, "Net"),
        },
    )
    plan = {p.label: p for p in tune_plan(record)}
    assert plan["optimizer fused=True"].edit.line == 20
    assert plan["optimizer fused=True"].edit.drop == ("foreach",)
    assert plan["DataLoader num_workers=2"].edit.line == 14  # the one that fed the steps
    amp = plan["autocast bf16"].edit
    assert (amp.line, amp.end_line, amp.code) == (
        30,
        32,
        'torch.autocast(device_type="cpu", dtype=torch.bfloat16)',
    )
    assert plan["matmul precision high"].file == Path("/p/train.py")


def test_bf16_already_on_at_the_forward_is_done_not_refused() -> None:
    record = _record(
        {"amp": "bf16"},
        {"forward": {**_site(30, "Net"), "device": "cpu", "autocast": True}, "backward": _site(32)},
    )
    (item,) = tune_plan(record)
    assert item.done and item.edit is None and item.reason == ""


def test_an_optimizer_built_in_a_library_is_not_patched_without_its_framework() -> None:
    record = _record({"optimizer": "fused"}, {"optimizers": [_site(53, "AdamW", library="somelib")]})
    (item,) = tune_plan(record)
    assert item.edit is None
    assert item.reason == (
        "the optimizer is built inside somelib, not in your code; "
        "tune measured no other config faster than the baseline that fix can place"
    )
    assert "fused=True" in item.snippet


def test_hf_and_lightning_are_read_from_the_sites() -> None:
    hf = SitesSection.from_dict({"optimizers": [_site(53, "AdamW", library="transformers")]})
    pl = SitesSection.from_dict(
        {"optimizers": [_site(32, "Adam")], "backward": _site(60, library="lightning")}
    )
    assert (framework_of(hf), framework_of(pl), framework_of(SitesSection())) == (
        "transformers",
        "lightning",
        None,
    )
    record = _record({"optimizer": "fused", "amp": "bf16"}, hf.to_dict())
    edits = [p.edit for p in tune_plan(record)]
    assert [(e.callee, e.kwargs) for e in edits] == [
        ("TrainingArguments", (("optim", "adamw_torch_fused"),)),
        ("TrainingArguments", (("bf16", True),)),
    ]


def test_doctor_findings_map_to_their_lines_and_others_are_left_alone() -> None:
    record = new_run_record("doctor", status="complete")
    record.findings = [
        {
            "rule": "unsafe-torch-load",
            "location": {"file": "/p/t.py", "line": 9},
            "fix": "torch.load(p, weights_only=True)",
        },
        {"rule": "loss-diverging", "location": {"file": "/p/t.py", "line": 3}},
    ]
    (item,) = doctor_plan(record)
    assert (item.rule, item.edit.kind, item.edit.line) == ("unsafe-torch-load", "safe_load", 9)


def test_options_refuse_a_folder_without_a_record(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a run folder"):
        FixOptions(run_dirs=(tmp_path,))
    with pytest.raises(UsageError, match="at least one RUN_DIR"):
        FixOptions(run_dirs=())


def test_without_libcst_fix_says_which_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchscalpel.fix import stage

    (tmp_path / "run.json").write_text("{}", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "libcst", None)  # import libcst now raises ImportError
    with pytest.raises(UsageError, match=r"pip install 'torchscalpel\[fix\]'"):
        stage.run(FixOptions(run_dirs=(tmp_path,)))
