"""plan's one options class: a script's model or a factory's, validated in the library's words and the CLI's,
run by one stage that saves as ``scalpel plan`` does (the in-process ``torchscalpel.plan`` included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import torchscalpel
from torchscalpel.cli.main import build_parser
from torchscalpel.options import usage_error
from torchscalpel.plan.options import PlanOptions
from torchscalpel.runtime.target import Target


def test_one_class_for_both_ways_to_name_the_model() -> None:
    script = PlanOptions(target=Target(script=Path("train.py")), world_size=2)
    factory = PlanOptions(model="pkg.models:build", batch="x=float32[8,4]")
    assert script.name == "train" and factory.name == "build" and factory.model_name == "pkg.models:build"
    args = build_parser().parse_args(
        ["plan", "--model", "m:f", "--batch", "x=float32[2,4]", "--no-max-batch"]
    )
    parsed = PlanOptions.from_args(args)
    # without --out, from_args names the run folder after the factory (the CLI names nothing itself)
    assert parsed.out_dir is not None and parsed.out_dir.name.endswith("-plan-f")
    assert parsed.replace(out_dir=None) == PlanOptions(
        model="m:f", batch="x=float32[2,4]", search_max_batch=False
    )


@pytest.mark.parametrize(
    ("fields", "library", "cli"),
    [
        (
            {"strategy": "ddp"},
            "strategy ddp needs world_size 2 or more; use strategy single for one rank",
            "--strategy ddp needs --world-size 2 or more; use --strategy single for one rank.",
        ),
        (
            {"world_size": 4, "nodes": 3},
            "nodes 3 must be at least 1 and divide world_size 4",
            "--nodes 3 must be at least 1 and divide --world-size 4.",
        ),
        ({"batch": None}, "Factory mode needs batch", "Factory mode needs --batch, e.g. --batch"),
    ],
)
def test_bad_options_are_named_as_the_caller_wrote_them(fields: dict, library: str, cli: str) -> None:
    with pytest.raises(ValueError) as raised:
        PlanOptions(**{"model": "m:f", "batch": "x=float32[2,4]", **fields})
    assert str(raised.value).startswith(library)
    assert str(usage_error(raised.value)).startswith(cli)
    with pytest.raises(ValueError, match="not both"):
        PlanOptions(target=Target(script=Path("t.py")), model="m:f")


def test_in_process_plan_saves_through_the_stage_when_given_a_folder(tmp_path: Path) -> None:
    def tiny() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    result = torchscalpel.plan(
        tiny, "x=float32[2,4]", device_memory="1GiB", max_batch=False, out=tmp_path / "p"
    )
    saved = json.loads((tmp_path / "p" / "run.json").read_text())
    assert saved["sections"]["plan"]["rows"] == result.to_dict()["rows"]
    assert (tmp_path / "p" / "report.html").is_file()
    assert torchscalpel.plan(
        tiny, "x=float32[2,4]", device_memory="1GiB", max_batch=False
    ).rows  # no folder, nothing saved
