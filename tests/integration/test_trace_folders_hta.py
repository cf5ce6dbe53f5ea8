"""HolisticTraceAnalysis, in a venv of its own, loads a launch folder's traces folder as scalpel writes it (moved
from tests/unit/test_trace_folders.py, which checks the layout contract in this process)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from torchscalpel.trace.layout import TRACES_DIR, write_rank_traces
from trace_builders import make_launch

HTA_PYTHON = os.environ.get("SCALPEL_HTA_PYTHON", "/work/bench-venv/bin/python")
"""A Python with HolisticTraceAnalysis installed (benchmarks/trace_analysis.py says how to make one)."""


@pytest.mark.skipif(
    not Path(HTA_PYTHON).is_file(), reason=f"no HTA venv at {HTA_PYTHON} (set SCALPEL_HTA_PYTHON)"
)
def test_hta_loads_the_traces_folder_as_it_is(tmp_path: Path) -> None:
    out = make_launch(tmp_path)
    write_rank_traces(out)
    code = (
        "import logging, sys; logging.disable(logging.WARNING)\n"
        "from hta.trace_analysis import TraceAnalysis\n"
        "ta = TraceAnalysis(trace_dir=sys.argv[1])\n"
        "print(sorted(ta.t.get_ranks()), [len(ta.t.get_trace(r)) > 0 for r in sorted(ta.t.get_ranks())])\n"
    )
    done = subprocess.run(
        [HTA_PYTHON, "-c", code, str(out / TRACES_DIR)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[0, 1] [True, True]"
