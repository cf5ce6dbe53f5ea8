"""scalpel launch without ranks: argument handling, failure report, usage errors."""

from __future__ import annotations

import argparse

import pytest

from helpers import run_cli
from torchscalpel.distributed.launch import (
    RankFailure,
    build_parser,
    failure_report,
    rank_command,
    stderr_tail,
)
from torchscalpel.distributed.options import LaunchOptions
from torchscalpel.errors import UsageError


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def prepare(args: argparse.Namespace, env: dict[str, str]) -> LaunchOptions:
    return LaunchOptions.from_args(args, env=env)


def test_single_node_rendezvous_is_loopback(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    args = prepare(_parse("--nproc", "2", "--", str(script), "--lr", "1"), env={})
    assert args.nproc_per_node == "2"
    assert args.rdzv_backend == "c10d" and args.rdzv_endpoint.startswith("127.0.0.1:")
    assert args.training_script_args == ("--lr", "1")


def test_multi_node_keeps_the_given_endpoint(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    args = prepare(
        _parse(
            "--nnodes",
            "2",
            "--nproc",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "10.0.0.1:29400",
            "--",
            str(script),
        ),
        env={},
    )
    assert args.rdzv_endpoint == "10.0.0.1:29400"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nproc", "2"], "Name the script"),
        (["--nproc", "2", "--", "missing.py"], "does not exist"),
        (["--nproc", "0", "--", "SCRIPT"], "at least 1"),
        (["--nnodes", "2", "--rdzv-backend", "c10d", "--", "SCRIPT"], "needs --rdzv-endpoint"),
    ],
)
def test_usage_errors(tmp_path, argv, message):
    script = tmp_path / "t.py"
    script.write_text("")
    argv = [str(script) if a == "SCRIPT" else a for a in argv]
    with pytest.raises(UsageError, match=message):
        prepare(_parse(*argv), env={})


def test_failure_report_names_rank_signal_and_restarts():
    report = failure_report(
        RankFailure(rank=1, local_rank=1, exit_code=-9, tail=["x", "boom"]), restarts=2, nnodes="1"
    )
    assert report.startswith("scalpel launch: rank 1 failed: killed by SIGKILL, after 2 restarts")
    assert report.endswith("    boom")
    assert RankFailure(rank=0, local_rank=0, exit_code=-9, tail=[]).shell_code() == 137
    assert RankFailure(rank=0, local_rank=0, exit_code=3, tail=[]).shell_code() == 3


def test_stderr_tail_reads_newest_attempt(tmp_path):
    for attempt, text in ((0, "old\n"), (1, "a\n\nb\n")):
        folder = tmp_path / "run_x" / f"attempt_{attempt}" / "1"
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(text)
    assert stderr_tail(tmp_path, 1) == ["a", "b"]
    assert stderr_tail(tmp_path, 0) == []


def test_cli_usage_error_exit_2():
    proc = run_cli("launch", "--nproc", "2", "--", "no_such_script.py")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("scalpel: error: Script no_such_script.py does not exist")
    )
    text = build_parser().format_help()  # what 'scalpel launch -h' prints: torchrun's options plus ours
    assert "--max-restarts" in text and "--nproc" in text and "--profile" in text


def test_profile_and_doctor_rewrite_the_entry_point(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    args = prepare(
        _parse("--nproc", "2", "--profile", "--steps", "4", "--", str(script), "--lr", "1"), env={}
    )
    entry = rank_command(args, tmp_path / "out")
    assert args.stage == "profile"
    assert entry.module is True and entry.script == "torchscalpel.distributed.rank_entry"
    assert list(entry.args) == [
        "profile",
        str(tmp_path / "out"),
        "--steps",
        "4",
        "--",
        str(script),
        "--lr",
        "1",
    ]
    doctor = prepare(_parse("--nproc", "2", "--doctor", "--", str(script)), env={})
    assert doctor.stage == "doctor"
    assert rank_command(doctor, tmp_path / "out").args[0] == "doctor"
    assert args.training_script == str(script) and args.module is False  # the options stay the user's
    with pytest.raises(UsageError, match="drop -m"):
        prepare(_parse("--profile", "-m", "--", "pkg.train"), env={})
