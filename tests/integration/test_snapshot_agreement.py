"""The two snapshot readers give one answer on generated snapshots: refuse with the same sentence, or summarise
with the same figures (issue 41, items 1 and 5).

Generated snapshots share their parts as torch's do and as a memo bomb does (one traceback, block list,
segment or trace named from many places), hold values of every plain type where numbers belong (5000-digit
ints, NaN, strings) and are written with every pickle protocol. The work budget is made small here
(:func:`snapshot_native.work_budget` is the one both readers use) so that shared parts cross it on small files:
counting must agree exactly for the two readers to refuse the same files. The native reader is compiled, so
this lives with the other native tests; without a C compiler it skips, as they do.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st

from torchscalpel.errors import UsageError
from torchscalpel.memory import snapshot as S
from torchscalpel.memory import snapshot_native as native

HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))
pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the native reader cannot be built")

ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([10**5000, 2**63, 2**63 - 1, -(2**63), -(2**63) + 1, 2**62]),
    st.floats(),  # NaN and infinities included
    st.text(max_size=3),
    st.binary(max_size=2),
)
SIZES = st.one_of(st.integers(0, 1 << 20), st.integers(0, 1 << 20), ODD)
FILES = st.sampled_from(
    [
        "/home/u/train.py",
        "/home/u/model.py",
        "/home/u/\ud800odd.py",
        "/x/site-packages/torch/nn/modules/module.py",
        "/x/site-packages/torch/optim/adam.py",
        "/x/site-packages/torch/autograd/graph.py",
        "??",
        "",
    ]
)
NAMES = st.sampled_from(
    ["_call_impl", "backward", "_engine_run_backward", "_init_group", "forward", "__init__"]
)
FRAME = st.fixed_dictionaries(
    {
        "filename": st.one_of(FILES, FILES, ODD),
        "name": st.one_of(NAMES, ODD),
        "line": st.one_of(st.integers(0, 999), ODD),
    }
)
STATES = st.sampled_from(["active_allocated", "active_allocated", "inactive", "active_pending_free", 3])
ACTIONS = st.sampled_from(
    [
        "alloc",
        "alloc",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "oom",
        "x",
    ]
)


@st.composite
def snapshots(draw: st.DrawFn) -> dict[str, Any]:
    """A snapshot whose frames, tracebacks, block lists, segments and traces are shared by index, as a pickle's
    memo shares them (torch shares frames and tracebacks; a memo bomb shares everything)."""
    frames = draw(st.lists(FRAME, min_size=1, max_size=6))
    tracebacks: list[Any] = [
        [frames[i] for i in draw(st.lists(st.integers(0, len(frames) - 1), max_size=8))]
        for _ in range(draw(st.integers(1, 5)))
    ]
    tracebacks.append(draw(ODD))  # frames that are not a list

    def pick_tb() -> Any:
        return tracebacks[draw(st.integers(0, len(tracebacks) - 1))]

    def block() -> Any:
        if draw(st.integers(0, 20)) == 0:
            return draw(ODD)  # a block that is not a dict
        b: dict[str, Any] = {"state": draw(STATES), "size": draw(SIZES), "frames": pick_tb()}
        if draw(st.booleans()):
            b["requested_size"] = draw(SIZES)
        return b

    block_lists = [[block() for _ in range(draw(st.integers(0, 6)))] for _ in range(draw(st.integers(1, 4)))]
    segs = []
    for _ in range(draw(st.integers(1, 4))):
        seg = {"total_size": draw(SIZES), "blocks": block_lists[draw(st.integers(0, len(block_lists) - 1))]}
        segs.extend([seg] * draw(st.sampled_from([1, 1, 2, 30])))  # a segment named again and again
    if draw(st.booleans()):
        segs.append(draw(ODD))

    def event() -> Any:
        e: dict[str, Any] = {"action": draw(ACTIONS), "size": draw(SIZES)}
        if e["action"] == "oom" or draw(st.booleans()):
            e["frames"] = pick_tb()
            e["device_free"] = draw(SIZES)
        return e

    traces: list[Any] = []
    for _ in range(draw(st.integers(0, 3))):
        trace = [event() for _ in range(draw(st.integers(0, 8)))]
        trace = trace * draw(st.sampled_from([1, 1, 3]))  # one event named again
        traces.extend([trace] * draw(st.sampled_from([1, 1, 2, 40])))  # one trace named again (issue 41)
    if draw(st.booleans()):
        traces.append(draw(ODD))
    root: dict[str, Any] = {"segments": segs, "device_traces": traces}
    if draw(st.booleans()):
        root["allocator_settings"] = {"expandable_segments": draw(st.booleans())}
    if draw(st.integers(0, 10)) == 0:
        root["device_traces"] = draw(ODD)
    return root


@pytest.fixture(scope="module")
def readers(tmp_path_factory: pytest.TempPathFactory):
    """read(path, native) -> ("ok", JSON of the explanation) or ("refused", the sentence), with a small budget."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TORCHSCALPEL_CACHE_DIR", str(tmp_path_factory.mktemp("native-cache")))
    mp.setattr(native, "_loaded", None)
    # small enough that a few shared parts cross it (the real one: 4 per byte + 10^6)
    mp.setattr(native, "work_budget", lambda size: size // 8 + 300)

    def read(path: Path, use_native: bool) -> tuple[str, str]:
        mp.setenv("TORCHSCALPEL_NATIVE", "1" if use_native else "0")
        try:
            r = S.read_snapshot(path)
        except UsageError as exc:
            text = str(exc)
            assert "\n" not in text and exc.exit_code == 2
            # what was refused and why must agree; how the readers name a refused opcode may differ (the C reader
            # names its byte offset, the Python one the global it asked for)
            for kind in ("names its own parts", "sizes add up", "is not a plain PyTorch", "is cut short"):
                if kind in text:
                    return "refused", text if kind in ("names its own parts", "sizes add up") else kind
            return "refused", text
        assert r.pop("reader") == ("native" if use_native else "python"), r.get("reader_note")
        r.pop("reader_note")
        r.pop("scanner", None)
        return "ok", json.dumps(r, sort_keys=True)  # NaN == NaN, and 1 != 1.0 != True

    yield read
    mp.undo()


@settings(
    max_examples=120,
    deadline=None,  # the first example compiles the reader
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(data=snapshots(), protocol=st.sampled_from([0, 2, 4, 5]))
def test_both_readers_refuse_or_summarise_alike(
    readers, tmp_path_factory, data: dict[str, Any], protocol: int
) -> None:
    path = tmp_path_factory.mktemp("agree") / "snap.pickle"
    try:
        path.write_bytes(pickle.dumps(data, protocol=protocol))
    except ValueError:  # protocol 0 writes ints as text, and Python will not write 5000 digits
        reject()
    ours, theirs = readers(path, True), readers(path, False)
    if ours[0] == theirs[0] == "ok":  # name the first figure that differs
        a, b = json.loads(ours[1]), json.loads(theirs[1])
        assert not [k for k in a if a[k] != b[k]], {k: (a[k], b[k]) for k in a if a[k] != b[k]}
    assert ours == theirs


def test_a_memo_bomb_in_device_traces_is_refused_by_both(readers, tmp_path: Path) -> None:
    """Issue 41: 100 references to one list of events were summarised by the native reader (its first
    reference only) and refused by the Python one."""
    events = [{"action": "alloc", "size": 1, "frames": []}] * 400
    path = tmp_path / "bomb.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [events] * 100}, protocol=4))
    ours, theirs = readers(path, True), readers(path, False)
    assert ours == theirs and ours[0] == "refused", (ours, theirs)
    assert "it names its own parts over and over" in ours[1]


def test_sizes_beyond_64_bits_are_refused_by_both_in_one_sentence(readers, tmp_path: Path) -> None:
    """Each size fits int64, their sum does not: the C reader wrapped it to a negative total."""
    block = {"state": "active_allocated", "size": 2**62, "frames": []}
    path = tmp_path / "huge.pickle"
    path.write_bytes(pickle.dumps({"segments": [{"total_size": 1, "blocks": [block] * 4}]}, protocol=4))
    for use_native in (True, False):
        verdict, text = readers(path, use_native)
        assert verdict == "refused" and "its sizes add up to 2^63 bytes or more" in text, text


def test_a_5000_digit_number_is_not_a_size_in_either_reader(readers, tmp_path: Path) -> None:
    frames = [{"filename": "/home/u/train.py", "name": "f", "line": 10**5000}]
    data = {
        "segments": [
            {"total_size": 10**5000, "blocks": [{"state": "active_allocated", "size": 7, "frames": frames}]}
        ],
        "device_traces": [
            [{"action": "oom", "size": 10**5000, "device_free": float("nan"), "frames": frames}]
        ],
    }
    path = tmp_path / "digits.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    ours, theirs = readers(path, True), readers(path, False)
    assert ours == theirs and ours[0] == "ok"
    r = json.loads(ours[1])
    assert r["reserved"] == 0 and r["allocated"] == 7
    assert r["sites"] == [{"name": "/home/u/train.py:?", "bytes": 7}]
    assert r["ooms"][0]["bytes"] is None
