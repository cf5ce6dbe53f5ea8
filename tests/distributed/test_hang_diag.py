"""The hang watch's pure parts: the rank log format, stack parsing, mismatch finding, naming the diverging rank.

L0/L1: no launch. The recorder is exercised on a one-rank gloo group so the wrapped collectives
are the real ones; the diagnosis runs on logs and faulthandler text built here.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from torchscalpel.distributed import hangwatch
from torchscalpel.distributed.hangdiag import diagnose, first_mismatch, parse_stacks, user_frame
from torchscalpel.runtime import collectives
from torchscalpel.runtime.collectives import CollectiveRecorder, RankLog, read_rank_log


def _log(rank: int, entries: list[dict], steps: int = 5, done: int = 10) -> RankLog:
    return RankLog(
        pid=1000 + rank,
        rank=rank,
        world=4,
        restart=0,
        finished=False,
        main_thread=1,
        steps=steps,
        completed=done,
        last_progress=0.0,
        step_ms=10.0,
        started=0.0,
        entries=entries,
    )


def _e(n: int, op: str, seq: int, site: str, shapes=((4,),), done: int = 1) -> dict:
    return {
        "done": done,
        "n": n,
        "op": op,
        "group": "default",
        "seq": seq,
        "shapes": [list(s) for s in shapes],
        "dtypes": ["float32"] * len(shapes),
        "site": site,
        "t": float(n),
    }


def test_recorder_round_trip_and_in_place_completion(tmp_path):
    rec = CollectiveRecorder(tmp_path, rank=3, world=4, restart=1)
    slot = rec.enter("all_reduce", "default", [[2, 3]], ["float32"], "/x/train.py:12")
    log = read_rank_log(tmp_path / "rank-3.log")
    assert log is not None and (log.rank, log.world, log.restart) == (3, 4, 1)
    assert log.pending()["op"] == "all_reduce" and log.pending()["seq"] == 1
    rec.finish(slot, ok=True)
    rec.on_step()
    rec.on_step()
    log = read_rank_log(tmp_path / "rank-3.log")
    assert log.pending() is None and log.entries[0]["done"] == 1 and log.completed == 1 and log.steps == 2
    assert log.step_ms > 0 and not log.finished
    rec.mark_finished()
    assert read_rank_log(tmp_path / "rank-3.log").finished
    for i in range(collectives.SLOTS + 5):  # the ring keeps the newest SLOTS entries, in order
        rec.finish(rec.enter("barrier", "default", [], [], f"t.py:{i}"), ok=True)
    log = read_rank_log(tmp_path / "rank-3.log")
    assert len(log.entries) == collectives.SLOTS and log.entries[-1]["seq"] == collectives.SLOTS + 6
    assert read_rank_log(tmp_path / "nothing.log") is None


def test_long_tensor_lists_are_cut_to_fit_a_slot(tmp_path):
    rec = CollectiveRecorder(tmp_path, rank=0, world=2, restart=0)
    rec.enter("all_gather", "default", [[1000, 1000]] * 200, ["float32"] * 200, "t.py:1")
    entry = read_rank_log(tmp_path / "rank-0.log").entries[0]
    assert entry["truncated"] and len(entry["shapes"]) == 4


@pytest.mark.dist
def test_wrapped_collectives_log_op_shape_and_the_callers_line(tmp_path, single_rank, monkeypatch):
    originals = {op: getattr(dist, op) for op in collectives.OPS if hasattr(dist, op)}
    c10d_originals = {
        op: getattr(dist.distributed_c10d, op) for op in collectives.OPS if hasattr(dist.distributed_c10d, op)
    }
    from torch.optim.optimizer import _global_optimizer_post_hooks

    hooks_before = set(_global_optimizer_post_hooks)
    try:
        collectives.install(tmp_path, rank=0, world=1)
        t = torch.ones(3, 2, dtype=torch.float64)
        line = sys._getframe().f_lineno + 1
        dist.all_reduce(t)
        dist.barrier()
        dist.all_gather_object([None], {"a": 1})  # its inner all_gather is not the user's collective
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    finally:
        for op, fn in originals.items():
            setattr(dist, op, fn)
        for op, fn in c10d_originals.items():
            setattr(dist.distributed_c10d, op, fn)
        faulthandler.unregister(collectives.STACK_SIGNAL)
        # install() registers a global optimizer post-hook for the rank's life; a test must not leave it behind
        # (tests/unit/test_hooks.py checks that no hook survives a run)
        for key in set(_global_optimizer_post_hooks) - hooks_before:
            del _global_optimizer_post_hooks[key]
    log = read_rank_log(tmp_path / "rank-0.log")
    ops = [(e["op"], e["seq"], e["done"]) for e in log.entries]
    assert ops == [("all_reduce", 1, 1), ("barrier", 2, 1), ("all_gather_object", 3, 1)]
    first = log.entries[0]
    assert first["shapes"] == [[3, 2]] and first["dtypes"] == ["float64"]
    assert first["site"] == f"{__file__}:{line}"
    assert log.steps == 1 and log.completed == 3


def test_parse_stacks_keeps_the_newest_dump_per_thread():
    text = """Thread 0x00000000000000aa (most recent call first):
  File "/old.py", line 1 in f

