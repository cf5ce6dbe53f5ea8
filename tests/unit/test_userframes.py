"""userframes: the one rule for "which file, which frame is the user's", and each place that asks it."""

from __future__ import annotations

import functools
import os
import runpy
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import torchscalpel
from torchscalpel.runtime.userframes import (
    ANY,
    LIBRARIES,
    Kind,
    file_kind,
    first_user,
    is_runner_file,
    is_user_file,
    user_frame,
)

TORCH_FILE = torch.__file__
OUR_FILE = os.path.join(os.path.dirname(torchscalpel.__file__), "runtime", "session.py")


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (TORCH_FILE, Kind.TORCH),
        (os.path.join(os.path.dirname(TORCH_FILE), "nn", "modules", "module.py"), Kind.TORCH),
        (OUR_FILE, Kind.SCALPEL),
        (runpy.__file__, Kind.STDLIB),
        (threading.__file__, Kind.STDLIB),
        ("<frozen runpy>", Kind.STDLIB),
        ("<string>", Kind.GENERATED),
        ("<eval_with_key>.3", Kind.GENERATED),
        ("<ipython-input-3-5f2c>", Kind.USER),
        ("<stdin>", Kind.USER),
        ("/home/u/.venv/lib/python3.11/site-packages/lightning/pytorch/loops/fit_loop.py", Kind.THIRD_PARTY),
        ("/usr/local/lib/python3.10/dist-packages/transformers/trainer.py", Kind.THIRD_PARTY),
        # Recorded on another machine: its stdlib, a torch built from source, torchscalpel installed elsewhere.
        ("/usr/lib/python3.10/threading.py", Kind.STDLIB),
        ("/opt/pytorch/torch/distributed/distributed_c10d.py", Kind.TORCH),
        ("/usr/local/lib/python3.10/dist-packages/torch/nn/parallel/distributed.py", Kind.TORCH),
        ("/cluster/src/torchscalpel/runtime/collectives.py", Kind.SCALPEL),
        ("C:\\Users\\u\\venv\\Lib\\site-packages\\accelerate\\accelerator.py", Kind.THIRD_PARTY),
    ],
)
def test_file_kinds(path: str, kind: Kind) -> None:
    assert file_kind(path) is kind


@pytest.mark.parametrize(
    "path",
    [
        "/home/u/proj/train.py",
        "/home/u/proj/lib/train.py",  # a folder named lib
        "/home/u/proj/lib/python/train.py",  # ... and lib/python (a monorepo layout), which is no stdlib
        "/home/u/torch/train.py",  # a project folder named torch
        "/home/u/torchscalpel/examples/ddp_fsdp_transformer.py",  # a clone named torchscalpel: its examples
        "/home/u/site/train.py",
        "/tmp/ipykernel_4242/1234567.py",  # a Jupyter cell
    ],
)
def test_the_users_files_wherever_they_live(path: str) -> None:
    assert is_user_file(path), file_kind(path)


def test_runner_files_are_ours_and_runpys_only() -> None:
    assert is_runner_file(OUR_FILE) and is_runner_file(runpy.__file__) and is_runner_file("<frozen runpy>")
    assert not is_runner_file(threading.__file__)
    assert not is_runner_file("/home/u/myrunpy.py")
    assert not is_runner_file(
        "/venv/lib/python3.11/site-packages/proj/train.py"
    )  # -m of an installed package


def _chain(*files: str) -> Callable[[Callable[[], Any]], Any]:
    """A call chain through functions whose code claims ``files`` (outermost first); the innermost calls back."""
    call: Callable[[Callable[[], Any]], Any] | None = None
    for depth, name in enumerate(reversed(files)):
        ns: dict[str, Any] = {"inner": call}
        body = "cb()" if call is None else "inner(cb)"
        exec(compile(f"def f{depth}(cb):\n    return {body}\n", name, "exec"), ns)
        call = ns[f"f{depth}"]
    assert call is not None
    return call


LIGHTNING = "/venv/lib/python3.11/site-packages/lightning/pytorch/loops/fit_loop.py"
USER_LIB = "/home/u/proj/lib/python/train.py"


def test_user_frame_walks_past_torch_ours_and_libraries() -> None:
    frame = _chain(USER_LIB, LIGHTNING, TORCH_FILE, OUR_FILE)(lambda: sys._getframe(1))
    assert frame.f_code.co_filename == OUR_FILE
    assert user_frame(frame).f_code.co_filename == USER_LIB


