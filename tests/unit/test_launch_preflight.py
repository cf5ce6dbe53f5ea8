"""scalpel launch --plan: world size, the plan command, and the verdict read from a plan's JSON."""

from __future__ import annotations

from torchscalpel.distributed.options import LaunchOptions
from torchscalpel.distributed.preflight import one_rank_env, plan_command, verdict, world_size


def _args(**kw) -> LaunchOptions:
    base = dict(
        nnodes="1",
        nproc_per_node="2",
        plan_device_memory=None,
        training_script="train.py",
        training_script_args=("--lr", "3e-4"),
    )
    return LaunchOptions(**{**base, **kw})


def _plan(fits: list[bool], alt_fits: bool = False) -> dict:
    rows = [
        {"strategy": s, "needed": 3 * 2**30, "fits": f}
        for s, f in zip(["ddp", "fsdp-full"], fits, strict=False)
    ]
    return {
        "device": {"name": "A100-80GB", "memory": 80 * 2**30},
        "world_size": 4,
        "batch_size": 8,
        "rows": rows,
        "alternatives": [{"strategy": "fsdp-full", "needed": 1, "fits": alt_fits}],
        "recommendation": "Use fsdp-full: it fits with the most headroom.",
    }


def test_world_size_multiplies_ranks_per_node_by_the_largest_node_count():
    assert world_size(_args()) == (2, 1)
    assert world_size(_args(nnodes="1:3", nproc_per_node="4")) == (12, 3)


def test_plan_command_plans_the_launch_world_with_the_script_and_its_arguments(tmp_path):
    cmd = plan_command(_args(nnodes="2", nproc_per_node="4", plan_device_memory="24GiB"), tmp_path)
    assert cmd[cmd.index("--world-size") + 1] == "8" and cmd[cmd.index("--nodes") + 1] == "2"
    assert cmd[cmd.index("--device-memory") + 1] == "24GiB"
    assert cmd[cmd.index("--") + 1 :] == ["train.py", "--lr", "3e-4"]
    assert "--device-memory" not in plan_command(_args(), tmp_path)


def test_the_plan_child_is_a_one_rank_world_on_loopback():
    env = one_rank_env()
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"]) == (
        "0",
        "1",
        "0",
        "127.0.0.1",
    )
    assert int(env["MASTER_PORT"]) > 0


def test_verdict_warns_only_when_no_strategy_fits():
    none = verdict(_plan([False, False]))
    assert not none.fits and none.lines[1].startswith("WARNING: this run will not fit")
    assert "ddp 3.00 GiB does NOT fit" in none.lines[0] and "4 rank(s)" in none.lines[0]
    some = verdict(_plan([False, True]))
    assert some.fits and some.lines[1].startswith("note: Use fsdp-full")
    every = verdict(_plan([True, True]))
    assert every.fits and len(every.lines) == 1
    # a fit found only with checkpointing flipped (the plan's alternatives) is still a fit
    assert verdict(_plan([False, False], alt_fits=True)).fits