Current thread 0x00000000000000aa (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/home/u/train.py", line 88 in step
  File "/home/u/train.py", line 120 in <module>

Thread 0x00000000000000bb (most recent call first):
  File "/home/u/loader.py", line 5 in run
"""
    threads = parse_stacks(text)
    assert set(threads) == {0xAA, 0xBB}
    assert [f.line for f in threads[0xAA]] == [320, 88, 120]
    assert user_frame(threads[0xAA]).site() == "train.py:88"


def test_a_real_faulthandler_dump_parses(tmp_path):
    path = tmp_path / "stacks.txt"
    with path.open("w") as fh:
        faulthandler.dump_traceback(file=fh, all_threads=True)
    threads = parse_stacks(path.read_text())
    main = threads[threading.main_thread().ident]
    assert any(f.file == __file__ for f in main)


def test_first_mismatch_names_both_call_sites():
    same = [_e(0, "all_reduce", 1, "/u/t.py:10"), _e(1, "barrier", 2, "/u/t.py:11", shapes=())]
    logs = {
        0: _log(0, [*same, _e(2, "all_reduce", 3, "/u/t.py:20", shapes=((),), done=0)]),
        1: _log(1, [*same, _e(2, "barrier", 3, "/u/t.py:21", shapes=(), done=0)]),
    }
    found = first_mismatch(logs)
    assert found is not None and found["seq"] == 3
    assert "rank 0 calls all_reduce [] float32 from t.py:20" in found["message"]
    assert "rank 1 calls barrier from t.py:21" in found["message"]
    assert first_mismatch({0: _log(0, same), 1: _log(1, same)}) is None


def test_shapes_count_only_where_they_must_agree():
    a2a = [_e(0, "all_to_all_single", 1, "t.py:1", shapes=((4,),))]
    other = [_e(0, "all_to_all_single", 1, "t.py:1", shapes=((6,),))]
    assert first_mismatch({0: _log(0, a2a), 1: _log(1, other)}) is None  # uneven splits are legal
    ar = [_e(0, "all_reduce", 1, "t.py:1", shapes=((4,),))]
    ar5 = [_e(0, "all_reduce", 1, "t.py:1", shapes=((5,),))]
    assert "[5] float32" in first_mismatch({0: _log(0, ar), 1: _log(1, ar5)})["message"]


def test_the_minority_is_named_first():
    history = [_e(0, "all_reduce", 1, "/u/t.py:10")]
    logs = {r: _log(r, [*history, _e(1, "all_reduce", 2, "/u/t.py:88", done=0)]) for r in (0, 2, 3)}
    logs[1] = _log(1, [*history, _e(1, "barrier", 2, "/u/t.py:95", shapes=(), done=0)])
    diag = diagnose(logs, {}, {}, [0, 1, 2, 3])
    assert diag["diverging_ranks"] == [1]
    assert (
        diag["summary"]
        == "rank 1 is in barrier #2 from t.py:95; ranks 0, 2, 3 are in all_reduce #2 from t.py:88"
    )


def test_a_rank_outside_any_wait_is_the_culprit():
    frames = parse_stacks("""Current thread 0x0000000000000001 (most recent call first):
  File "/u/train.py", line 20 in __getitem__
  File "/venv/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py", line 52 in fetch
  File "/u/train.py", line 28 in <module>
""")[1]
    waiting = parse_stacks("""Current thread 0x0000000000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 630 in backward
  File "/u/train.py", line 31 in <module>
""")[1]
    logs = {r: _log(r, [_e(0, "broadcast", 1, "/u/train.py:5")]) for r in (0, 1)}
    diag = diagnose(logs, {0: waiting, 1: frames}, {}, [0, 1])
    assert diag["diverging_ranks"] == [1]
    assert diag["summary"].startswith(
        "rank 1 is not in a collective: at train.py:20 in __getitem__ (inside a DataLoader)"
    )
    assert "rank 0 is in backward() from train.py:31" in diag["summary"]


def test_a_rank_that_died_first_is_named_and_a_tie_names_no_one():
    logs = {r: _log(r, [_e(0, "all_reduce", 1, "/u/t.py:9", done=0)]) for r in (0, 1)}
    dead = {1: "killed by SIGUSR2 while asked for its stack", 0: "killed by SIGTERM, after rank 1 died"}
    diag = diagnose(logs, {}, dead, [0, 1])
    assert diag["diverging_ranks"] == [1] and diag["summary"].startswith("rank 1 is dead (killed by SIGUSR2")
    tie = {
        0: _log(0, [_e(0, "all_reduce", 1, "/u/a.py:1", done=0)]),
        1: _log(1, [_e(0, "broadcast", 1, "/u/a.py:2", done=0)]),
    }
    diag = diagnose(tie, {}, {}, [0, 1])
    assert diag["diverging_ranks"] == [] and diag["summary"].startswith(
        "the ranks disagree: rank 0 is in all_reduce #1"
    )


def test_a_tie_in_where_the_ranks_wait_is_broken_by_the_first_mismatch():
    # 4 gloo ranks, rank 1 all-reduces 5 values where the others send 4 (tests/fixtures/distributed/hang_shape.py): two
    # ranks get through that all_reduce and wait in the next one, two wait in it; two against two is a tie,
    # but the desync that caused it had one rank on its own side
    history = [_e(0, "all_reduce", 1, "/u/hang_shape.py:16")]
    sizes = {0: 4, 1: 5, 2: 4, 3: 4}
    logs = {}
    for r in (0, 1, 2, 3):
        stuck = r in (1, 2)
        entries = [
            *history,
            _e(1, "all_reduce", 2, "/u/hang_shape.py:18", shapes=((sizes[r],),), done=0 if stuck else 1),
        ]
        if not stuck:
            entries.append(_e(2, "all_reduce", 3, "/u/hang_shape.py:16", done=0))
        logs[r] = _log(r, entries)
    diag = diagnose(logs, {}, {}, [0, 1, 2, 3])
    assert diag["diverging_ranks"] == [1]
    assert diag["summary"] == (
        "rank 1 diverged first, collective #2 differs across ranks: rank 1 calls all_reduce [5] float32 from "
        "hang_shape.py:18; ranks 0, 2, 3 call all_reduce [4] float32 from hang_shape.py:18; now ranks 1, 2 are in "
        "all_reduce #2 from hang_shape.py:18; ranks 0, 3 are in all_reduce #3 from hang_shape.py:16"
    )


def test_timeout_defaults_to_a_multiple_of_the_step_time_with_a_floor(tmp_path):
    watch = hangwatch.HangWatch(hangwatch.WatchOptions(folder=tmp_path, report_dir=tmp_path, local_ranks=2))
    fresh = {0: _log(0, [], steps=0, done=0), 1: _log(1, [], steps=0, done=0)}
    assert watch.timeout_for(fresh) == hangwatch.STARTUP_S
    fast = {r: _log(r, []) for r in (0, 1)}
    assert watch.timeout_for(fast) == hangwatch.FLOOR_S
    slow = {0: _log(0, []), 1: _log(1, [])}
    slow[1].step_ms = 10_000.0
    assert watch.timeout_for(slow) == hangwatch.MULTIPLE * 10.0
    watch.options.hang_timeout = 5.0
    assert watch.timeout_for(fast) == 5.0 and watch.timeout_for(fresh) == hangwatch.STARTUP_FLOOR_S


def test_exit_status_reads_a_dead_child_without_reaping_it():
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGUSR2)"])
    deadline = time.monotonic() + 30
    while hangwatch.exit_status(proc.pid) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hangwatch.exit_status(proc.pid) == "killed by SIGUSR2"
    assert proc.wait() == -12  # still ours to reap
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert hangwatch.exit_status(sleeper.pid) is None
    hangwatch.kill_rank(sleeper.pid)
    assert sleeper.wait(timeout=30) == -9


def test_launch_flags_are_validated_and_the_doctor_checks_collectives(tmp_path):
    from torchscalpel.distributed.launch import build_parser, rank_command, watch_options
    from torchscalpel.distributed.options import LaunchOptions
    from torchscalpel.errors import UsageError

    script = tmp_path / "t.py"
    script.write_text("")

    def parse(*argv: str) -> LaunchOptions:
        return LaunchOptions.from_args(build_parser().parse_args(list(argv)), env={})

    with pytest.raises(UsageError, match="--hang-timeout -3 must be 0"):
        parse("--nproc", "2", "--hang-timeout", "-3", "--", str(script))
    assert parse("--nproc", "2", "--doctor", "--", str(script)).check_collectives is True
    assert (
        parse("--nproc", "2", "--doctor", "--no-check-collectives", "--", str(script)).check_collectives
        is False
    )
    plain = parse("--nproc", "2", "--hang-timeout", "7", "--", str(script), "--lr", "1")
    opts = watch_options(plain, tmp_path)
    assert opts.hang_timeout == 7.0 and opts.local_ranks == 2 and opts.check is False
    entry = rank_command(plain, tmp_path)
    assert entry.script == "torchscalpel.distributed.rank_entry" and entry.module is True
    assert list(entry.args) == ["exec", "--", str(script), "--lr", "1"]
    assert watch_options(parse("--nproc", "2", "--hang-timeout", "0", "--", str(script)), tmp_path) is None
    off_but_checked = watch_options(
        parse("--nproc", "2", "--hang-timeout", "0", "--check-collectives", "--", str(script)), tmp_path
    )
    assert off_but_checked.hang_timeout == float("inf") and off_but_checked.check


def test_the_text_report_leaves_out_torchscalpels_own_frames():
    from torchscalpel.distributed.hangdiag import format_report

    frames = parse_stacks("""Current thread 0x0000000000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/src/torchscalpel/runtime/collectives.py", line 267 in wrapper
  File "/u/train.py", line 20 in <module>
  File "<frozen runpy>", line 88 in _run_code
""")[1]
    logs = {0: _log(0, [_e(0, "all_reduce", 1, "/u/train.py:20", done=0)])}
    diag = diagnose(logs, {0: frames}, {}, [0])
    text = format_report({**diag, "idle_s": 5.0, "hang_timeout_s": 5.0})
    assert "/u/train.py:20 in <module>" in text and "distributed_c10d.py:3252" in text
    assert "collectives.py" not in text and "runpy" not in text
    assert len(diag["ranks"]["0"]["stack"]) == 4  # the JSON keeps them all


def test_a_rank_killed_by_the_stack_request_is_the_diverging_one_whatever_order_the_deaths_were_seen() -> (
    None
):
    from torchscalpel.distributed.hangdiag import diagnose

    # rank 0 was stopped by torchrun (SIGTERM) right after rank 1 died of the stack request; the watch
    # saw rank 0's death first, or judged it in a round of its own
    dead = {
        0: "killed by SIGTERM while asked for its stack",
        1: "killed by SIGUSR2 while asked for its stack",
    }
    diag = diagnose({}, {}, dead, [0, 1])
    assert diag["diverging_ranks"] == [1]
    assert diag["ranks"]["0"]["where"] == "dead (killed by SIGTERM, after rank 1 died)"
