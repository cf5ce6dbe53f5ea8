"""The in-process API as a user's editor and type checker see it: plain functions with their real
parameters, listed by ``dir()``, whose defaults are the CLI's."""

from __future__ import annotations

import inspect

import pytest

import torchscalpel
from torchscalpel.cli.main import build_parser
from torchscalpel.doctor.window import DEFAULT_STEPS, TIME_CAP_S

API = ("doctor", "memory", "profile")


@pytest.mark.parametrize("name", API)
def test_the_api_functions_are_functions_with_their_real_parameters(name: str) -> None:
    func = getattr(torchscalpel, name)
    assert inspect.isfunction(func) and func.__doc__
    params = inspect.signature(func).parameters
    assert {"steps", "warmup", "out", "report", "quiet"} <= set(params), params
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())


def test_dir_lists_the_api_and_not_the_helpers_the_package_imported() -> None:
    assert {*API, "InProcessRun", "RunRecord", "load_record", "save_record", "__version__"} <= set(
        torchscalpel.__all__
    )
    assert sorted(torchscalpel.__all__) == dir(torchscalpel)
    assert not {"Any", "importlib", "_doctor_package"} & set(dir(torchscalpel))


def test_the_functions_survive_a_later_import_of_their_subpackages() -> None:
    # Importing a submodule of torchscalpel.doctor / .memory must not rebind the package attribute.
    from torchscalpel.doctor import api  # noqa: F401
    from torchscalpel.memory import analysis  # noqa: F401

    assert inspect.isfunction(torchscalpel.doctor) and inspect.isfunction(torchscalpel.memory)
    assert "steps" in inspect.signature(torchscalpel.doctor).parameters


def _cli_defaults(command: str) -> dict[str, object]:
    return vars(build_parser().parse_args([command, "train.py"]))


def _api_defaults(name: str) -> dict[str, object]:
    return {k: p.default for k, p in inspect.signature(getattr(torchscalpel, name)).parameters.items()}


def test_the_in_process_doctor_runs_the_cli_window() -> None:
    cli, api = _cli_defaults("doctor"), _api_defaults("doctor")
    assert cli["steps"] == "auto" and api["steps"] == DEFAULT_STEPS == 300  # --steps auto is DEFAULT_STEPS
    assert api["warmup"] == cli["warmup"] and api["time_cap_s"] == cli["time_cap"] == TIME_CAP_S


def test_the_in_process_profile_and_memory_defaults_are_the_cli_defaults() -> None:
    from torchscalpel.cli.memory import DEFAULT_STEPS as MEMORY_STEPS

    cli, api = _cli_defaults("profile"), _api_defaults("profile")
    assert (api["steps"], api["warmup"], api["profile_steps"]) == (
        int(cli["steps"]),
        cli["warmup"],
        cli["profile_steps"],
    )
    cli, api = _cli_defaults("memory"), _api_defaults("memory")
    assert api["warmup"] == cli["warmup"]
    assert torchscalpel.memory().options.steps == MEMORY_STEPS


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_one_warmup_check_for_the_flag_the_config_key_and_the_api(bad: object) -> None:
    from torchscalpel.cli.common import steps_arg
    from torchscalpel.config import Defaults
    from torchscalpel.errors import UsageError

    with pytest.raises(ValueError, match=r"^warmup must be an integer >= 0, not "):
        torchscalpel.profile(warmup=bad)  # the library names its argument, the CLI its flag (below)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^warmup must be an integer >= 0, not "):
        Defaults(warmup=bad)  # type: ignore[arg-type]
    args = build_parser().parse_args(["profile", "train.py"])
    args.warmup = bad
    with pytest.raises(UsageError, match=r"^--warmup must be an integer >= 0, not .*\.$"):
        steps_arg(args)


def test_plan_and_compare_are_functions_users_can_script() -> None:
    from torchscalpel.compare import core  # noqa: F401
    from torchscalpel.plan import planner  # a later submodule import must not rebind the names

    assert planner is not None
    for name in ("plan", "compare"):
        func = getattr(torchscalpel, name)
        assert inspect.isfunction(func) and func.__doc__, name
        assert name in dir(torchscalpel)


def test_in_process_plan_has_the_cli_defaults_and_plans_a_factory() -> None:
    import torch

    cli = vars(build_parser().parse_args(["plan", "--model", "m:f", "--batch", "x=float32[2,4]"]))
    api = _api_defaults("plan")
    for flag, param in [
        ("world_size", "world_size"),
        ("nodes", "nodes"),
        ("strategy", "strategy"),
        ("precision", "precision"),
        ("grad_accum", "grad_accum"),
        ("activation_checkpointing", "checkpointing"),
    ]:
        assert api[param] == cli[flag], (param, api[param], cli[flag])

    def tiny() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    result = torchscalpel.plan(tiny, "x=float32[2,4]", device_memory="1GiB", max_batch=False)
    rows = result.to_dict()["rows"]
    assert [r["strategy"] for r in rows] == ["single"]
    params = sum(p.numel() for p in tiny().parameters()) * 4
    assert rows[0]["params"] == params and rows[0]["grads"] == params  # fp32 weights and gradients


def test_in_process_compare_takes_records_and_refuses_one(tmp_path) -> None:
    from torchscalpel.errors import UsageError
    from torchscalpel.record import RunRecord, StepRecord

    def rec(ms: float) -> RunRecord:
        steps = [StepRecord(index=i, total_ms=ms, forward_ms=ms / 2, backward_ms=ms / 2) for i in range(8)]
        return RunRecord(name=f"r{ms}", steps=steps)

    cmp = torchscalpel.compare(rec(10.0), rec(20.0))
    assert cmp.to_dict()["pairs"][0]["verdict"]
    import pytest as _pytest

    with _pytest.raises(UsageError, match="two runs or more"):
        torchscalpel.compare(rec(10.0))
