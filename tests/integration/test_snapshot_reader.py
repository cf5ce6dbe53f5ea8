"""The snapshot readers: the native streaming one and the pure-Python one agree, and both refuse.

The native reader compiles ``memory/snapshot_scan.c`` into a per-test cache folder; tests of the
native path skip (visibly) on a machine with no C compiler, where CI installs gcc first (.ci/run).
"""

from __future__ import annotations

import itertools
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

import torchscalpel.report.snapshot_terminal as snapshot_terminal
from torchscalpel.errors import UsageError
from torchscalpel.memory import snapshot as S
from torchscalpel.memory import snapshot_native as native

HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))


@pytest.fixture
def reader(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """read(path, native=True|False) -> the explanation, with the reader that ran checked."""
    monkeypatch.setenv("TORCHSCALPEL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "native-cache"))
    monkeypatch.setattr(native, "_loaded", None)

    def read(path: Path, use_native: bool) -> dict[str, Any]:
        monkeypatch.setenv("TORCHSCALPEL_NATIVE", "1" if use_native else "0")
        if use_native and not HAS_CC:
            pytest.skip("no C compiler on this machine: the native reader cannot be built (CI installs gcc)")
        r = S.read_snapshot(path)
        assert r["reader"] == ("native" if use_native else "python"), r.get("reader_note")
        return r

    return read


def _frames(pool: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    return [pool[(i * 3) % len(pool)], pool[(i * 5 + 1) % len(pool)], pool[i % 7]]


def snapshot_data(
    n_segments: int = 1003, devices: int = 2, shared: bool = True, trace_shares: bool = True
) -> dict[str, Any]:
    """A snapshot laid out as torch writes one: shared key strings and frame dicts, a list per traceback."""
    pool = [
        {
            "name": f"f{i}",
            "filename": f"/home/u/model_{i}.py" if i % 3 else "/x/site-packages/torch/nn/m.py",
            "line": i,
        }
        for i in range(40)
    ]
    segments, traces = [], [[] for _ in range(devices)]
    for s in range(n_segments):
        blocks = []
        for j in range(1 + s % 5):
            i = s * 7 + j
            tb = _frames(pool, i) if shared else [dict(f) for f in _frames(pool, i)]
            state = "inactive" if j == 2 else "active_allocated"
            blocks.append(
                {
                    "address": i,
                    "size": 512 * (1 + i % 50),
                    "requested_size": 500,
                    "state": state,
                    "frames": tb,
                }
            )
            if state == "active_allocated" and s % 2 == 0:
                traces[s % devices].append(
                    {
                        "action": "alloc",
                        "addr": i,
                        "size": 512 * (1 + i % 50),
                        "frames": tb if trace_shares else [dict(f) for f in tb],
                    }
                )
            if s % 3 == 0:
                traces[s % devices].append({"action": "free_completed", "addr": i, "size": 512, "frames": []})
        segments.append(
            {
                "device": 0,
                "address": s,
                "total_size": sum(b["size"] for b in blocks) + 4096,
                "segment_pool_id": (0, 0),
                "blocks": blocks,
            }
        )
    traces[-1].append({"action": "oom", "size": 1 << 30, "device_free": 10, "frames": _frames(pool, 11)})
    traces.append([{"action": "alloc", "size": 7, "frames": []}])  # a one-event trace: a single APPEND
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {"expandable_segments": False},
    }


def _write(tmp_path: Path, data: object, protocol: int = 4, name: str = "snap.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    return path


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    strip = ("reader", "reader_note", "scanner")
    assert {k: v for k, v in a.items() if k not in strip} == {k: v for k, v in b.items() if k not in strip}


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("shared", [True, False])
def test_native_and_python_readers_give_the_same_explanation(
    tmp_path: Path, reader, protocol: int, shared: bool
) -> None:
    data = snapshot_data(shared=shared)
    path = _write(tmp_path, data, protocol)
    ours, theirs = reader(path, True), reader(path, False)
    _same(ours, theirs)
    assert ours == {**S.explain(data), "reader": "native", "reader_note": "", "scanner": ours["scanner"]}
    assert ours["segments"] == 1003 and ours["ooms"][0]["bytes"] == 1 << 30
    assert ours["trace"]["events"] == sum(len(t) for t in data["device_traces"])


def test_segments_and_events_are_freed_as_they_are_read_and_only_shared_objects_stay(
    tmp_path: Path, reader, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = snapshot_data(n_segments=6003, shared=False, trace_shares=False)
    path = _write(tmp_path, data)
    whole = reader(path, False)
    monkeypatch.setattr(native, "SLICE_BYTES", 16384)
    monkeypatch.setenv("TORCHSCALPEL_NATIVE", "1")
    seen: list[tuple[int, int]] = []
    ours = S.read_snapshot(path, progress=lambda done, total: seen.append((done, total)))
    assert ours["reader"] == "native"
    _same(ours, whole)
    stats = ours["scanner"]
    assert stats["streamed"] and stats["streamed_events"] == sum(len(t) for t in data["device_traces"])
    # every block dict, list and string is memoized once by the pickler; only what is fetched again is kept
    # (key, state, file and function name strings: about 100), not one entry per block
    assert stats["memo_entries"] > 10_000 and stats["memo_kept"] < 200
    # the pickler appends in batches of 1000, and one batch of segments at a time is built: the most
    # containers alive at once is a fraction of those made (a whole build would keep them all)
    assert stats["nodes_made"] > 100_000 and stats["nodes_peak"] < stats["nodes_made"] / 4
    # progress in slices, over both passes, ending at twice the file's size
    size = path.stat().st_size
    assert len(seen) > 20 and seen[-1] == (2 * size, 2 * size)
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(seen))


def test_an_object_fetched_once_leaves_the_memo_after_its_fetch(tmp_path: Path, reader) -> None:
    # a live block's traceback list is the same object as its alloc event's (torch dedups by traceback):
    # fetched once, in the trace, and then released, so such lists do not pile up for the whole read
    data = snapshot_data(shared=True, trace_shares=True)
    shared_once = sum(1 for t in data["device_traces"] for e in t if e["action"] == "alloc" and e["frames"])
    ours = reader(_write(tmp_path, data), True)
    _same(ours, reader(tmp_path / "snap.pickle", False))
    stats = ours["scanner"]
    assert stats["memo_released"] >= shared_once > 500 and stats["memo_kept"] < 200


def test_a_layout_the_streamer_does_not_handle_is_built_whole_and_explained_the_same(
    tmp_path: Path, reader
) -> None:
    data = snapshot_data(n_segments=20)
    # protocol 0 has no EMPTY_DICT: the root is built from a mark, so nothing is streamed
    p0 = reader(_write(tmp_path, data, protocol=0), True)
    assert not p0["scanner"]["streamed"]
    _same(p0, reader(_write(tmp_path, data, name="p4.pickle"), False))


def test_a_streamed_list_referred_to_again_is_kept_whole_and_summarized_once(tmp_path: Path, reader) -> None:
    data = snapshot_data(n_segments=40)
    data["segments_again"] = data["segments"]  # the pickler memoizes the list and fetches it for this key
    data["traces_again"] = data["device_traces"][0]
    path = _write(tmp_path, data)
    ours = reader(path, True)
    assert ours["scanner"]["kept_whole"] == 2
    _same(ours, reader(path, False))
    assert ours["segments"] == 40


def test_odd_values_are_read_as_python_reads_them(tmp_path: Path, reader) -> None:
    frames = [
        {"filename": "/home/\u00fc/\u2135 model.py", "line": None},
        {"filename": 7, "line": 1},
        {"filename": "/home/u/t.py", "line": "12"},
    ]
    blocks: list[Any] = [
        {"state": "active_allocated", "size": 1024.75, "requested_size": None, "frames": frames[:1]},
        {"state": "active_allocated", "size": True, "frames": frames[1:]},
        {"state": "active_allocated", "size": 2**40, "frames": ()},
        {"state": "inactive", "size": -5},
        {"state": "inactive ", "size": 9},
        "not a block",
    ]
    blocks.append(
        {"state": "active_allocated", "size": 3, "frames": blocks}
    )  # a traceback that is the blocks list
    data = {
        "segments": [{"total_size": 4096.0, "blocks": blocks}, None, {"blocks": "x"}],
        "device_traces": [
            None,
            [{"action": "oom", "size": 2.5, "device_free": True, "frames": frames}],
            [{"action": "oom", "frames": None}, 5],
        ],
    }
    for protocol in (0, 2, 4):
        path = _write(tmp_path, data, protocol, name=f"odd{protocol}.pickle")
        ours, theirs = reader(path, True), reader(path, False)
        _same(ours, theirs)
    assert ours["ooms"][0] == {
        "device": 1,
        "bytes": 2.5,
        "site": "/home/\u00fc/\u2135 model.py:None",
        "device_free": True,
    }
    assert ours["segments"] == 3 and ours["blocks"] == 4


def test_protocol_0_text_is_decoded_as_python_decodes_it(tmp_path: Path, reader) -> None:
    frames = [{"filename": "/home/\u00fc/\u2135 m\u00e9\nx.py", "line": 3}]
    data = {"segments": [{"blocks": [{"state": "active_allocated", "size": 8, "frames": frames}]}]}
    path = _write(tmp_path, data, protocol=0)
    ours = reader(path, True)
    _same(ours, reader(path, False))
    assert ours["sites"] == [{"name": "/home/\u00fc/\u2135 m\u00e9\nx.py:3", "bytes": 8}]


# (plain opcodes first, the refused opcode with its argument, the name the sentence gives), put after the
# root dict's mark and first key, at byte 16
REFUSED = [
    (b"", b"cos\nsystem\n", "GLOBAL"),
    (b"\x8c\x02os\x8c\x06system", b"\x93", "STACK_GLOBAL"),
    (b"N)", b"R", "REDUCE"),
    (b"}}", b"b", "BUILD"),
    (b"(", b"ios\nsystem\n", "INST"),
    (b"(N", b"o", "OBJ"),
    (b"N)", b"\x81", "NEWOBJ"),
    (b"N)}", b"\x92", "NEWOBJ_EX"),
    (b"", b"P1\n", "PERSID"),
    (b"K\x01", b"Q", "BINPERSID"),
    (b"", b"\x82\x01", "EXT1"),
    (b"", b"\x83\x01\x00", "EXT2"),
    (b"", b"\x84\x01\x00\x00\x00", "EXT4"),
    (b"", b"\x97", "NEXT_BUFFER"),
    (b"K\x01", b"\x98", "READONLY_BUFFER"),
]


@pytest.mark.parametrize(("plain", "op", "name"), REFUSED, ids=[n for *_, n in REFUSED])
def test_every_opcode_that_is_not_plain_data_is_refused_before_anything_is_built(
    tmp_path: Path, reader, plain: bytes, op: bytes, name: str
) -> None:
    path = tmp_path / "evil.pickle"
    path.write_bytes(b"\x80\x04}\x94(\x8c\x08segments\x94" + plain + op + b"u.")
    if not HAS_CC:
        pytest.skip("no C compiler: the native reader cannot be built")
    reader(_write(tmp_path, {"segments": []}, name="ok.pickle"), True)  # builds the library
    with pytest.raises(UsageError) as err:
        S.read_snapshot(path)
    msg = str(err.value)
    assert err.value.exit_code == 2 and f"pickle opcode {name})" in msg and "refuses" in msg
    assert f"at byte {16 + len(plain)} it" in msg
    assert msg.count(". ") == 0 and "\n" not in msg


def test_a_real_object_is_refused_by_both_readers(
    tmp_path: Path, reader, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path, {"segments": [Path("x")]})
    for use_native in (True, False):
        if use_native and not HAS_CC:
            continue
        monkeypatch.setenv("TORCHSCALPEL_NATIVE", "1" if use_native else "0")
        with pytest.raises(UsageError, match="refuses") as err:
            S.read_snapshot(path)
        assert err.value.exit_code == 2


@pytest.mark.parametrize("use_native", [True, False])
def test_truncated_files_and_files_that_are_not_pickles_get_one_sentence(
    tmp_path: Path, reader, use_native: bool
) -> None:
    good = _write(tmp_path, snapshot_data(n_segments=50))
    reader(good, use_native)
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(UsageError, match="is cut short") as err:
        S.read_snapshot(cut)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    text = tmp_path / "notes.pickle"
    text.write_text("these are my notes, not a pickle\n")
    with pytest.raises(UsageError, match="is not a PyTorch memory snapshot") as err:
        S.read_snapshot(text)
    assert err.value.exit_code == 2
    for data in ([1, 2, 3], {"segments": (1, 2)}, {"other": []}):
        with pytest.raises(UsageError, match="no 'segments' list"):
            S.read_snapshot(_write(tmp_path, data, name="plain.pickle"))


def test_without_a_compiler_the_python_reader_runs_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHSCALPEL_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("TORCHSCALPEL_NATIVE", "1")
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(native, "_loaded", None)
    r = S.explain_snapshot(_write(tmp_path, snapshot_data(n_segments=30)))
    assert r["reader"] == "python" and r["reader_note"] == "no C compiler found (set CC, or install gcc)"
    assert any("pure-Python reader: no C compiler found" in line for line in snapshot_terminal.render(r))
    assert not (tmp_path / "empty-cache").exists() or not any((tmp_path / "empty-cache").iterdir())


def test_deep_nesting_and_self_reference_neither_crash_nor_recurse(tmp_path: Path, reader) -> None:
    # 200,000 nested lists as the one segment: the C reader frees and summarizes without recursion
    depth = 200_000
    evil = tmp_path / "deep.pickle"
    evil.write_bytes(b"\x80\x04}(\x8c\x08segments]" + b"]" * depth + b"a" * depth + b"u.")
    r = reader(evil, True)
    assert r["segments"] == 1 and r["blocks"] == 0
    blocks: list[Any] = []
    blocks.append({"state": "active_allocated", "size": 3, "frames": blocks})
    data = {"segments": [{"blocks": blocks}], "again": blocks}  # the traceback is the list being walked
    path = _write(tmp_path, data)
    _same(reader(path, True), reader(path, False))


CRASH_PROBE = """
import json, random, sys
from pathlib import Path
from torchscalpel.errors import ScalpelError
from torchscalpel.memory import snapshot as S
good = Path(sys.argv[1]).read_bytes()
rng = random.Random(7)
bad = Path(sys.argv[2])
outcomes = {"explained": 0, "refused": 0}
for i in range(300):
    data = bytearray(good)
    for _ in range(rng.randint(1, 6)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    if i % 5 == 0:
        data = data[: rng.randrange(len(data))]
    bad.write_bytes(bytes(data))
    try:
        r = S.read_snapshot(bad)
        assert r["reader"] == "native", r["reader_note"]
        outcomes["explained"] += 1
    except ScalpelError:
        outcomes["refused"] += 1
print(json.dumps(outcomes))
"""


def test_corrupted_snapshots_never_crash_the_native_reader(tmp_path: Path, reader) -> None:
    """300 files with random bytes changed or cut: each is explained or refused in one sentence, and the
    process survives (a crash in C would kill it: the probe runs in a child)."""
    import json
    import os
    import subprocess
    import sys

    good = _write(tmp_path, snapshot_data(n_segments=60))
    reader(good, True)  # builds the library into the test's cache
    env = {**os.environ, "PYTHONPATH": str(Path(S.__file__).parents[2])}
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_PROBE, str(good), str(tmp_path / "bad.pickle")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcomes["explained"] + outcomes["refused"] == 300 and outcomes["refused"] > 50


def test_the_cli_shows_progress_in_mib_on_a_terminal_only(
    tmp_path: Path, reader, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    from rich.console import Console

    from torchscalpel import console as terminal
    from torchscalpel.cli import memory as cli_memory
    from torchscalpel.memory.options import MemoryOptions

    path = _write(tmp_path, snapshot_data(n_segments=1000))
    reader(path, True)
    monkeypatch.setattr(native, "SLICE_BYTES", 1 << 14)
    updates: list[tuple[int, int]] = []
    real_show = terminal.TerminalProgress.show
    monkeypatch.setattr(
        terminal.TerminalProgress,
        "show",
        lambda self, **f: (updates.append((f["completed"], f["total"])), real_show(self, **f)),
    )
    for is_terminal in (True, False):
        out = io.StringIO()
        monkeypatch.setattr(
            terminal, "console", lambda out=out, t=is_terminal: Console(file=out, force_terminal=t, width=120)
        )
        updates.clear()
        assert cli_memory._explain_snapshot(MemoryOptions(snapshot=path)) == 0
        assert len(updates) > 4 and updates[-1] == (
            (2 * path.stat().st_size) >> 20,
            max((2 * path.stat().st_size) >> 20, 1),
        )
        assert ("MiB of snap.pickle" in out.getvalue()) == is_terminal
    assert "live blocks" in capsys.readouterr().out


def test_whose_frame_it_is_is_the_userframes_rule_in_both_readers(tmp_path: Path, reader) -> None:
    def block(*files: str) -> dict[str, Any]:
        return {
            "state": "active_allocated",
            "size": 64,
            "frames": [{"filename": f, "line": 5} for f in files],
        }

    torch_file = "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/linear.py"
    blocks = [
        block(
            "??", torch_file, "/home/u/lib/python/train.py"
        ),  # a project folder named lib/python is the user's
        block(torch_file, "/home/u/torch/train.py"),  # and so is one named torch
        block("/usr/lib/python3.10/threading.py", "/srv/job/run.py"),  # another machine's stdlib is not
        block("/opt/conda/lib/python3.10/site-packages/lightning/trainer.py"),  # only a library: its line
    ]
    path = _write(tmp_path, {"segments": [{"blocks": blocks}]})
    ours = reader(path, True)
    _same(ours, reader(path, False))
    assert [s["name"] for s in ours["sites"]] == [
        "/home/u/lib/python/train.py:5",
        "/home/u/torch/train.py:5",
        "/srv/job/run.py:5",
        "/opt/conda/lib/python3.10/site-packages/lightning/trainer.py:5",
    ]


def _recorded_training_snapshot() -> tuple[dict[str, Any], dict[str, int]]:
    """A snapshot whose tracebacks are this torch's real Python stacks, innermost first (as torch records them),
    taken at every op of building, one forward/backward/Adam step of a small model; and the bytes each phase
    really allocated (we know which phase we were in)."""
    import traceback

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Scale(torch.autograd.Function):  # a custom Function: its apply runs in forward, not backward
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    blocks: list[dict[str, Any]] = []
    truth = dict.fromkeys(S.PHASES, 0)
    phase = ["parameters"]

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            stack = traceback.extract_stack()[:-1][::-1]  # this frame dropped; innermost first
            for t in out if isinstance(out, tuple | list) else [out]:
                if isinstance(t, torch.Tensor) and func._schema.name not in (
                    "aten::detach",
                    "aten::t",
                    "aten::view",
                ):
                    size = t.untyped_storage().nbytes()
                    blocks.append(
                        {
                            "state": "active_allocated",
                            "size": size,
                            "frames": [
                                {"filename": fs.filename, "line": fs.lineno, "name": fs.name} for fs in stack
                            ],
                        }
                    )
                    truth[phase[0]] += size
            return out

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

        def forward(self, x):
            return self.b(Scale.apply(torch.relu(self.a(x))))

    with Record():
        net = Net()
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        phase[0] = "other"  # the user's own tensors: no torch frame says what they are for
        x = torch.ones(8, 16)
        phase[0] = "activations"
        out = net(x)
        phase[0] = "other"  # the loss is computed in the user's code, outside any module call
        loss = out.square().mean()
        phase[0] = "gradients"
        loss.backward()
        phase[0] = "optimizer_state"
        opt.step()
    return {"segments": [{"total_size": 1 << 20, "blocks": blocks}]}, truth


def test_phases_from_this_torchs_real_stacks(tmp_path: Path, reader) -> None:
    data, truth = _recorded_training_snapshot()
    path = _write(tmp_path, data)
    ours = reader(path, True)
    _same(ours, reader(path, False))
    assert all(truth[p] for p in S.PHASES)
    assert ours["phases"] == truth, (ours["phases"], truth)
    lines = snapshot_terminal.render({**ours, "path": "x"})
    assert any(line.startswith("allocated by phase") for line in lines)


def test_a_cuda_backward_allocation_with_native_frames_only_is_a_gradient(tmp_path: Path, reader) -> None:
    native_only = [
        {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"},
        {"filename": "??", "line": 0, "name": "torch::autograd::generated::MmBackward0::apply"},
        {"filename": "??", "line": 0, "name": "torch::autograd::Engine::thread_main"},
    ]
    forward = [
        {"filename": "??", "line": 0, "name": "torch::autograd::VariableType::mm"},
        {"filename": "/x/site-packages/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"},
        {"filename": "/home/u/train.py", "line": 9, "name": "<module>"},
    ]
    blocks = [
        {"state": "active_allocated", "size": 700, "frames": native_only},
        {"state": "active_allocated", "size": 300, "frames": forward},
    ]
    path = _write(tmp_path, {"segments": [{"total_size": 1000, "blocks": blocks}]})
    ours = reader(path, True)
    _same(ours, reader(path, False))
    assert ours["phases"]["gradients"] == 700 and ours["phases"]["activations"] == 300
    assert [s["name"] for s in ours["sites"]] == ["(no Python frame)", "/home/u/train.py:9"]
    assert any(
        "zero_grad(set_to_none=True)" in line for line in snapshot_terminal.render({**ours, "path": "x"})
    )


def test_a_traceback_shared_by_blocks_and_events_keeps_its_site_and_phase_once_cut(
    tmp_path: Path, reader
) -> None:
    tb = [
        {"filename": "/x/site-packages/torch/optim/adam.py", "line": 3, "name": "_init_group"},
        {"filename": "/home/u/train.py", "line": 40, "name": "<module>"},
    ]
    blocks = [{"state": "active_allocated", "size": 100 * (i + 1), "frames": tb} for i in range(3)]
    data = {
        "segments": [{"blocks": blocks[:2]}, {"blocks": blocks[2:]}],
        "device_traces": [
            [{"action": "alloc", "size": 100, "frames": tb}, {"action": "oom", "size": 5, "frames": tb}]
        ],
    }
    path = _write(tmp_path, data)
    ours = reader(path, True)
    _same(ours, reader(path, False))
    assert ours["phases"]["optimizer_state"] == 600
    assert ours["ooms"][0]["site"] == "/home/u/train.py:40"


def _memo_bomb(tmp_path: Path) -> Path:
    """0.4 MB naming one segment of 10^5 blocks 10^5 times (pickle's memo: two bytes a reference)."""
    block = {"state": "active_allocated", "size": 1, "requested_size": 1, "frames": []}
    segment = {"total_size": 1, "blocks": [block] * 100_000}
    return _write(tmp_path, {"segments": [segment] * 100_000, "device_traces": []}, name="bomb.pickle")


@pytest.mark.parametrize("use_native", [True, False])
def test_a_memo_bomb_is_refused_within_the_files_work_budget(
    tmp_path: Path, reader, use_native: bool
) -> None:
    """Issue 30 item 2: both readers walked 10^10 blocks (minutes, and the C one deaf to Ctrl-C)."""
    path = _memo_bomb(tmp_path)
    size = path.stat().st_size
    assert size < 420_000
    budget = native.work_budget(size)
    with pytest.raises(UsageError, match="it names its own parts over and over") as err:
        reader(path, use_native)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert f"{budget:,} blocks" in str(err.value)
    # the walk stopped at the budget: one segment of 10^5 blocks past it at most
    summary = S.SnapshotSummary(budget)
    with pytest.raises(S.TooMuchWork):
        for seg in S.load_snapshot(path)["segments"]:
            summary.segment(seg)
    assert budget < summary.work <= budget + 1 + 100_000


def test_the_native_reader_returns_to_python_between_slices_of_its_walk(tmp_path: Path, reader) -> None:
    """Ctrl-C reaches Python only between C calls: a small work slice makes many calls, each a chance."""
    path = _write(tmp_path, snapshot_data(n_segments=400))
    reader(path, True)  # compiles the library (or skips without a compiler)
    lib, why = native.load_library()
    assert lib is not None, why
    _, whole = native.summarize(lib, path, S.frame_code)
    _, sliced = native.summarize(lib, path, S.frame_code, work_slice=64)
    assert whole["calls"] == 2  # one call per pass for a file under SLICE_BYTES
    assert sliced["calls"] >= 2 + whole["work"] // (64 + 100), (sliced, whole)
    assert sliced["work"] == whole["work"]
    # what a file torch's pickler wrote walks: far below the budget
    assert whole["work"] * 4 < native.work_budget(path.stat().st_size) - native.WORK_BASE


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the native reader cannot be built")
def test_the_compiled_reader_is_checked_before_it_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30 item 8: a library from the cache folder was loaded (its code run) unchecked."""
    import hashlib
    import os
    import stat

    cache = tmp_path / "cache"
    monkeypatch.setenv("TORCHSCALPEL_CACHE_DIR", str(cache))
    monkeypatch.setenv("TORCHSCALPEL_NATIVE", "1")
    snap = _write(tmp_path, snapshot_data(n_segments=20))

    def fresh() -> dict[str, Any]:
        monkeypatch.setattr(native, "_loaded", None)
        return S.read_snapshot(snap)

    assert fresh()["reader"] == "native"
    folder = cache / "native"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    (lib,) = folder.glob("snapshot_scan-*.so")
    recorded = lib.with_name(lib.name + ".sha256")
    assert recorded.read_text().strip() == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert not lib.stat().st_mode & 0o022

    # a library that is not what was built is built again (and then loads), never loaded as it is
    swapped = (
        tmp_path / "swapped.so"
    )  # a new file put in its place (the loaded one stays mapped in this process)
    swapped.write_bytes(b"\x7fELF not the library that was built")
    os.replace(swapped, lib)
    r = fresh()
    assert r["reader"] == "native", r["reader_note"]
    assert recorded.read_text().strip() == hashlib.sha256(lib.read_bytes()).hexdigest()

    # a folder others may write is closed again
    os.chmod(folder, 0o777)
    assert fresh()["reader"] == "native"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700

    # a folder that belongs to someone else, or a link, is not used: the Python reader runs and says why
    real_uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real_uid + 1)
    r = fresh()
    assert r["reader"] == "python" and "belongs to another user" in r["reader_note"], r["reader_note"]
    monkeypatch.setattr(os, "getuid", lambda: real_uid)
    other = tmp_path / "other"
    other.mkdir()
    (other / "native").symlink_to(folder)
    monkeypatch.setenv("TORCHSCALPEL_CACHE_DIR", str(other))
    r = fresh()
    assert r["reader"] == "python" and "is not a plain folder" in r["reader_note"], r["reader_note"]


def test_ctrl_c_that_lands_in_the_frame_callback_is_not_dropped(tmp_path: Path, reader) -> None:
    """ctypes prints and drops an exception raised in a callback: a Ctrl-C there was lost and the read went on."""
    path = _write(tmp_path, snapshot_data(n_segments=50))
    reader(path, True)  # compiles the library (or skips without a compiler)
    lib, why = native.load_library()
    assert lib is not None, why
    asked = []

    def interrupted_at_first_frame(file: str, function: str) -> int:
        asked.append(file)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        native.summarize(lib, path, interrupted_at_first_frame, work_slice=64)
    assert len(asked) == 1  # no frame is asked after the interrupt


def test_a_snapshot_gets_an_offline_html_page_that_opens_with_its_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    from torchscalpel.cli.main import main

    monkeypatch.setenv("TORCHSCALPEL_NATIVE", "0")  # the pure-Python twin: no compiler needed here
    path = _write(tmp_path, snapshot_data(n_segments=40))
    page_path = tmp_path / "snap.html"
    assert main(["memory", "--html", str(page_path), str(path)]) == 0  # options before the target
    assert f"page: {page_path}" in capsys.readouterr().out
    page = page_path.read_text()
    assert re.findall(r'<section id="([^"]+)"', page)[0] == "verdict"
    verdict = page.split('<section id="verdict">', 1)[1].split("</section>", 1)[0]
    assert "Out of memory: asked for 1.00 GiB" in verdict
    assert "/home/u/model_" in page  # call sites of the live blocks
    assert "<script" not in page and not re.search(r"(src|href)=\"https?://", page)  # opens offline
    assert (
        'data-chart="snapshot-timeline"' in page
    )  # allocated over the trace (no segment events: not reserved)
    # --html with a script is a usage error in one sentence
    assert main(["memory", "--html", str(page_path), "--", "train.py"]) == 2
    assert "--html FILE is for a SNAPSHOT.pickle" in capsys.readouterr().err


def _libasan() -> str | None:
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    import subprocess

    path = subprocess.run([gcc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return path if path and Path(path).is_file() else None


def test_the_native_reader_under_address_sanitizer_on_300_corrupted_files(tmp_path: Path) -> None:
    """Issue 30: the C reader fuzzed under AddressSanitizer, bounded (300 inputs, seconds). The library is
    built with ``CC="gcc -fsanitize=address"`` into a fresh cache and loaded into a child that preloads
    ASan's runtime; any out-of-bounds read or write aborts that child."""
    import json
    import os
    import subprocess
    import sys

    libasan = _libasan()
    if libasan is None:
        pytest.skip("no gcc with AddressSanitizer's runtime here (CI installs gcc)")
    good = _write(tmp_path, snapshot_data(n_segments=60))
    cache = tmp_path / "asan-cache"
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(S.__file__).parents[2]),
        "TORCHSCALPEL_CACHE_DIR": str(cache),
        "TORCHSCALPEL_NATIVE": "1",
        "CC": "gcc -fsanitize=address -fno-omit-frame-pointer -g",
        "LD_PRELOAD": libasan,
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_PROBE, str(good), str(tmp_path / "bad.pickle")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AddressSanitizer" not in proc.stderr
    outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcomes["explained"] + outcomes["refused"] == 300
    # the library that ran was instrumented (so the run above could have caught a bad access)
    (built,) = cache.rglob("*.so")
    symbols = subprocess.run(["nm", "-D", str(built)], capture_output=True, text=True).stdout
    assert "__asan_report" in symbols


def _trace_with_segments(n: int) -> tuple[dict[str, Any], int, int]:
    """A trace of ``n`` allocations and frees inside segments mapped and released as it goes (as the caching
    allocator records them), and its true peaks of allocated and reserved bytes above the trace's start."""
    events: list[dict[str, Any]] = []
    live = reserved = peak_live = peak_reserved = 0
    held: list[int] = []
    for i in range(n):
        if i % 97 == 0:
            events.append({"action": "segment_alloc", "size": 2 << 20, "frames": []})
            reserved += 2 << 20
        size = 512 * (1 + (i * 7919) % 300)
        if i % 3 == 2 and held:
            gone = held.pop(0)
            events.append({"action": "free_requested", "size": gone, "frames": []})
            events.append({"action": "free_completed", "size": gone, "frames": []})
            live -= gone
        else:
            events.append({"action": "alloc", "size": size, "frames": []})
            held.append(size)
            live += size
        if i % 211 == 210:
            events.append({"action": "segment_free", "size": 2 << 20, "frames": []})
            reserved -= 2 << 20
        peak_live, peak_reserved = max(peak_live, live), max(peak_reserved, reserved)
    data = {"segments": [{"total_size": 1 << 20, "blocks": []}], "device_traces": [events]}
    return data, peak_live, peak_reserved


def test_the_timeline_of_allocated_and_reserved_peaks_where_the_trace_does_in_both_readers(
    tmp_path: Path, reader
) -> None:
    from torchscalpel.report.snapshot_page import render

    data, peak_live, peak_reserved = _trace_with_segments(5000)
    path = _write(tmp_path, data)
    ours = reader(path, True)
    _same(ours, reader(path, False))
    trace = ours["trace"]
    timeline = trace["timeline"]
    assert trace["peak_live"] == peak_live > 0
    assert max(timeline["allocated"]) == peak_live  # each point is the most live in its slice of events
    assert max(timeline["reserved"]) == peak_reserved > 0
    assert len(timeline["allocated"]) == len(timeline["reserved"]) <= S.TIMELINE_POINTS
    assert (
        timeline["stride"] * len(timeline["allocated"])
        >= trace["events"]
        > timeline["stride"] * (len(timeline["allocated"]) - 1)
    )
    page = render({**ours, "path": "x"})
    assert 'data-chart="snapshot-timeline"' in page and "not measured" not in page
    # the mixed trace of snapshot_data: no segment events, so reserved over time is not measured
    plain = _write(tmp_path, snapshot_data(n_segments=300), name="plain.pickle")
    ours = reader(plain, True)
    _same(ours, reader(plain, False))
    assert max(ours["trace"]["timeline"]["allocated"]) == ours["trace"]["peak_live"]
    assert ours["trace"]["timeline"]["reserved"] is None
    assert "Reserved over time: not measured" in render({**ours, "path": "x"})