def test_user_frame_max_depth_and_fallbacks() -> None:
    frame = _chain(USER_LIB, LIGHTNING, TORCH_FILE)(lambda: sys._getframe(1))
    assert user_frame(frame, max_depth=2) is None
    assert user_frame(frame, max_depth=3).f_code.co_filename == USER_LIB
    assert user_frame(frame, max_depth=2, fallback=LIBRARIES).f_code.co_filename == LIGHTNING  # never torch's
    assert user_frame(frame, max_depth=2, fallback=ANY).f_code.co_filename == TORCH_FILE


def test_first_user_on_recorded_names() -> None:
    names = ["??", "/pytorch/c10/cuda/CUDACachingAllocator.cpp", TORCH_FILE, "/u/train.py"]
    assert first_user(names) == "??"  # a native frame's placeholder is not a library's file ...
    assert first_user(names, python_only=True) == "/u/train.py"  # ... so recordings that mix them say so
    rows = [{"filename": LIGHTNING, "line": 3}, {"filename": TORCH_FILE, "line": 9}]
    assert first_user(rows, lambda r: r["filename"]) is None
    assert first_user(rows[::-1], lambda r: r["filename"], fallback=LIBRARIES) == rows[0]
    assert first_user(rows[::-1], lambda r: r["filename"], fallback=ANY) == rows[1]


# -- each place that names the user's line -------------------------------------------------------------


def test_collective_sites_name_a_user_script_in_a_torch_folder() -> None:
    from torchscalpel.runtime.collectives import quoted_user_site
    from torchscalpel.runtime.userframes import user_site

    user_torch = "/home/u/torch/train.py"
    frame = _chain(user_torch, TORCH_FILE)(lambda: sys._getframe(1))
    assert user_site(frame).startswith(user_torch + ":")  # the old "/torch/" marker skipped it
    assert quoted_user_site(frame).startswith(b'"' + user_torch.encode() + b":")
    only_libs = _chain(LIGHTNING, TORCH_FILE)(lambda: sys._getframe(1))
    assert user_site(only_libs).startswith(
        user_site(sys._getframe()).rsplit(":", 1)[0]
    )  # this test is the user


def test_rank_facts_take_a_lib_python_folder_for_the_user() -> None:
    from torchscalpel.runtime.rankfacts import _from_user

    assert _from_user(_chain(USER_LIB)(lambda: sys._getframe(1)))  # the old "/lib/python" marker refused it
    assert not _from_user(_chain(LIGHTNING)(lambda: sys._getframe(1)))
    assert not _from_user(None)


def test_doctor_locations_point_past_a_framework_into_the_users_code() -> None:
    from torchscalpel.doctor.runtime_rules import user_location

    loc = _chain(USER_LIB, LIGHTNING)(user_location)
    assert (
        loc is not None and loc.file == USER_LIB
    )  # it used to name Lightning's file (only torch was skipped)
    assert _chain(*[LIGHTNING] * 5)(functools.partial(user_location, depth_limit=3)) is None


def test_triage_frames_keep_a_users_torch_folder() -> None:
    from torchscalpel.tune import triage

    trace = (
        f'File "{TORCH_FILE}", line 1, in _call_impl\n'
        'File "/home/u/torch/model.py", line 7, in forward\n'
        f'File "{threading.__file__}", line 3, in run\n'
    )
    assert triage.user_frames(trace) == [("/home/u/torch/model.py", 7, "forward")]


def test_flight_recorder_site_is_the_users_on_the_recording_machine() -> None:
    from torchscalpel.distributed.flightrec import dump_summary

    frames = [
        {"filename": "/opt/pytorch/torch/distributed/distributed_c10d.py", "line": 2501},
        {"filename": "/cluster/src/torchscalpel/runtime/collectives.py", "line": 400},
        {"filename": "/scratch/torchscalpel/examples/train.py", "line": 88},
    ]
    entry = {
        "profiling_name": "nccl:all_reduce",
        "process_group": ("0", "default"),
        "state": "scheduled",
        "frames": frames,
    }
    assert dump_summary({"entries": [entry]})["waiting_in"]["site"] == "train.py:88"


def test_hang_diagnosis_names_a_user_frame_or_the_innermost() -> None:
    from torchscalpel.distributed.hangdiag import Frame
    from torchscalpel.distributed.hangdiag import user_frame as hang_user_frame

    torch_frame = Frame(
        "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 1, "barrier"
    )
    user = Frame("<ipython-input-2-ab>", 4, "<module>")
    assert hang_user_frame([torch_frame, user]) == user  # every "<...>" name used to count as a library's
    assert hang_user_frame([torch_frame]) == torch_frame
    assert hang_user_frame([]) is None


# -- the one walk behind the construction, allocation and op-line sites ------------------------------------

