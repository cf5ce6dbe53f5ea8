"""The config file end to end: scalpel profile takes its run window and run root from scalpel.toml."""

from __future__ import annotations

from pathlib import Path

from helpers import run_cli
from torchscalpel.record import load_record

SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "scripts" / "epoch_loop.py"


def test_profile_takes_the_file_defaults_and_the_flags_win(tmp_path):
    (tmp_path / "scalpel.toml").write_text(
        '[defaults]\nout_root = "runs"\nwarmup = 0\n\n[defaults.profile]\nsteps = 2\nprofile_steps = 0\n'
    )
    proc = run_cli("profile", "--steps", "3", "--", str(SCRIPT), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = load_record(run_dir)
    assert (record.config["warmup"], record.config["steps"], record.config["profile_steps"]) == (0, 3, 0)
    assert len(record.measured_steps) == 3 and not any(s.warmup for s in record.steps)


def test_a_bad_config_key_is_one_sentence_and_exit_2(tmp_path):
    (tmp_path / "scalpel.toml").write_text("[defaults]\nstepz = 3\n")
    proc = run_cli("doctor", "--", str(SCRIPT), cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "scalpel.toml: unknown key 'stepz' in [defaults]" in lines[0], proc.stderr
    assert not (tmp_path / "scalpel-runs").exists()


def test_help_says_which_defaults_the_file_replaced(tmp_path):
    (tmp_path / "scalpel.toml").write_text("[defaults.profile]\nsteps = 7\nwarmup = 1\n")
    proc = run_cli("profile", "-h", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    help_text = " ".join(proc.stdout.split())
    assert "[scalpel.toml sets 7]" in help_text and "[scalpel.toml sets 1]" in help_text
    plain = run_cli("profile", "-h", cwd=tmp_path.parent)
    assert "scalpel.toml sets" not in plain.stdout
