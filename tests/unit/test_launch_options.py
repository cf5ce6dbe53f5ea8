"""scalpel launch's options: read once from torchrun's parsed flags, never changed, and the only thing
distributed/ receives (torchrun's own namespace is built fresh where torchrun is called)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from torchscalpel.distributed.launch import build_parser, launch, rank_command
from torchscalpel.distributed.options import LaunchOptions
from torchscalpel.distributed.rank_entry import MODULE as RANK_ENTRY
from torchscalpel.errors import UsageError

SRC = Path(__file__).resolve().parents[2] / "src" / "torchscalpel" / "distributed"


def _options(tmp_path: Path, *argv: str) -> LaunchOptions:
    script = tmp_path / "train.py"
    script.write_text("")
    return LaunchOptions.from_args(build_parser().parse_args([*argv, "--", str(script), "--lr", "1"]), env={})


def test_the_options_are_frozen_and_keep_torchruns_other_flags(tmp_path: Path) -> None:
    options = _options(tmp_path, "--nproc", "2", "--max-restarts", "1", "--monitor-interval", "0.5")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.nproc_per_node = "4"  # type: ignore[misc]
    assert options.max_restarts == 1 and options.local_ranks == 2 and options.single_node
    namespace = options.torchrun_namespace()
    assert namespace.monitor_interval == 0.5 and namespace.max_restarts == 1
    assert namespace.training_script_args == ["--lr", "1"]
    namespace.training_script_args.append("x")  # torchrun's copy is its own
    assert options.training_script_args == ("--lr", "1")
    assert not hasattr(namespace, "nproc") and not hasattr(namespace, "profile")  # scalpel's flags stay here


def test_launch_hands_torchrun_the_rank_entry_and_leaves_the_options_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []
    monkeypatch.setattr("torch.distributed.run.run", lambda args: seen.append(args))
    for name in (
        "TORCHSCALPEL_LAUNCH",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
        "GLOO_SOCKET_IFNAME",
        "OMP_NUM_THREADS",
    ):
        monkeypatch.delenv(name, raising=False)  # launch() sets them for its ranks; put back after the test
    options = _options(tmp_path, "--nproc", "2", "--hang-timeout", "0")
    before = dataclasses.replace(options)
    assert launch(options, out_dir=tmp_path / "out") == 0
    (args,) = seen
    assert args.module is True and args.training_script == RANK_ENTRY
    assert args.training_script_args == ["exec", "--", options.training_script, "--lr", "1"]
    assert args.log_dir == str(tmp_path / "out" / "logs") and args.tee == "3"
    assert args.nproc_per_node == "2" and args.rdzv_endpoint.startswith("127.0.0.1:")
    assert options == before  # nothing in the launch changed what the user asked


def test_a_stage_runs_every_rank_through_scalpel_and_refuses_a_module(tmp_path: Path) -> None:
    options = _options(tmp_path, "--nproc", "2", "--doctor", "--steps", "5")
    assert options.check_collectives is True  # on by default with --doctor
    entry = rank_command(options, tmp_path / "out")
    assert entry.args[:4] == ("doctor", str(tmp_path / "out"), "--steps", "5")
    with pytest.raises(UsageError, match="drop -m"):
        LaunchOptions.from_args(build_parser().parse_args(["--doctor", "-m", "--", "pkg.train"]), env={})
    with pytest.raises(UsageError, match="--plan-device-memory only applies with --plan"):
        _options(tmp_path, "--plan-device-memory", "80GiB")


def test_nothing_under_distributed_takes_a_namespace_but_the_options_reader() -> None:
    takers = []
    for path in sorted(SRC.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for arg in [*node.args.args, *node.args.kwonlyargs]:
                    if arg.annotation is not None and "Namespace" in ast.unparse(arg.annotation):
                        takers.append(f"{path.name}:{node.name}")
    assert takers == ["options.py:_check_plan_flags", "options.py:from_args"]


def test_the_launch_is_named_as_every_other_stage_names_its_target(tmp_path: Path) -> None:
    # a script: its stem, the run folder launch-<stem>; a module (-m): its last part, as Target.name says
    options = _options(tmp_path, "--nproc", "1")
    assert options.name == "train" and Path(options.out).name.endswith("-launch-train")
    module = LaunchOptions.from_args(build_parser().parse_args(["-m", "--", "pkg.sub.trainer"]), env={})
    assert module.name == "trainer" and Path(module.out).name.endswith("-launch-trainer")
