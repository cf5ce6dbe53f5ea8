"""Config file defaults: built-in defaults < scalpel.toml / pyproject.toml < flags; bad keys are one sentence."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchscalpel.cli import common
from torchscalpel.cli.main import apply_config, build_parser
from torchscalpel.config import load_defaults
from torchscalpel.errors import UsageError
from torchscalpel.tune.settings import read_settings_file


@pytest.fixture(autouse=True)
def _restore_runs_root(monkeypatch):
    monkeypatch.setattr(common, "RUNS_ROOT", None)  # restored after each test, whatever apply_config set


def _parse(folder: Path, monkeypatch: pytest.MonkeyPatch, *argv: str):
    monkeypatch.chdir(folder)
    parser = build_parser()
    apply_config(parser, argv[0])
    return parser.parse_args(list(argv))


def test_defaults_then_file_then_flags(tmp_path, monkeypatch):
    args = _parse(tmp_path, monkeypatch, "profile", "--", "train.py")
    assert (args.warmup, args.steps, args.step_kind, args.profile_steps) == (2, "20", "auto", 3)
    assert common.RUNS_ROOT is None
    (tmp_path / "scalpel.toml").write_text(
        '[defaults]\nwarmup = 5\nstep_timeout = 30\nout_root = "runs"\nprofile_steps = 1\n\n'
        '[defaults.profile]\nsteps = 8\nstep_kind = "backward"\n\n[defaults.doctor]\nsteps = "all"\n'
    )
    args = _parse(tmp_path, monkeypatch, "profile", "--", "train.py")
    assert (args.warmup, args.steps, args.step_kind, args.step_timeout, args.profile_steps) == (
        5,
        "8",
        "backward",
        30.0,
        1,
    )
    assert str(common.RUNS_ROOT) == "runs"
    assert common.default_run_dir("x").parent == Path("runs")
    args = _parse(tmp_path, monkeypatch, "profile", "--warmup", "7", "--steps", "all", "--", "train.py")
    assert (args.warmup, args.steps, args.step_kind) == (7, "all", "backward")
    doctor = _parse(tmp_path, monkeypatch, "doctor", "--", "train.py")
    assert (doctor.warmup, doctor.steps) == (5, "all")  # [defaults] profile_steps only reaches profile
    env = _parse(tmp_path, monkeypatch, "env")  # a command without defaults: untouched, run root reset
    assert common.RUNS_ROOT is None and not hasattr(env, "warmup")


def test_pyproject_tool_scalpel_is_read_when_scalpel_toml_has_no_defaults(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.scalpel.defaults]\nwarmup = 1\n\n[tool.scalpel.defaults.tune]\nsteps = 4\n'
    )
    found = load_defaults("tune", tmp_path)
    assert found.source == tmp_path / "pyproject.toml" and found.values == {"warmup": 1, "steps": "4"}
    # the file scalpel tune writes ([tune] only) does not hide pyproject's defaults
    (tmp_path / "scalpel.toml").write_text(
        '# written by scalpel tune\nversion = "1.0"\n\n[tune]\nthreads = 2\n'
    )
    args = _parse(tmp_path, monkeypatch, "tune", "--", "train.py")
    assert (args.warmup, args.steps) == (1, "4")


def test_defaults_sit_beside_tunes_tables_without_conflict(tmp_path):
    path = tmp_path / "scalpel.toml"
    path.write_text(
        'version = "1.0"\n\n[tune]\namp = "bf16"\n\n[tune.dataloader]\nnum_workers = 2\n\n'
        "[defaults]\nwarmup = 4\n"
    )
    assert load_defaults("profile", tmp_path).values == {"warmup": 4}
    settings = read_settings_file(path)  # what scalpel run reads is unchanged
    assert settings.amp == "bf16" and settings.dataloader.num_workers == 2


def test_no_file_means_no_defaults(tmp_path):
    found = load_defaults("doctor", tmp_path)
    assert found.source is None and found.values == {} and found.out_root is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[defaults]\nwarmpu = 3\n", "unknown key 'warmpu' in [defaults]"),
        ("[defaults]\nwarmup = -1\n", "in [defaults], warmup must be an integer >= 0, not -1"),
        ("[defaults]\nwarmup = true\n", "warmup must be an integer >= 0, not True"),
        ('[defaults.profile]\nsteps = "lots"\n', "in [defaults.profile], steps must be a number >= 1"),
        ('[defaults]\nstep_kind = "epoch"\n', "step_kind must be one of auto, optimizer, backward, forward"),
        ("[defaults]\nstep_timeout = 0\n", "step_timeout must be a number of seconds > 0"),
        (
            "[defaults.doctor]\nprofile_steps = 2\n",
            "'profile_steps' in [defaults.doctor] does not apply to scalpel doctor",
        ),
        ("[defaults.plan]\nwarmup = 2\n", "unknown table [defaults.plan]"),
        ("[profile]\nwarmup = 2\n", "unknown key 'profile'; per-command defaults go in [defaults.profile]"),
        ("[defaults\nwarmup = 2\n", "is not valid TOML"),
    ],
)
def test_bad_keys_and_values_name_the_file_and_the_key(tmp_path, text, needle):
    (tmp_path / "scalpel.toml").write_text(text)
    with pytest.raises(UsageError) as info:
        load_defaults("profile", tmp_path)
    assert needle in str(info.value)
    assert str(tmp_path / "scalpel.toml") in str(info.value)


def test_bad_pyproject_table_names_the_file(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.scalpel]\nwarmup = 3\n")
    with pytest.raises(UsageError, match=r"pyproject\.toml: unknown key 'warmup' in \[tool\.scalpel\]"):
        load_defaults("profile", tmp_path)
