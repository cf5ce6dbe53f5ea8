"""Every verb's options class has one shape (frozen, keyword-only, slotted, validated), written once and
built the same way by the CLI (``from_args``) and by the in-process API."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

import torchscalpel
from torchscalpel.cli.main import build_parser
from torchscalpel.doctor.options import DoctorOptions
from torchscalpel.errors import UsageError
from torchscalpel.fix.options import FixOptions
from torchscalpel.lrfind.options import LrOptions
from torchscalpel.memory.options import MemoryOptions
from torchscalpel.options import PROFILE_EVENT_BUDGET, STEP_TIMEOUT_S, StageOptions, usage_error
from torchscalpel.plan.options import PlanOptions
from torchscalpel.runtime.profile_options import ProfileOptions
from torchscalpel.runtime.session import RuntimeOptions
from torchscalpel.runtime.window import MEMORY_WINDOW, PROFILE_WINDOW, StepWindow
from torchscalpel.stages.demo import DemoOptions
from torchscalpel.tune.batch_finder import BatchOptions
from torchscalpel.tune.options import TuneOptions


@pytest.fixture
def train_py(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A train.py in the working folder: ``from_args`` resolves the script the command line names."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("", encoding="utf-8")
    return tmp_path / "train.py"


VERB_OPTIONS = (
    DoctorOptions,
    MemoryOptions,
    ProfileOptions,
    TuneOptions,
    LrOptions,
    BatchOptions,
    FixOptions,
    PlanOptions,
    DemoOptions,
)


@pytest.mark.parametrize("cls", VERB_OPTIONS, ids=lambda c: c.__name__)
def test_every_verbs_options_have_the_one_shape(cls: type) -> None:
    assert issubclass(cls, StageOptions)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert "__slots__" in cls.__dict__
    assert all(f.kw_only for f in dataclasses.fields(cls))
    assert inspect.ismethod(cls.from_args)  # type: ignore[attr-defined]  # the CLI's one way in


def test_a_mutable_or_positional_options_class_is_refused() -> None:
    with pytest.raises(TypeError, match="is not frozen"):

        @dataclasses.dataclass(kw_only=True, slots=True)
        class Mutable(StageOptions):
            x: int = 1

    with pytest.raises(TypeError, match="takes x by position"):

        @dataclasses.dataclass(frozen=True, slots=True)
        class Positional(StageOptions):
            x: int = 1

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class NoSlots(StageOptions):
        x: int = 1

    with pytest.raises(TypeError, match="no __slots__"):
        NoSlots()

    class Plain(StageOptions):
        pass

    with pytest.raises(TypeError, match="not a dataclass"):
        Plain()


def test_the_shared_numbers_are_written_once() -> None:
    assert RuntimeOptions().step_timeout_s == STEP_TIMEOUT_S == DoctorOptions().step_timeout_s
    assert LrOptions().step_timeout_s == BatchOptions(sizes=(2,)).step_timeout_s == STEP_TIMEOUT_S
    assert (
        RuntimeOptions().profile_event_budget == PROFILE_EVENT_BUDGET == PROFILE_WINDOW.profile_event_budget
    )
    for command in ("profile", "doctor", "memory", "lr"):
        assert vars(build_parser().parse_args([command, "train.py"]))["step_timeout"] == STEP_TIMEOUT_S
    assert vars(build_parser().parse_args(["profile", "train.py"]))["profile_budget"] == PROFILE_EVENT_BUDGET


def test_a_step_window_validates_itself() -> None:
    with pytest.raises(ValueError, match=r"^warmup must be an integer >= 0, not -1$"):
        StepWindow(warmup=-1, steps=3)
    with pytest.raises(ValueError, match=r"^profile_event_budget must be at least 1 event, got 0$") as info:
        StepWindow(warmup=0, steps=3, profile_event_budget=0)
    assert str(usage_error(info.value)) == "--profile-budget must be at least 1 event, got 0."
    with pytest.raises(dataclasses.FrozenInstanceError):
        PROFILE_WINDOW.steps = 3  # type: ignore[misc]


def test_library_errors_name_the_argument_and_the_cli_the_flag() -> None:
    from torchscalpel.errors import ArgumentError, literal

    error = ArgumentError("{steps} must be a number, got " + literal(repr("{x}")))
    assert isinstance(error, ValueError) and str(error) == "steps must be a number, got '{x}'"
    assert str(usage_error(error)) == "--steps must be a number, got '{x}'."
    for call in (lambda: torchscalpel.doctor(time_cap_s=-1.0), lambda: torchscalpel.memory(warmup=-2)):
        with pytest.raises(ValueError) as info:
            call()
        assert not str(info.value).startswith("--")
    with pytest.raises(ValueError, match=r"^min_lr \(1\) must be below max_lr \(0\.1\)$") as lr:
        LrOptions(min_lr=1.0, max_lr=0.1)
    assert str(usage_error(lr.value)) == "--min (1) must be below --max (0.1)."


def test_doctor_steps_none_means_the_same_in_the_options_and_the_api() -> None:
    assert (
        DoctorOptions(steps=None).planned_steps is None
    )  # until the end, as torchscalpel.doctor(steps=None)
    assert DoctorOptions(steps="all").planned_steps is None
    assert DoctorOptions().planned_steps == 300 == DoctorOptions(steps=300).planned_steps
    assert torchscalpel.doctor(steps=None).options.steps is None
    assert torchscalpel.doctor(steps="auto").options.steps == 300
    assert torchscalpel.doctor().options.steps == 300


def test_the_cli_and_the_api_build_the_same_doctor_options(train_py: Path) -> None:
    args = build_parser().parse_args(["doctor", "train.py"])
    assert DoctorOptions.from_args(args) == DoctorOptions()


def test_memory_decides_its_window_once(train_py: Path) -> None:
    assert MemoryOptions().window_steps == MEMORY_WINDOW.steps
    assert MemoryOptions(memory_limit=1 << 20).window_steps is None  # every step under a limit
    assert MemoryOptions(steps=None).window_steps is None
    args = build_parser().parse_args(["memory", "--memory-limit", "1MiB", "train.py"])
    cli = MemoryOptions.from_args(args)
    assert cli == MemoryOptions(memory_limit=1 << 20)
    api = torchscalpel.memory(memory_limit="1MiB")
    assert api.options.steps is None and cli.runtime(out_dir=None, name="x").steps is None
    until = MemoryOptions.from_args(build_parser().parse_args(["memory", "--until-eval", "train.py"]))
    assert until.until_eval_steps == MEMORY_WINDOW.warmup + MEMORY_WINDOW.steps
    assert until.runtime(out_dir=None, name="x").steps is None  # the observer ends the run


def test_profile_runs_the_op_line_pass_from_the_cli_and_the_api(train_py: Path) -> None:
    cli = ProfileOptions.from_args(build_parser().parse_args(["profile", "train.py"]))
    assert cli == ProfileOptions()
    assert cli.runtime(out_dir=None, name="x").op_line_steps == 1
    assert torchscalpel.profile().options.op_line_steps == 1
    assert torchscalpel.profile(op_lines=False).options.op_line_steps == 0
    no = ProfileOptions.from_args(build_parser().parse_args(["profile", "--no-op-lines", "train.py"]))
    assert no.runtime(out_dir=None, name="x").op_line_steps == 0


def test_tune_fit_goes_through_the_options_checks(tmp_path: Path, train_py: Path) -> None:
    args = build_parser().parse_args(["tune", "--fit", "1GiB", "--min-measure", "0", "train.py"])
    options = TuneOptions.from_args(args)
    assert options.fit == "1GiB" and options.fit_steps == 5
    args = build_parser().parse_args(["tune", "--fit", "lots", "train.py"])
    with pytest.raises(UsageError, match="--fit"):
        TuneOptions.from_args(args)
    with pytest.raises(ValueError, match=r"^confirm_pairs must be at least 1"):
        TuneOptions(out_dir=tmp_path, confirm_pairs=0, fit="1GiB")
    with pytest.raises(ValueError, match="needs out_dir"):
        _ = TuneOptions().folder


def test_the_result_types_are_exported_and_are_what_the_functions_return() -> None:
    import torch

    from torchscalpel.record import RunRecord, StepRecord

    assert {"Comparison", "PlanResult", "Finding", "Severity", "InProcessRun"} <= set(torchscalpel.__all__)

    def tiny() -> torch.nn.Module:
        return torch.nn.Linear(4, 2)

    assert isinstance(
        torchscalpel.plan(tiny, "x=float32[2,4]", device_memory="1GiB", max_batch=False),
        torchscalpel.PlanResult,
    )

    def rec(ms: float) -> RunRecord:
        return RunRecord(name=f"r{ms}", steps=[StepRecord(index=i, total_ms=ms) for i in range(4)])

    assert isinstance(torchscalpel.compare(rec(1.0), rec(2.0)), torchscalpel.Comparison)
    assert isinstance(torchscalpel.doctor(), torchscalpel.InProcessRun)
