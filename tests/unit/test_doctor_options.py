"""DoctorOptions: the one validated description of a doctor run, shared by the CLI, the demo and the API."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from torchscalpel.cli.main import main
from torchscalpel.doctor.api import diagnose
from torchscalpel.doctor.options import DoctorOptions
from torchscalpel.doctor.window import DOCTOR_WINDOW, TIME_CAP_S
from torchscalpel.runtime.target import Target


def test_defaults_are_the_doctor_window() -> None:
    options = DoctorOptions()
    assert (options.steps, options.warmup, options.time_cap_s) == ("auto", DOCTOR_WINDOW.warmup, TIME_CAP_S)
    assert options.static and options.nan_rerun and not options.sanity and not options.step_scalars


@pytest.mark.parametrize(
    ("fields", "flag"),
    [
        ({"time_cap_s": math.nan}, "--time-cap"),
        ({"time_cap_s": math.inf}, "--time-cap"),
        ({"time_cap_s": -1.0}, "--time-cap"),
        ({"steps": "some"}, "--steps"),
        ({"steps": 0}, "--steps"),
        ({"warmup": -1}, "--warmup"),
        ({"step_kind": "epoch"}, "--step-kind"),
        ({"step_timeout_s": 0.0}, "--step-timeout"),
    ],
)
def test_a_bad_value_is_refused_naming_its_flag(fields: dict[str, object], flag: str) -> None:
    from torchscalpel.options import usage_error

    with pytest.raises(ValueError, match=f"^{next(iter(fields))} ") as info:  # the library names the field
        DoctorOptions(**fields)  # type: ignore[arg-type]
    assert str(usage_error(info.value)).startswith(flag)  # the CLI, the flag


def test_options_are_frozen() -> None:
    with pytest.raises(AttributeError):
        DoctorOptions().steps = 3  # type: ignore[misc]


def test_diagnose_takes_options_or_fields_not_both(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="not both"):
        diagnose(Target(script=tmp_path / "t.py"), DoctorOptions(), steps=3)


def test_cli_refuses_a_nan_time_cap_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    code = main(["doctor", "--time-cap", "nan", "--out", str(tmp_path / "out"), str(script)])
    assert code == 2
    err = capsys.readouterr().err
    # the shared duration rule (units.parse_duration), as every other flag that takes seconds
    assert "--time-cap 'nan' is not a duration" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