PATCHING_FILE = os.path.join(os.path.dirname(torchscalpel.__file__), "runtime", "patching.py")
USER_OUTER = "/home/u/proj/train.py"


def _walked(*files: str, start: Callable[[Callable[[], Any]], Any] | None = None) -> Any:
    """The frame of the innermost function of a chain through ``files`` (outermost first; or of ``start``,
    a chain built by the caller), run on a bare thread from generated code: no frame of this test file
    is on the stack, so the chain alone decides whose line it is."""
    import _thread

    start = start or _chain(*files)
    ns: dict[str, Any] = {}
    exec(
        compile(
            "def entry(start, cb, out, done):\n    out.append(start(cb))\n    done.set()\n",
            "<string>",
            "exec",
        ),
        ns,
    )
    out: list[Any] = []
    done = threading.Event()
    _thread.start_new_thread(ns["entry"], (start, lambda: sys._getframe(1), out, done))
    assert done.wait(10)
    return out[0]


def _readers(frame: Any) -> tuple[str | None, dict[str, Any] | None, str]:
    """What each of the three readers makes of one walk: the op-line range, the construction site, the
    allocation site (the tracker's text, read from the same :class:`Site`)."""
    from torchscalpel.runtime.op_lines import range_name
    from torchscalpel.runtime.sites import caller_site
    from torchscalpel.runtime.userframes import call_site

    site = call_site(frame)
    return range_name(site), caller_site(None, frame), site.user or site.library or "(no Python caller)"


def test_one_walk_names_the_users_line_and_the_library_on_the_way() -> None:
    from torchscalpel.runtime.userframes import Site, call_site

    frame = _walked(USER_LIB, LIGHTNING, TORCH_FILE)
    assert call_site(frame) == Site(
        file=USER_LIB, line=2, library_file=LIGHTNING, library_line=2, caller=Kind.THIRD_PARTY
    )
    op_range, built, allocated = _readers(frame)
    assert op_range == f"scalpel.site:{USER_LIB}:2\x1f{LIGHTNING}:2"  # the package made the call: both lines
    assert built == {"file": os.path.realpath(USER_LIB), "line": 2, "library": "lightning"}
    assert allocated == f"{USER_LIB}:2"


def test_torchscalpels_own_call_and_a_wrapper_that_passes_the_users_call_through() -> None:
    ours = _walked(USER_LIB, LIGHTNING, TORCH_FILE, OUR_FILE)
    assert _readers(ours)[0] == "scalpel.site:torchscalpel"  # a call our own code made
    assert _readers(ours)[1] == {"file": os.path.realpath(USER_LIB), "line": 2, "library": "lightning"}
    # loss.backward() through the runtime's wrapper over torch: the user's line, with no library line
    # even though Lightning's frame is further out (what the op-line pass has always named)
    wrapped = _walked(USER_LIB, LIGHTNING, PATCHING_FILE, TORCH_FILE)
    assert _readers(wrapped)[0] == f"scalpel.site:{USER_LIB}:2"
    hook = _walked(USER_LIB, PATCHING_FILE, OUR_FILE, TORCH_FILE)  # the hook the wrapper calls
    assert _readers(hook)[0] == f"scalpel.site:{USER_LIB}:2"


def test_no_user_frame_names_the_library_or_nothing() -> None:
    from torchscalpel.runtime.userframes import NO_SITE, call_site

    assert _readers(_walked(LIGHTNING, TORCH_FILE)) == (None, None, f"{LIGHTNING}:2")
    assert _readers(_walked(TORCH_FILE, threading.__file__)) == (None, None, "(no Python caller)")
    assert call_site(None) == NO_SITE and NO_SITE.user is None and NO_SITE.library is None


def test_the_constructor_chain_of_the_object_being_built_is_passed_over() -> None:
    from torchscalpel.runtime.sites import caller_site
    from torchscalpel.runtime.userframes import call_site

    obj = object()
    ns: dict[str, Any] = {"obj": obj}
    exec(compile("def init(self, cb):\n    return cb()\n", "/home/u/proj/model.py", "exec"), ns)
    exec(compile("def build(cb):\n    return init(obj, cb)\n", USER_OUTER, "exec"), ns)
    frame = _walked(start=ns["build"])
    assert frame.f_code.co_filename == "/home/u/proj/model.py"  # a user subclass's __init__
    assert call_site(frame).file == "/home/u/proj/model.py"
    assert call_site(frame, skip_self=obj).file == USER_OUTER
    assert caller_site(obj, frame) == {"file": os.path.realpath(USER_OUTER), "line": 2, "library": None}
